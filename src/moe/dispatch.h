// Local token dispatch of an MoE layer: the steps that move rows, with no communication.
//   routing:   (expert_idx, tokens_per_expert) -> row_of[t*K+k], the row of slot (t, k) in the
//              expert-major permuted buffer, and token_of_row[r]. Within an expert, rows keep
//              token order.
//   permute:   x_perm[r] = x[token_of_row[r]]
//   unpermute: out[t] = sum_k probs[t,k] * y_perm[row_of[t*K+k]]   (the combine step)
// A dropped slot (expert_idx = -1) gets row_of = -1: no row, no output, zero dprobs.
// Shapes: x, out (N, C); x_perm, y_perm (rows <= N*K, C); probs (N, K).
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace bagualu::moe {

// row_of: (N*K). token_of_row: (rows). expert_offsets: (E+1), prefix sums of tokens_per_expert.
void build_routing(int32_t* row_of, int32_t* token_of_row, int32_t* expert_offsets,
                   const int32_t* expert_idx, const int32_t* tokens_per_expert, int N, int E,
                   int K);

void permute_forward(float* x_perm, const float* x, const int32_t* token_of_row, int rows, int C);

// out: (N, C), overwritten.
void unpermute_forward(float* out, const float* y_perm, const float* probs, const int32_t* row_of,
                       int N, int K, int C);
// dy_perm: (N*K, C), overwritten: dy_perm[row_of[t,k]] = probs[t,k] * dout[t]; nullptr where
// the experts read those rows from dout as they go (slot_probs, moe/experts.h).
// dprobs: (N, K), overwritten: dprobs[t,k] = dot(dout[t], y_perm[row_of[t,k]]).
void unpermute_backward(float* dy_perm, float* dprobs, const float* dout, const float* y_perm,
                        const float* probs, const int32_t* row_of, int N, int K, int C);
// The same with y_perm kept as the bits of bf16 values (the same dots: the values widen exactly).
void unpermute_backward(float* dy_perm, float* dprobs, const float* dout, const uint16_t* y_perm,
                        const float* probs, const int32_t* row_of, int N, int K, int C);
// probs_of_row: (rows), overwritten: probs_of_row[row_of[t,k]] = probs[t,k], the scale of each
// row of dy_perm above (with token_of_row, its source row in dout).
void slot_probs(float* probs_of_row, const float* probs, const int32_t* row_of, int N, int K);
// dx: (N, C), accumulated: dx[t] += (sum_k dx_perm[row_of[t,k]]), the slots summed first (from
// zero, in slot order), then added, as the node-deduplicated exchange adds its per-node sums.
void permute_backward(float* dx, const float* dx_perm, const int32_t* row_of, int N, int K, int C);

// The row arithmetic of the combine and of the slots' sums is kernels::weighted_row_sum and
// add_row_sum (kernels/ops.h), shared with node_dispatcher.cpp so both paths round alike.

// The combine's gradient for one token's slots, queued and run kernels::scaled_rows_and_dots
// at a time: dy = w * d, *dprob = dot(d, y) summed in double (the same bits on every ISA). With
// every dy nullptr, the dots only. Y: float rows, or the bits of bf16 rows.
template <typename Y = float>
class SlotGradBatch {
   public:
    SlotGradBatch(const float* d, int C) : d_(d), C_(C) {}
    ~SlotGradBatch() { run(); }
    SlotGradBatch(const SlotGradBatch&)            = delete;
    SlotGradBatch& operator=(const SlotGradBatch&) = delete;

    void add(float* dy, const Y* y, float w, float* dprob) {
        dy_[n_]    = dy;
        y_[n_]     = y;
        w_[n_]     = w;
        dprob_[n_] = dprob;
        if (++n_ == kMax) run();
    }
    void run() {
        if (n_ == 0) return;
        kernels::scaled_rows_and_dots(dy_[0] ? dy_ : nullptr, dots_, w_, d_, y_, n_, C_);
        for (int i = 0; i < n_; ++i) *dprob_[i] = dots_[i];
        n_ = 0;
    }

   private:
    static constexpr int kMax = 16;
    const float* d_;
    int C_;
    int n_ = 0;
    float* dy_[kMax];
    const Y* y_[kMax];
    float w_[kMax];
    float* dprob_[kMax];
    float dots_[kMax];
};

}  // namespace bagualu::moe

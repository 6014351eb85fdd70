// One MoE feed-forward layer on one process:
//   forward:  gate logits -> top-k gate -> routing -> permute -> experts -> unpermute (combine)
//   backward: the same steps in reverse order.
// Owns the state saved between forward and backward, sized once for max_tokens.
// Distributed dispatch (all-to-all) slots in between permute and experts; see docs/model.md.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "moe/experts.h"

namespace bagualu::moe {

struct MoEWeights {
    const float*  gate_w = nullptr;  // (E, C), no bias
    ExpertWeights experts;
};
struct MoEGrads {
    float*      gate_w = nullptr;
    ExpertGrads experts;
};

struct MoEShape {
    int    C = 0, F = 0, E = 0, K = 0;
    double aux_coef = 0;
};

class MoELayer {
   public:
    MoELayer(const MoEShape& shape, int max_tokens);

    // out: (N, C), overwritten. inp: (N, C). Returns the aux loss (already times aux_coef).
    double forward(float* out, const float* inp, const MoEWeights& w, int N);
    // dinp: (N, C), overwritten. Parameter grads +=. daux: d loss / d aux.
    void backward(float* dinp, MoEGrads& dw, const float* dout, const float* inp,
                  const MoEWeights& w, double daux);

    // After forward: (E) tokens routed to each expert, counting every (token, slot) pair.
    const int32_t* tokens_per_expert() const { return tokens_per_expert_.data(); }
    // After forward: (N, K) expert ids and gate weights.
    const int32_t* expert_idx() const { return expert_idx_.data(); }
    const float*   probs() const { return probs_.data(); }

   private:
    MoEShape s_;
    int      max_tokens_;
    int      n_ = 0;  // tokens of the last forward
    // saved for backward
    Buffer<float>   logits_, softmax_full_, probs_;       // (N,E) (N,E) (N,K)
    Buffer<int32_t> expert_idx_, tokens_per_expert_;      // (N,K) (E)
    Buffer<int32_t> row_of_, token_of_row_, offsets_;     // (N*K) (N*K) (E+1)
    Buffer<float>   x_perm_, h_, g_, y_perm_;             // (N*K,C) (N*K,F) (N*K,F) (N*K,C)
    // backward scratch
    Buffer<float> dy_perm_, dh_, dx_perm_, dprobs_, dlogits_;
};

}  // namespace bagualu::moe

#include "moe/dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/parallel_rows.h"

namespace bagualu::moe {

namespace {

// The passes over a token's K slot rows read rows in K different experts' blocks: with many
// experts, more streams than the hardware prefetchers follow. So every line of a token's rows
// is fetched this many tokens ahead (64 experts of 96, top-8, 2,048 tokens, cold caches: the
// combine 1.01-1.09 -> 0.67-0.69 ms a layer, the input gradient's sum 1.02-1.20 -> 0.71-0.72 ms,
// the combine's gradient 0.96-1.18 -> 0.90-0.97 ms; 8 experts, top-2 unchanged: docs/results.md).
constexpr int64_t kRowsAhead = 4;

// Prefetches, for reading, every line of the slot rows of one token (row_of: its K entries, -1
// for none) in base (rows of C elements of T: floats, or the bits of bf16 values).
template <typename T>
inline void prefetch_slot_rows(const T* base, const int32_t* row_of, int K, int C) {
    for (int k = 0; k < K; ++k) {
        if (row_of[k] < 0) continue;
        const char* p = reinterpret_cast<const char*>(base + static_cast<int64_t>(row_of[k]) * C);
        for (size_t off = 0; off < sizeof(T) * static_cast<size_t>(C); off += 64)
            __builtin_prefetch(p + off);
    }
}

}  // namespace

void build_routing(int32_t* row_of, int32_t* token_of_row, int32_t* expert_offsets,
                   const int32_t* expert_idx, const int32_t* tokens_per_expert, int N, int E,
                   int K) {
    // expert_offsets[e + 1] first holds expert e's start and serves as its cursor: once all of
    // e's rows are placed it has moved on to e's end, which is the offset of e + 1.
    expert_offsets[0] = 0;
    if (E > 0) expert_offsets[1] = 0;
    for (int e = 1; e < E; ++e)
        expert_offsets[e + 1] = expert_offsets[e] + tokens_per_expert[e - 1];
    for (int t = 0; t < N; ++t) {
        for (int k = 0; k < K; ++k) {
            if (expert_idx[t * K + k] < 0) {  // a dropped slot has no row
                row_of[t * K + k] = -1;
                continue;
            }
            const int32_t r   = expert_offsets[expert_idx[t * K + k] + 1]++;
            row_of[t * K + k] = r;
            token_of_row[r]   = t;
        }
    }
}

void permute_forward(float* x_perm, const float* x, const int32_t* token_of_row, int rows, int C) {
    parallel_for(rows, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            std::memcpy(x_perm + r * C, x + static_cast<int64_t>(token_of_row[r]) * C,
                        sizeof(float) * static_cast<size_t>(C));
        }
    });
}

void unpermute_forward(float* out, const float* y_perm, const float* probs, const int32_t* row_of,
                       int N, int K, int C) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        // a token's slot rows and weights, then one kernel call (kernels::weighted_row_sum, SIMD),
        // in grow-only arrays of the calling thread
        thread_local std::vector<const float*> row_buf;
        thread_local std::vector<float> weight_buf;
        const float** rows = kernels::grow(row_buf, static_cast<size_t>(K));
        float* weights     = kernels::grow(weight_buf, static_cast<size_t>(K));
        for (int64_t t = begin; t < end; ++t) {
            if (t + kRowsAhead < end)
                prefetch_slot_rows(y_perm, row_of + (t + kRowsAhead) * K, K, C);
            int n = 0;
            for (int k = 0; k < K; ++k) {
                if (row_of[t * K + k] < 0) continue;
                rows[n]      = y_perm + static_cast<int64_t>(row_of[t * K + k]) * C;
                weights[n++] = probs[t * K + k];
            }
            kernels::weighted_row_sum(out + t * C, weights, rows, n, C);
        }
    });
}

namespace {

template <typename Y>
void unpermute_backward_rows(float* dy_perm, float* dprobs, const float* dout, const Y* y_perm,
                             const float* probs, const int32_t* row_of, int N, int K, int C) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            if (t + kRowsAhead < end) {
                prefetch_slot_rows(y_perm, row_of + (t + kRowsAhead) * K, K, C);
            }
            SlotGradBatch<Y> batch(dout + t * C, C);
            for (int k = 0; k < K; ++k) {
                const int64_t r = row_of[t * K + k];
                if (r < 0) {
                    dprobs[t * K + k] = 0.0f;
                    continue;
                }
                batch.add(dy_perm ? dy_perm + r * C : nullptr, y_perm + r * C, probs[t * K + k],
                          &dprobs[t * K + k]);
            }
        }
    });
}

}  // namespace

void unpermute_backward(float* dy_perm, float* dprobs, const float* dout, const float* y_perm,
                        const float* probs, const int32_t* row_of, int N, int K, int C) {
    unpermute_backward_rows(dy_perm, dprobs, dout, y_perm, probs, row_of, N, K, C);
}

void unpermute_backward(float* dy_perm, float* dprobs, const float* dout, const uint16_t* y_perm,
                        const float* probs, const int32_t* row_of, int N, int K, int C) {
    unpermute_backward_rows(dy_perm, dprobs, dout, y_perm, probs, row_of, N, K, C);
}

void slot_probs(float* probs_of_row, const float* probs, const int32_t* row_of, int N, int K) {
    for (int64_t s = 0; s < int64_t{N} * K; ++s) {
        if (row_of[s] >= 0) probs_of_row[row_of[s]] = probs[s];
    }
}

void permute_backward(float* dx, const float* dx_perm, const int32_t* row_of, int N, int K, int C) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        // the slots' sum from zero in slot order, then onto dx (kernels::add_row_sum, SIMD); the
        // token's rows in a grow-only array of the calling thread
        thread_local std::vector<const float*> row_buf;
        const float** rows = kernels::grow(row_buf, static_cast<size_t>(K));
        for (int64_t t = begin; t < end; ++t) {
            if (t + kRowsAhead < end)
                prefetch_slot_rows(dx_perm, row_of + (t + kRowsAhead) * K, K, C);
            const int32_t* ro = row_of + t * K;
            int n             = 0;
            for (int k = 0; k < K; ++k) {
                if (ro[k] >= 0) rows[n++] = dx_perm + int64_t{ro[k]} * C;
            }
            kernels::add_row_sum(dx + t * C, rows, n, C);
        }
    });
}

}  // namespace bagualu::moe

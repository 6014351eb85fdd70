// AVX2/FMA versions of some kernels of kernels/ops.h (sources in kernels/avx2/), called by
// ops.cpp when the CPU has AVX2+FMA, which also owns the threads and scratch: each function here
// runs a range of work items on the calling thread. Same shapes and =/+= conventions as ops.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace bagualu::kernels::avx2 {

// ---- causal attention ----
// Query rows per block. The head size must be a multiple of 8 (one ymm register of floats).
inline constexpr int kAttentionQueryBlock = 16;
inline bool attention_shape_supported(int hs) { return hs > 0 && hs % 8 == 0; }
// Forward items: (b, h, query block) as idx = (b NH + h) ceil(T / 16) + block, for idx in
// [begin, end). scratch: attention_forward_scratch(T, hs) floats.
size_t attention_forward_scratch(int T, int hs);
void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch);
// Backward items: (b, h) as idx = b NH + h, for idx in [begin, end). scratch:
// attention_backward_scratch(T, hs) floats.
size_t attention_backward_scratch(int T, int hs);
void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch);

// ---- softmax cross-entropy, rows [begin, end) ----
void crossentropy_forward_rows(float* losses, const float* logits, const int32_t* targets,
                               int64_t begin, int64_t end, int V);
// dlogits may alias logits.
void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V);

}  // namespace bagualu::kernels::avx2

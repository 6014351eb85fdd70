// AVX2/FMA versions of some kernels of kernels/ops.h. The item functions (sources in
// kernels/avx2/, built with -mavx2 -mfma) run a range of work items on the calling thread; the
// drivers at the end (kernels/ops_avx2.cpp, built for any x86-64) own the threads and scratch
// and are what the AVX2 and AVX-512 tables of kernels/dispatch.cpp point to. Call either only
// on a CPU with AVX2+FMA. Same shapes and =/+= conventions as ops.h.
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
                               int64_t begin, int64_t end, int V, float* lse);
// dlogits may alias logits.
void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V,
                                const float* lse);

// ---- layernorm; bitwise the generic kernels' results ----
// Forward rows [begin, end).
void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t begin, int64_t end,
                            int C);
// dinp (+=) of rows [begin, end).
void layernorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, int64_t begin, int64_t end,
                             int C);
// dweight, dbias (+=) of columns [c0, c1), summed over all N rows in order. scratch: 2 (c1 - c0)
// doubles.
void layernorm_backward_cols(float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C, int64_t c0,
                             int64_t c1, double* scratch);

// ---- row sums and the combine's gradient rows (kernels/avx2/rows.cpp); bitwise the generic
// kernels' results, ops.h signatures ----
void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w);
void col_sums_f64_bf16(double* s, const uint16_t* x, int64_t n, int64_t ld, int w);
void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C);
void scaled_rows_and_dots_bf16(float* const* dy, float* dots, const float* w, const float* d,
                               const uint16_t* const* y, int n, int C);
void rank_rows(int32_t* top, const float* x, int64_t n, int E, int R);
void weighted_row_sum(float* o, const float* w, const float* const* y, int n, int C);
void add_row_sum(float* o, const float* const* y, int n, int C);
void bias_add(float* o, const float* bias, size_t n);

// ---- exp of doubles through libmvec (kernels/avx2/exp64.cpp); ops.h exp_f64 ----
void exp_f64(double* y, const double* x, int64_t n);

// ---- GELU, elements [begin, end); bitwise the generic kernels' results ----
void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end);
// dinp may alias dout.
void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end);

// ---- bfloat16 conversions of n elements on the calling thread; bitwise the generic ones ----
void bf16_narrow_range(uint16_t* dst, const float* x, size_t n);
void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n);
void bf16_round_range(float* out, const float* in, size_t n);
void bf16_round_stream(float* out, const float* in, size_t n);
void bf16_widen_range(float* out, const uint16_t* in, size_t n);
void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n);
// zero_stream beside the streamed rounding (kernels/avx2/convert.cpp): ops.h zero_stream.
void zero_stream(float* x, size_t n);

// ---- AdamW, elements [begin, end); bitwise the generic kernel's results ----
// c1 = 1 - beta1^step and c2 = 1 - beta2^step, rounded to float as the generic kernel does.
void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale);
// The same with m and v as bf16 bits: widened on load, rounded to nearest even on store
// (core/dtype.h bf16_from_float's bits): bitwise the float kernel on the widened moments, m and
// v then rounded.
void adamw_update_range_bf16m(float* param, const float* grad, uint16_t* m, uint16_t* v,
                              int64_t begin, int64_t end, float lr, float beta1, float beta2,
                              float eps, float weight_decay, float c1, float c2, float grad_scale);

// ---- drivers: ops.h signatures, threaded on the compute pool ----
// Attention with a head size the items do not take (attention_shape_supported) runs
// generic::attention_forward / attention_backward.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);
// The same threading and scratch over another ISA's items (kernels/ops_avx512.cpp), which must
// take the head size.
using AttentionScratch       = size_t (*)(int T, int hs);
using AttentionForwardItems  = void (*)(float* out, float* lse, const float* qkv, int T, int C,
                                       int NH, int64_t begin, int64_t end, float* scratch);
using AttentionBackwardItems = void (*)(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int T, int C, int NH,
                                        int64_t begin, int64_t end, float* scratch);
void attention_forward_with(AttentionForwardItems items, AttentionScratch scratch_floats,
                            float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward_with(AttentionBackwardItems items, AttentionScratch scratch_floats,
                             float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int C, int NH);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace bagualu::kernels::avx2

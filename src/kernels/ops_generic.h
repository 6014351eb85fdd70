// Portable versions of the dispatched kernel families of kernels/ops.h (sources in ops.cpp):
// plain C++ loops the compiler vectorises for any x86-64, threaded on the compute pool. Every
// ISA's table in kernels/dispatch.cpp falls back to these where it has no version of its own.
// Same signatures, shapes and =/+= conventions as ops.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace bagualu::kernels::generic {

// GELU's constants, shared with the SIMD versions (which compute the same float operations in
// the same order, so their results are bitwise those of the generic kernels).
inline constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluA = 0.044715f;

void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t begin, int64_t end,
                            int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end);
void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end);
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);
void crossentropy_forward_rows(float* losses, const float* logits, const int32_t* targets,
                               int64_t begin, int64_t end, int V, float* lse);
void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V,
                                const float* lse);
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale = 1.0f);
void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale);
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
void zero_range(float* x, size_t n);
void exp_f64(double* y, const double* x, int64_t n);
// bfloat16 conversions of n elements on the calling thread (core/dtype.h's rounding).
void bf16_narrow_range(uint16_t* dst, const float* x, size_t n);
void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n);
void bf16_round_range(float* out, const float* in, size_t n);
void bf16_widen_range(float* out, const uint16_t* in, size_t n);
void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n);

}  // namespace bagualu::kernels::generic

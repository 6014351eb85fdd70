// AVX-512 versions of some kernels of kernels/ops.h, as kernels/ops_avx2.h: item functions
// (kernels/avx512/, built with the AVX-512 flags) that run a range on the calling thread, and
// drivers (kernels/ops_avx512.cpp, built for any x86-64) that own the threads and are what the
// AVX-512 table of kernels/dispatch.cpp points to. Call either only on a CPU with AVX-512
// F/BW/VL/DQ. Same shapes and =/+= conventions as ops.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace bagualu::kernels::avx512 {

// ---- causal attention, head size a multiple of 16; bitwise the AVX2 kernels' results ----
// Items as avx2::attention_forward_items / attention_backward_items (kernels/ops_avx2.h), with
// this file's scratch sizes.
inline bool attention_shape_supported(int hs) { return hs > 0 && hs % 16 == 0; }
size_t attention_forward_scratch(int T, int hs);
void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch);
size_t attention_backward_scratch(int T, int hs);
void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch);

// ---- causal attention on bf16 operands (kernels/avx512/attention_bf16.cpp) ----
// The products on bf16 operands, on AMX tiles (tiles) or with AVX512_BF16 dot products, the
// softmax in float with sums in double: not the float kernels' bits. One item per (batch,
// head). Call only where the product kind is usable: tiles after request_amx() succeeded,
// dots with AVX512_BF16; and with attention_bf16_shape_supported(hs).
inline bool attention_bf16_shape_supported(int hs) { return hs > 0 && hs % 32 == 0; }
size_t attention_bf16_forward_scratch(int T, int hs);
void attention_forward_items_bf16(bool tiles, float* out, float* lse, const float* qkv, int T,
                                  int C, int NH, int64_t begin, int64_t end, float* scratch);
size_t attention_bf16_backward_scratch(int T, int hs);
// dqkv16: null, or the gradient's bf16 bits (bitwise bf16_narrow_range of the floats), written
// there instead of into dqkv.
void attention_backward_items_bf16(bool tiles, float* dqkv, uint16_t* dqkv16, const float* dout,
                                   const float* qkv, const float* out, const float* lse, int T,
                                   int C, int NH, int64_t begin, int64_t end, float* scratch);
// The same items on Q, K, V (qkv16) and O (out16) kept as bf16: the forward writes out16 as
// bf16_narrow_range of the float rows, the backward reads out16 widened and writes dqkv16. With
// a scale 1 / sqrt(hs) that is a power of two (hs = 64, 256, ...) bitwise the float items on
// qkv rounded to bf16 and out rounded, narrowed; otherwise Q is rounded twice (kept, then
// scaled).
void attention_forward_items_bf16(bool tiles, uint16_t* out16, float* lse, const uint16_t* qkv16,
                                  int T, int C, int NH, int64_t begin, int64_t end, float* scratch);
void attention_backward_items_bf16(bool tiles, uint16_t* dqkv16, const float* dout,
                                   const uint16_t* qkv16, const uint16_t* out16, const float* lse,
                                   int T, int C, int NH, int64_t begin, int64_t end,
                                   float* scratch);

// ---- GELU, elements [begin, end); bitwise the generic kernels' results ----
void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end);
// dinp may alias dout.
void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end);

// ---- bfloat16 narrowing, rounding and widening of n elements on the calling thread; bitwise the
// generic ones ----
void bf16_narrow_range(uint16_t* dst, const float* x, size_t n);  // AVX512_BF16, else AVX2
void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n);  // the same
void bf16_round_range(float* out, const float* in, size_t n);
void bf16_round_stream(float* out, const float* in, size_t n);
void bf16_widen_range(float* out, const uint16_t* in, size_t n);
void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n);

// ---- AdamW, elements [begin, end); bitwise the generic kernel's results ----
// c1 = 1 - beta1^step and c2 = 1 - beta2^step, rounded to float as the generic kernel does.
void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale);
// The same with m and v as bf16 bits: widened on load, rounded to nearest even on store
// (core/dtype.h bf16_from_float's bits): bitwise the float kernel on the widened moments, m and
// v then rounded. AVX-512F only.
void adamw_update_range_bf16m(float* param, const float* grad, uint16_t* m, uint16_t* v,
                              int64_t begin, int64_t end, float lr, float beta1, float beta2,
                              float eps, float weight_decay, float c1, float c2, float grad_scale);

// ---- softmax cross-entropy, rows [begin, end); bitwise the AVX2 rows' results ----
void crossentropy_forward_rows(float* losses, const float* logits, const int32_t* targets,
                               int64_t begin, int64_t end, int V, float* lse);
// dlogits may alias logits.
void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V,
                                const float* lse);

// ---- drivers: ops.h signatures, threaded on the compute pool ----
// Attention with a head size the items do not take runs the AVX2 drivers (which fall back to
// the generic kernels for a head size that is not a multiple of 8).
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);

// The bf16 attention items threaded on the compute pool, one (batch, head) per item; the
// shape must be supported (an InternalError otherwise).
void attention_forward_bf16(bool tiles, float* out, float* lse, const float* qkv, int B, int T,
                            int C, int NH);
void attention_backward_bf16(bool tiles, float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int T, int C, int NH,
                             uint16_t* dqkv16 = nullptr);
// The same on Q, K, V and O kept as bf16 (the 16-bit items above).
void attention_forward_bf16(bool tiles, uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                            int T, int C, int NH);
void attention_backward_bf16(bool tiles, uint16_t* dqkv16, const float* dout, const uint16_t* qkv16,
                             const uint16_t* out16, const float* lse, int B, int T, int C, int NH);

}  // namespace bagualu::kernels::avx512

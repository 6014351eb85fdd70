// Kernels of mixed-precision training, float32 in and out like kernels/ops.h:
//   - rounding float arrays to the values of a half type (bf16 / fp16) in place: how the model
//     stores half-precision weights and activations in its float arrays, and how a half GEMM's
//     operands are formed (products of two bf16 or two fp16 values are exact in float32, so a
//     float32 GEMM over rounded operands is a half GEMM with float32 accumulation);
//   - linear layers whose bf16 products run through gemm_bf16;
//   - FP64 versions of the numerically sensitive kernels (precision.fp64_sensitive): the same
//     math, arguments and =/+= conventions as their ops.h namesakes, with every exp, log, tanh,
//     sqrt, division and sum in double. Threaded; results do not depend on the thread count.
// The gate's softmax, layernorm statistics, norms and the loss mean already run in double in the
// float32 kernels (kernels/ops.cpp, moe/gate.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"

namespace bagualu::kernels {

// x[i] = round_to(d, x[i]); nothing for Dtype::float32.
void round_inplace(float* x, size_t n, Dtype d);
// round_inplace and narrow_half (below) on the calling thread, for a pool job's own rows.
void round_inplace_serial(float* x, size_t n, Dtype d);
void narrow_half_serial(Dtype d, uint16_t* dst, const float* x, size_t n);
// o[i] += bias[i] (bias may be null), then round_inplace_serial(o, n, d) and, with half,
// narrow_half_serial(d, half, o, n): for bf16 one pass of the kernel table (bf16_bias_round),
// the same bits. A product's output row while it is in cache.
void bias_round_serial(float* o, const float* bias, size_t n, Dtype d, uint16_t* half = nullptr);
// out[i] = round_to(d, in[i]); out may alias in.
void round_copy(float* out, const float* in, size_t n, Dtype d);

// dst[i] = x[i] as 16 bits of the half type d (bfloat16 or float16): exact for values of d,
// which is how activations of d are kept in half the bytes. Threaded.
void narrow_half(Dtype d, uint16_t* dst, const float* x, size_t n);
// An activation kept from forward to backward, one of: float32 (f32), or, when it holds values
// of a half type, their 16 bits (half: exact, half the bytes); either gives the same bits.
struct KeptArray {
    float* f32     = nullptr;
    uint16_t* half = nullptr;
    // its rows from `row` on, rows of `width` elements
    KeptArray rows_from(size_t row, size_t width) const {
        return {f32 ? f32 + row * width : nullptr, half ? half + row * width : nullptr};
    }
};
// gelu_forward / gelu_backward of kernels/ops.h (their FP64 versions with fp64) on a kept
// activation x of n elements, widened from the 16 bits of d when kept so: bit for bit those
// kernels on the float32 values. Each thread runs its range a block at a time, the widening,
// the GELU and what follows it (narrowing, rounding) on a block in L1, in one parallel call.
// out may be x.f32 and alias nothing else; dinp may alias dout. Call from outside pool jobs.
// The output then stored as values of out_dtype (as round_inplace), a block at a time while it
// is in cache: the same bits.
void gelu_forward_kept(Dtype d, float* out, const KeptArray& x, size_t n, bool fp64 = false,
                       Dtype out_dtype = Dtype::float32);
// gelu_forward / gelu_backward (their FP64 versions with fp64) on the calling thread, for a pool
// job's own elements: each element bit for bit what those kernels give it (they are
// elementwise, so whatever range a thread takes). dinp may alias dout.
void gelu_forward_serial(float* out, const float* x, size_t n, bool fp64 = false);
void gelu_backward_serial(float* dinp, const float* x, const float* dout, size_t n,
                          bool fp64 = false);
// For a pool job's own elements (the experts run whole, moe/experts.h), where
// half_products_convert(d), each element bit for bit what the threaded forms below give it:
// gelu_forward_narrow (x kept as x_dtype's 16 bits or as floats), gelu_backward_dout's
// narrowed gradient written to out, and narrow_dout_rows' n rows written to out.
void gelu_forward_narrow_serial(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x, size_t n,
                                bool fp64 = false);
void gelu_backward_dout_serial(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x,
                               const float* dout, size_t n, bool fp64 = false);
void narrow_dout_rows_serial(Dtype d, uint16_t* out, const float* dout, const int32_t* rows,
                             const float* scale, size_t n, int C);
// gelu_forward_kept's output as the 16 bits of d, where half_products_convert(d): out[i] = the
// 16 bits of gelu(x[i]) rounded to d, formed a block at a time in a float buffer in L1, so a
// product's 16-bit operand costs no float array. out may start where x.f32 starts (then slice
// by slice, each read whole before its 16 bits are written, in three parallel calls a slice:
// pass a 16-bit copy of x instead where there is one).
void gelu_forward_narrow(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x, size_t n,
                         bool fp64 = false);
// gelu_backward_kept's dinp then stored as values of dinp_dtype (as round_inplace), a block at
// a time while it is in cache: the same bits.
void gelu_backward_kept(Dtype d, float* dinp, const KeptArray& x, const float* dout, size_t n,
                        bool fp64 = false, Dtype dinp_dtype = Dtype::float32);

// linear_forward / linear_backward of kernels/ops.h for operands (inp, weight, dout) that
// already hold values of dtype d: bf16 through gemm_bf16 on 16-bit copies, fp16 and float32
// through gemm_f32 on the floats themselves (exact products and float32 accumulation either
// way; those are bit for bit the ops.h kernels). Where gemm_bf16 only widens its operands
// (kernels::gemm_bf16_widens(): a CPU without 16-bit arithmetic) its results are those of
// gemm_f32 on the rounded floats, bit for bit, and the 16-bit copies are still the faster: half
// the bytes to narrow and to pack, and no operand rounded in place (default.toml 2.6%, bench-medium
// 3.0% faster on the AVX2 kernels, docs/results.md).
// Call from outside pool jobs, as the GEMMs.
// linear_forward_half's out can then be stored as values of out_dtype (round_inplace) and, with
// out_half, also as their 16 bits there (narrow_half): on 16-bit copies in the same pass as the
// bias, else after it; the same bits as those calls after the product.
void linear_forward_half(Dtype d, float* out, const float* inp, const float* weight,
                         const float* bias, int N, int IC, int OC, Dtype out_dtype = Dtype::float32,
                         uint16_t* out_half = nullptr);
void linear_backward_half(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int IC, int OC);
// The same with inp already as the 16 bits of d (inp16), where half_products_convert(d). Backward
// reads inp16 for dweight before it writes dinp, so dinp may be where inp16 lies.
void linear_forward_half16(Dtype d, float* out, const uint16_t* inp16, const float* weight,
                           const float* bias, int N, int IC, int OC,
                           Dtype out_dtype = Dtype::float32, uint16_t* out_half = nullptr);
void linear_backward_half16(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                            const uint16_t* inp16, const float* weight, int N, int IC, int OC);
// The same with inp kept only as its values of d in 16 bits (a layernorm's output that feeds
// nothing but the product: layernorm_forward_narrow), on any path: where the products do not
// convert, inp16 is widened to floats first (the rounded floats they would have read).
void linear_forward_kept16(Dtype d, float* out, const uint16_t* inp16, const float* weight,
                           const float* bias, int N, int IC, int OC,
                           Dtype out_dtype = Dtype::float32, uint16_t* out_half = nullptr);
void linear_backward_kept16(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                            const uint16_t* inp16, const float* weight, int N, int IC, int OC);
// A weight's n values rounded to d as 16 bits, in the products' own scratch for weights: valid
// until the next product above that narrows a float weight there. Where
// half_products_convert(d); for linear_forward_w16 over many blocks of rows (the LM head).
const uint16_t* narrow_weight(Dtype d, const float* weight, size_t n);
// linear_forward_half16 without bias on the weight's 16 bits (w16, narrow_weight's): one
// narrowing for many products over blocks of rows, each packing 16-bit values. The same bits.
void linear_forward_w16(Dtype d, float* out, const uint16_t* inp16, const uint16_t* w16, int N,
                        int IC, int OC, Dtype out_dtype = Dtype::float32);

// The tied LM head's backward from its logits (N, V): linear_backward_half (no bias, OC = V) with
// dout = crossentropy_backward (crossentropy_backward_f64 with fp64) of targets and dlosses, as an
// operand of d's products. Where half_products_convert(d), each row of that gradient is formed in
// a per-thread buffer and kept only as its 16 bits, written over the logits' storage; else it
// overwrites logits, each row rounded to d while in cache. Either way logits is overwritten. The
// same bits as crossentropy_backward in place, round_operand and linear_backward_half. Call from
// outside pool jobs. lse: as crossentropy_backward's (not read with fp64).
void crossentropy_linear_backward_half(Dtype d, float* dinp, float* dweight, float* logits,
                                       const int32_t* targets, const float* dlosses,
                                       const float* inp, const float* weight, int N, int IC, int V,
                                       bool fp64 = false, const float* lse = nullptr);

// The cross-entropy's gradient over logits (N, V) (crossentropy_backward, crossentropy_backward_f64
// with fp64, of targets and dlosses) kept only as its 16 bits: dy16 (N, V) row i is row i's
// gradient, formed in a per-thread buffer in cache and narrowed there, bitwise the operand
// crossentropy_linear_backward_half forms (the rounded floats its float path reads, as 16 bits).
// d is bf16; for linear_backward_dout16 (the LM head's output gradient formed in forward,
// model/gpt.h). logits is only read; dy16 may lie over logits' storage only outside its first
// N rows (crossentropy_linear_backward_half's slices). Call from outside pool jobs.
void crossentropy_backward_narrow(Dtype d, uint16_t* dy16, const float* logits,
                                  const int32_t* targets, const float* dlosses, int N, int V,
                                  bool fp64 = false, const float* lse = nullptr);

// grouped_gemm_f32 (kernels/grouped_gemm.h, op(A) = A, alpha 1, beta 0) for operands that
// already hold values of dtype d, chosen as above: bf16 through grouped_gemm_bf16 on 16-bit
// copies (A's rows [offsets[0], offsets[G]) of lda; each group's op(B), (tb == T ? N : K) rows
// of ldb), else grouped_gemm_f32 on the floats. The experts'
// forward-form products. With a_rows, A is gathered (kernels/grouped_gemm.h): then only the
// source rows the gather reads are converted. With epilogue, it runs on each finished rectangle
// of C (kernels/grouped_gemm.h GroupEpilogue). Call from outside pool jobs.
void grouped_gemm_half(Dtype d, Trans tb, int G, const int32_t* offsets, int N, int K,
                       const float* A, int lda, const float* B, int ldb, size_t stride_b, float* C,
                       int ldc, const int32_t* a_rows = nullptr, GroupEpilogue epilogue = {});

// The same with A already as the 16 bits of d (A16, its rows as A's above), where
// half_products_convert(d).
void grouped_gemm_half(Dtype d, Trans tb, int G, const int32_t* offsets, int N, int K,
                       const uint16_t* A16, int lda, const float* B, int ldb, size_t stride_b,
                       float* C, int ldc, GroupEpilogue epilogue = {});

// grouped_gemm_tn_f32 (alpha 1, beta 1: C_g += A_g^T B_g) for operands that already hold values
// of dtype d, chosen as above: bf16 through grouped_gemm_tn_bf16 on 16-bit copies of A's and
// B's rows [offsets[0], offsets[G]), else grouped_gemm_tn_f32 on the floats. The experts' weight
// gradients; either way a depth split at grouped_gemm_tn_depth_block() is exact. With b_rows, B is
// gathered, as A above; with epilogue, it runs on every finished rectangle of a C_g
// (kernels/grouped_gemm.h). Call from outside pool jobs.
void grouped_gemm_tn_half(Dtype d, int G, const int32_t* offsets, int M, int N, const float* A,
                          int lda, const float* B, int ldb, float* C, int ldc, size_t stride_c,
                          const int32_t* b_rows = nullptr, GroupEpilogue epilogue = {});

// The same with B already as the 16 bits of d (B16, its rows as B's above), where
// half_products_convert(d).
void grouped_gemm_tn_half(Dtype d, int G, const int32_t* offsets, int M, int N, const float* A,
                          int lda, const uint16_t* B16, int ldb, float* C, int ldc, size_t stride_c,
                          GroupEpilogue epilogue = {});

// The backward products of G linear layers of weights W_g (OUT, IN) on the groups' rows, for
// operands that already hold values of d (the experts' two layers):
//   dweight_g (OUT, IN) += dout_g^T inp_g   (grouped_gemm_tn_half, stride_dw between groups)
//   dinp (rows, IN)      = dout_g W_g       (grouped_gemm_half with Trans::N, stride_w)
// dout (rows, OUT), dinp and inp (rows, IN) dense, their rows [offsets[0], offsets[G]). Where
// half_products_convert(d), dout is narrowed once for both products (rather than once each);
// the same bits as the two calls. inp: float rows (gathered by inp_rows, as b_rows above);
// dweight is formed first, so dinp may lie where inp does.
// dweight_epilogue: the weight gradient's epilogue (grouped_gemm_tn_half), which may read dout's
// float rows (dinp is written after it); dinp_epilogue: the input gradient's, on each finished
// rectangle of dinp (kernels/grouped_gemm.h GroupEpilogue). Call from outside pool jobs.
void grouped_linear_backward_half(Dtype d, int G, const int32_t* offsets, int OUT, int IN,
                                  float* dinp, float* dweight, size_t stride_dw, const float* dout,
                                  const float* inp, const int32_t* inp_rows, const float* weight,
                                  size_t stride_w, GroupEpilogue dweight_epilogue = {},
                                  GroupEpilogue dinp_epilogue = {});

// Output gradients kept only as the products' 16-bit operand, where half_products_convert(d): in
// the products' own 16-bit scratch for it, valid until the next call that narrows a float output
// gradient there (the linear and grouped backward forms above taking a float dout,
// crossentropy_linear_backward_half, and these two); for the dout16 forms below. Call from outside
// pool jobs.
// dout16_scratch: that 16-bit scratch grown to n values, for a caller that fills it itself
// (pool jobs each their own rows, with narrow_half_serial or narrow_dout_rows_serial).
uint16_t* dout16_scratch(Dtype d, size_t n);
// narrow_operand_rows: the 16-bit copy the grouped forms make of a float row operand X (rows of
// ld, `width` values of each used) for G groups from offsets[0] = 0 on, in the products' scratch
// for inputs (valid until the next call that narrows an input: linear_forward_half and the
// grouped forms above taking floats): with rows_of, the source rows a gather reads, each once,
// indexed as X's; else X's rows [0, offsets[G]).
const uint16_t* narrow_operand_rows(Dtype d, const float* X, int ld, size_t width,
                                    const int32_t* offsets, int G,
                                    const int32_t* rows_of = nullptr);
// narrow_dout: dout's n values rounded to d (as the products' conversion rounds them).
const uint16_t* narrow_dout(Dtype d, const float* dout, size_t n);
// narrow_dout_rows: n rows of width C, row i = scale[i] * dout's row rows[i] (rows of C), each
// product rounded to float, then to d: bitwise narrow_dout on a copy of the scaled rows, without
// writing it (the experts' output gradient from the tokens', moe/experts.h).
const uint16_t* narrow_dout_rows(Dtype d, const float* dout, const int32_t* rows,
                                 const float* scale, size_t n, int C);
// gelu_backward_dout: gelu_backward_kept's dinp (dout * gelu'(x), x kept as values of x_dtype)
// rounded to d, formed a block at a time in L1 and narrowed there, so no float array of it is
// written and read again (the layer under a GELU: the dense MLP's first product, the experts').
const uint16_t* gelu_backward_dout(Dtype d, Dtype x_dtype, const KeptArray& x, const float* dout,
                                   size_t n, bool fp64 = false);

// linear_backward_half with dout as its 16 bits (dout16, N x OC) and inp as floats or as its 16
// bits (inp16; one of them where dweight), d bf16: dbias sums the 16-bit values. The same bits
// as linear_backward_half on the rounded floats; where the products take floats (not
// half_products_convert(d), bf16_float_operands) it runs on dout16 and inp16 widened.
void linear_backward_dout16(Dtype d, float* dinp, float* dweight, float* dbias,
                            const uint16_t* dout16, const float* inp, const uint16_t* inp16,
                            const float* weight, int N, int IC, int OC);
// grouped_linear_backward_half with dout as its 16 bits (dout16, its rows indexed as dout's), and
// inp as float rows (gathered by inp_rows) or as their 16 bits (inp16, indexed as inp's), where
// half_products_convert(d). The same bits as on the rounded floats; dweight is formed first, so
// dinp may lie where inp16 does. The weight gradient's epilogue may read dout16's rows (a bias
// gradient); dinp_epilogue runs on each finished rectangle of dinp.
void grouped_linear_backward_dout16(Dtype d, int G, const int32_t* offsets, int OUT, int IN,
                                    float* dinp, float* dweight, size_t stride_dw,
                                    const uint16_t* dout16, const float* inp,
                                    const int32_t* inp_rows, const uint16_t* inp16,
                                    const float* weight, size_t stride_w,
                                    GroupEpilogue dweight_epilogue = {},
                                    GroupEpilogue dinp_epilogue    = {});

// Whether the products above run on 16-bit copies for dtype d: their conversion rounds any float
// operand to d (round to nearest even, as round_to), so a caller need not round operands first.
bool half_products_convert(Dtype d);

// round_inplace(x, n, d) for an array whose values only feed the products above (as an operand,
// or as the dout whose column sums linear_backward_half's dbias takes): nothing where those
// products convert their operands themselves (half_products_convert(d)), since the conversion
// rounds the same way; the results are bitwise the same either way.
void round_operand(float* x, size_t n, Dtype d);

// Tests: where gemm_bf16 only widens its operands, run the bf16 products above on the rounded
// floats through gemm_f32 (on) instead of on 16-bit copies (off, the default), as fp16's always
// run: bitwise the same results (the widening kernels share the float kernels' blocking). No
// effect where gemm_bf16 has 16-bit arithmetic. Not thread-safe: set between products.
void bf16_float_operands(bool on);

// The attention core (attention_forward / attention_backward of kernels/ops.h, same shapes and
// conventions) of a class whose products are in dtype d. In bf16 where half_attention(d, hs)
// names a kind: Q, K, V, dO and the probabilities and their gradient as operands rounded to
// bf16, sums in float, the softmax in float with its sums in double
// (kernels/avx512/attention_bf16.cpp), on AMX tiles or with AVX512_BF16 dot products.
// Otherwise the float kernels of ops.h on the floats.
// half_attention: d is bf16, hs a multiple of 32, and the GEMM path (BGL_GEMM; auto: the best
// of ours) runs its bf16 products on the same unit: amx -> tiles, avx512 on a CPU with
// AVX512_BF16 and no AMX (where vdpbf16ps outruns float FMAs) -> dots; none elsewhere (fp16,
// float32, avx2, generic, onednn, openblas, ref, avx512 on an AMX CPU).
enum class HalfAttention { none, tiles, dots };
HalfAttention half_attention(Dtype d, int hs);
const char* half_attention_name(HalfAttention h);  // "none", "amx tiles", "avx512_bf16 dots"
void attention_forward_half(Dtype d, float* out, float* lse, const float* qkv, int B, int T, int C,
                            int NH);
void attention_backward_half(Dtype d, float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int T, int C, int NH);
// attention_backward_half's dqkv (B T x 3C) as the products' 16-bit output gradient (as
// narrow_dout: valid until the next narrowing there), where half_products_convert(d): where the
// core runs in bf16 (half_attention) its rows are narrowed as they are formed and the float
// dqkv is not written; else dqkv takes the floats, narrowed after. With fp64, the FP64 core
// (attention_backward_f64) into dqkv, narrowed after. Call from outside pool jobs.
const uint16_t* attention_backward_dout(Dtype d, float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C,
                                        int NH, bool fp64 = false);

// The attention core on Q, K, V (qkv16, B T x 3C) and its output O (out16, B T x C) kept only as
// their 16 bits of d: where attention_kept16(d, hs, false) and the bf16 core runs
// (half_attention), the core reads and writes them directly, bitwise attention_forward_half on
// qkv rounded to d with its out then rounded and narrowed, and attention_backward_dout on those
// rounded floats; elsewhere (no bf16 core on the path, or the GEMM path changed since the arrays
// were chosen) the float kernels run on their widened values (in one block's scratch of 4 N C
// floats). attention_backward_dout16 returns the 16-bit dqkv where half_products_convert(d) (in
// the narrow_dout scratch), else nullptr with the floats in dqkv. Call from outside pool jobs.
// attention_kept16: bf16, not fp64, and either the bf16 core runs and 1 / sqrt(hs) is a power of
// two (hs = 64, 256, ...: the core scales Q before rounding it, and scaling the kept Q by a power
// of two rounds nothing again), or no bf16 core runs, where the float core takes Q, K, V rounded
// to bf16 (attention_rounds_qkv): either way keeping them changes no bit.
bool attention_kept16(Dtype d, int hs, bool fp64);
// In bf16 (not fp64) without the bf16 core (half_attention none), the float core's Q, K, V are
// the qkv product's outputs rounded to bf16, as the bf16 core rounds its operands: the block
// rounds its float qkv where it does not keep it in 16 bits.
bool attention_rounds_qkv(Dtype d, int hs, bool fp64);
void attention_forward_half16(Dtype d, uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                              int T, int C, int NH);
const uint16_t* attention_backward_dout16(Dtype d, float* dqkv, const float* dout,
                                          const uint16_t* qkv16, const uint16_t* out16,
                                          const float* lse, int B, int T, int C, int NH);

// The router's linear layers in FP64 (precision.router = "fp64"): every product and sum in
// double, each result rounded to float once; the same =/+= conventions as linear_forward /
// linear_backward. Each output element is one thread's sum in a fixed order, so results do not
// depend on the thread count. A direct loop, not a GEMM: meant for the (N, C) x (C, E) gate.
void linear_forward_f64(float* out, const float* inp, const float* weight, const float* bias, int N,
                        int IC, int OC);
void linear_backward_f64(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, int N, int IC, int OC);

void layernorm_forward_f64(float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int N, int C);
// layernorm_forward (layernorm_forward_f64 with fp64) with the output kept only as its values
// of the half dtype d, in 16 bits (out16, N x C): bitwise narrow_half of the float output, which
// is formed a block of rows at a time in a per-thread buffer and never stored.
void layernorm_forward_narrow(Dtype d, uint16_t* out16, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C,
                              bool fp64 = false);
void layernorm_backward_f64(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, const float* mean,
                            const float* rstd, int N, int C);
void gelu_forward_f64(float* out, const float* inp, size_t n);
void gelu_backward_f64(float* dinp, const float* inp, const float* dout, size_t n);
void attention_forward_f64(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward_f64(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int B, int T, int C, int NH);
// lse: as crossentropy_forward's, but never written here (the FP64 backward computes its own).
void crossentropy_forward_f64(float* losses, const float* logits, const int32_t* targets, int N,
                              int V, float* lse = nullptr);
void crossentropy_backward_f64(float* dlogits, const float* logits, const int32_t* targets,
                               const float* dlosses, int N, int V);
// grad_scale as kernels/ops.h adamw_update's: g = double(grad * grad_scale), the float product.
void adamw_update_f64(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale = 1.0f);

// AdamW on a float32 master copy (adamw_update, or adamw_update_f64 with fp64), then
// param = master rounded to d, a slice at a time while it is in cache: bitwise those two calls
// and round_copy(param, master, n, d), without the second pass over the master.
void adamw_update_rounded(Dtype d, bool fp64, float* param, float* master, const float* grad,
                          float* m, float* v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int step, float grad_scale = 1.0f);

// AdamW with the moments m and v kept as bf16 bits (precision.moments = "bf16"), a slice at a
// time in cache: m and v widened to float, the float update (adamw_update's kernel, or
// adamw_update_f64's with fp64), m and v narrowed back rounding to nearest even. With master
// the update is on the FP32 master and param = master rounded to d (adamw_update_rounded's);
// without, on param in place. Bitwise those calls on the widened moments, m and v then rounded
// to bf16.
void adamw_update_bf16_moments(Dtype d, bool fp64, float* param, float* master, const float* grad,
                               uint16_t* m, uint16_t* v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int step,
                               float grad_scale = 1.0f);

}  // namespace bagualu::kernels

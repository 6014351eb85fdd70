// Rounding, half-precision linear layers and the FP64 sensitive kernels of kernels/mixed.h.
// Plain loops in the order the math is written (as kernels/ref/ops_ref.h), threaded with
// parallel_for over rows, (batch, head) pairs or column blocks, each reduction in a fixed order.
#include "kernels/mixed.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/grouped_gemm.h"
#include "kernels/ops.h"
#include "kernels/ops_avx512.h"
#include "kernels/parallel_rows.h"

namespace bagualu::kernels {

namespace {

const double kGeluK     = std::sqrt(2.0 / std::numbers::pi);
constexpr double kGeluA = 0.044715;

void round_range(float* out, const float* in, size_t n, Dtype d) {
    if (d == Dtype::bfloat16) {
        dispatch().bf16_round(out, in, n);
    } else {
        for (size_t i = 0; i < n; ++i) out[i] = fp16_to_float(fp16_from_float(in[i]));
    }
}

}  // namespace

void round_copy(float* out, const float* in, size_t n, Dtype d) {
    if (d == Dtype::float32) {
        if (out != in) std::copy(in, in + n, out);
        return;
    }
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        round_range(out + begin, in + begin, size_t(end - begin), d);
    });
}

void round_inplace(float* x, size_t n, Dtype d) { round_copy(x, x, n, d); }

void round_inplace_serial(float* x, size_t n, Dtype d) {
    if (d != Dtype::float32) round_range(x, x, n, d);
}

void narrow_half_serial(Dtype d, uint16_t* dst, const float* x, size_t n) {
    BGL_CHECK(d != Dtype::float32, "narrow_half: float32 is not a half type");
    if (d == Dtype::bfloat16) {
        dispatch().bf16_narrow(dst, x, n);
    } else {
        to_half(d, x, dst, n);
    }
}

void bias_round_serial(float* o, const float* bias, size_t n, Dtype d, uint16_t* half) {
    BGL_CHECK(!half || d != Dtype::float32, "bias_round_serial: 16 bits of a float32 output");
    if (d == Dtype::bfloat16) {
        dispatch().bf16_bias_round(o, bias, half, n);
        return;
    }
    if (bias) dispatch().bias_add(o, bias, n);
    round_inplace_serial(o, n, d);
    if (half) narrow_half_serial(d, half, o, n);
}

void narrow_half(Dtype d, uint16_t* dst, const float* x, size_t n) {
    BGL_CHECK(d != Dtype::float32, "narrow_half: float32 is not a half type");
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        narrow_half_serial(d, dst + begin, x + begin, size_t(end - begin));
    });
}

namespace {

// The GELU's FP64 versions on elements [begin, end) (gelu_forward_f64 / gelu_backward_f64 thread
// them).
void gelu_forward_f64_range(float* out, const float* inp, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
        const double x = inp[i];
        out[i]         = float(0.5 * x * (1.0 + std::tanh(kGeluK * (x + kGeluA * x * x * x))));
    }
}

void gelu_backward_f64_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                             int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
        const double x     = inp[i];
        const double th    = std::tanh(kGeluK * (x + kGeluA * x * x * x));
        const double du_dx = kGeluK * (1.0 + 3.0 * kGeluA * x * x);
        const double grad  = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du_dx;
        dinp[i]            = float(grad * double(dout[i]));
    }
}

using GeluForwardRange  = void (*)(float*, const float*, int64_t, int64_t);
using GeluBackwardRange = void (*)(float*, const float*, const float*, int64_t, int64_t);
GeluForwardRange gelu_forward_range(bool fp64) {
    return fp64 ? gelu_forward_f64_range : dispatch().gelu_forward;
}
GeluBackwardRange gelu_backward_range(bool fp64) {
    return fp64 ? gelu_backward_f64_range : dispatch().gelu_backward;
}

// crossentropy_backward_f64's rows (defined with the FP64 kernels below), and the cross-entropy
// gradient's row kernel of either precision.
void crossentropy_backward_f64_rows(float* dlogits, const float* logits, const int32_t* targets,
                                    const float* dlosses, int64_t begin, int64_t end, int V,
                                    const float* lse);
using CrossentropyBackwardRows = void (*)(float*, const float*, const int32_t*, const float*,
                                          int64_t, int64_t, int, const float*);
CrossentropyBackwardRows crossentropy_backward_rows(bool fp64) {
    return fp64 ? crossentropy_backward_f64_rows : dispatch().crossentropy_backward;
}

void widen_serial(Dtype d, float* out, const uint16_t* in, size_t n) {
    if (d == Dtype::bfloat16) {
        dispatch().bf16_widen(out, in, n);
    } else {
        from_half(d, in, out, n);
    }
}

// f(o, len) over [0, n) in blocks of at most kFuseBlock elements, each thread the blocks of its
// own range: a block's widening, GELU and narrowing or rounding follow one another while its
// floats are in L1, in one pass over the arrays and one parallel call. Elementwise, so any
// split gives the whole call's bits.
constexpr int64_t kFuseBlock = 2048;
template <typename F>
void in_blocks(size_t n, F&& f) {
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; o += kFuseBlock)
            f(size_t(o), size_t(std::min(kFuseBlock, end - o)));
    });
}

// gelu_forward_narrow's block [o, o + len), len <= kFuseBlock: widened, GELU and narrowed in L1.
void gelu_narrow_block(GeluForwardRange gelu, Dtype d, uint16_t* out, Dtype x_dtype,
                       const KeptArray& x, size_t o, size_t len) {
    alignas(64) float w[kFuseBlock];
    if (x.half) {
        widen_serial(x_dtype, w, x.half + o, len);
        gelu(w, w, 0, int64_t(len));
    } else {
        gelu(w, x.f32 + o, 0, int64_t(len));
    }
    narrow_half_serial(d, out + o, w, len);
}

// gelu_backward_dout's block [o, o + len), len <= kFuseBlock.
void gelu_dout_block(GeluBackwardRange gelu, Dtype d, uint16_t* out, Dtype x_dtype,
                     const KeptArray& x, const float* dout, size_t o, size_t len) {
    alignas(64) float w[kFuseBlock], g[kFuseBlock];
    const float* xo = x.f32 ? x.f32 + o : w;
    if (!x.f32) widen_serial(x_dtype, w, x.half + o, len);
    gelu(g, xo, dout + o, 0, int64_t(len));
    narrow_half_serial(d, out + o, g, len);
}

// f(o, len) for the blocks of [0, n) in turn, on the calling thread.
template <typename F>
void serial_blocks(size_t n, F&& f) {
    for (size_t o = 0; o < n; o += size_t(kFuseBlock)) f(o, std::min(size_t(kFuseBlock), n - o));
}

// Whether n 16-bit values at out overlap n floats at x.
bool overlaps(const uint16_t* out, const float* x, size_t n) {
    const auto o = reinterpret_cast<uintptr_t>(out), f = reinterpret_cast<uintptr_t>(x);
    return o < f + n * sizeof(float) && f < o + n * sizeof(uint16_t);
}

}  // namespace

void gelu_forward_kept(Dtype d, float* out, const KeptArray& x, size_t n, bool fp64,
                       Dtype out_dtype) {
    if (!x.half && out_dtype == Dtype::float32) {
        (fp64 ? gelu_forward_f64 : gelu_forward)(out, x.f32, n);
        return;
    }
    const GeluForwardRange gelu = gelu_forward_range(fp64);
    in_blocks(n, [&](size_t o, size_t len) {
        if (!x.half) {
            gelu(out + o, x.f32 + o, 0, int64_t(len));  // elementwise: out may be x.f32
        } else {
            widen_serial(d, out + o, x.half + o, len);
            gelu(out + o, out + o, 0, int64_t(len));
        }
        if (out_dtype != Dtype::float32) round_range(out + o, out + o, len, out_dtype);
    });
}

void gelu_forward_serial(float* out, const float* x, size_t n, bool fp64) {
    gelu_forward_range(fp64)(out, x, 0, int64_t(n));
}

void gelu_backward_serial(float* dinp, const float* x, const float* dout, size_t n, bool fp64) {
    gelu_backward_range(fp64)(dinp, x, dout, 0, int64_t(n));
}

void gelu_forward_narrow(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x, size_t n,
                         bool fp64) {
    BGL_CHECK(d != Dtype::float32, "gelu_forward_narrow: float32 is not a half type");
    if (x.f32 && overlaps(out, x.f32, n)) {
        // the 16 bits overwrite floats other threads may still read: slice by slice, each read
        // whole into a buffer before any of its 16 bits are written
        const auto gelu         = fp64 ? gelu_forward_f64 : gelu_forward;
        constexpr size_t kSlice = size_t{1} << 17;
        thread_local std::vector<float> buf;
        float* w = grow(buf, std::min(n, kSlice));
        for (size_t o = 0; o < n; o += kSlice) {
            const size_t len = std::min(kSlice, n - o);
            gelu(w, x.f32 + o, len);
            narrow_half(d, out + o, w, len);
        }
        return;
    }
    const GeluForwardRange gelu = gelu_forward_range(fp64);
    in_blocks(n,
              [&](size_t o, size_t len) { gelu_narrow_block(gelu, d, out, x_dtype, x, o, len); });
}

void gelu_forward_narrow_serial(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x, size_t n,
                                bool fp64) {
    const GeluForwardRange gelu = gelu_forward_range(fp64);
    serial_blocks(
        n, [&](size_t o, size_t len) { gelu_narrow_block(gelu, d, out, x_dtype, x, o, len); });
}

void gelu_backward_dout_serial(Dtype d, uint16_t* out, Dtype x_dtype, const KeptArray& x,
                               const float* dout, size_t n, bool fp64) {
    const GeluBackwardRange gelu = gelu_backward_range(fp64);
    serial_blocks(
        n, [&](size_t o, size_t len) { gelu_dout_block(gelu, d, out, x_dtype, x, dout, o, len); });
}

void gelu_backward_kept(Dtype d, float* dinp, const KeptArray& x, const float* dout, size_t n,
                        bool fp64, Dtype dinp_dtype) {
    const GeluBackwardRange gelu = gelu_backward_range(fp64);
    in_blocks(n, [&](size_t o, size_t len) {
        alignas(64) float w[kFuseBlock];
        const float* xo = x.f32 ? x.f32 + o : w;
        if (!x.f32) widen_serial(d, w, x.half + o, len);
        gelu(dinp + o, xo, dout + o, 0, int64_t(len));  // dinp may alias dout: elementwise
        if (dinp_dtype != Dtype::float32) round_range(dinp + o, dinp + o, len, dinp_dtype);
    });
}

// ---- linear layers with half-precision operands ----

namespace {

// 16-bit copies of the GEMM operands, grown once (called from the main thread only).
// 64-byte aligned: the AMX kernel reads their rows where they lie (KernelSpec::micro_strided)
AlignedVector<bf16> g_inp16, g_w16, g_dout16;
bool g_float_operands = false;  // bf16_float_operands

// Whether a product of dtype d runs on 16-bit copies: bf16, unless a test asks for the rounded
// floats where gemm_bf16 only widens.
bool on_16bit(Dtype d) { return d == Dtype::bfloat16 && !(g_float_operands && gemm_bf16_widens()); }

const bf16* to_bf16(AlignedVector<bf16>& buf, const float* x, size_t n) {
    bf16* out = grow(buf, n);
    narrow_half(Dtype::bfloat16, out, x, n);
    return out;
}

// Elements from the first of `rows` rows of stride ld to the `width`-th of the last.
size_t span(size_t rows, int ld, size_t width) {
    return rows == 0 ? 0 : (rows - 1) * size_t(ld) + width;
}

// Rows of the source a gather (rows [0, n)) reads: one past the largest index.
size_t gathered_extent(const int32_t* rows, size_t n) {
    int32_t top = -1;
    for (size_t i = 0; i < n; ++i) top = std::max(top, rows[i]);
    return size_t(top + 1);
}

// The 16-bit copy (in buf) of the rows grouped products read from X (rows of ld, `width`
// elements of each used), offsets as theirs: with a gather (rows_of, indexed like the stacked
// rows) the source rows it reads, converted once each (fewer than the gathered rows when a row is
// read by several groups) up to the last one, and r = the gather from offsets[0] on, to apply to
// the copy; else X's rows [offsets[0], offsets[G]) (the last one to its width-th element), r null.
struct Rows16 {
    const bf16* x;
    const int32_t* r;
};
Rows16 group_rows16(AlignedVector<bf16>& buf, const float* X, int ld, size_t width,
                    const int32_t* offsets, int G, const int32_t* rows_of = nullptr) {
    const size_t rows = size_t(offsets[G] - offsets[0]);
    const int32_t* r  = rows_of ? rows_of + offsets[0] : nullptr;
    const float* src  = r ? X : X + size_t(offsets[0]) * size_t(ld);
    return {to_bf16(buf, src, span(r ? gathered_extent(r, rows) : rows, ld, width)), r};
}

// offsets made relative to offsets[0], where the 16-bit copies of the groups' rows start
const int32_t* rebased(const int32_t* offsets, int G) {
    thread_local std::vector<int32_t> rel;
    rel.assign(offsets, offsets + G + 1);
    for (int32_t& o : rel) o -= offsets[0];
    return rel.data();
}

// 16-bit copies of G groups' op(B) (grouped_gemm_half's B), each its rows to the last one's end,
// one after another (at once when the groups are adjacent); wsz: elements per group.
const bf16* weights16(Trans tb, int G, int N, int K, const float* B, int ldb, size_t stride_b,
                      size_t& wsz) {
    const size_t blk = size_t(tb == Trans::T ? N : K);
    wsz              = span(blk, ldb, size_t(tb == Trans::T ? K : N));
    bf16* w          = grow(g_w16, size_t(G) * wsz);
    if (stride_b == wsz) {
        narrow_half(Dtype::bfloat16, w, B, size_t(G) * wsz);
    } else {
        for (int g = 0; g < G; ++g)
            narrow_half(Dtype::bfloat16, w + size_t(g) * wsz, B + size_t(g) * stride_b, wsz);
    }
    return w;
}

// grouped_gemm_half's product once its A is 16-bit (a: the groups' rows from offsets[0] on, or
// with r the gather's source): the float weights B stored by k (tb = T) packed by the bf16 kernel
// where it can round them as it packs (faster than narrowing them first), stored by row too where
// that is faster as well (grouped_gemm_bf16_float_b_rows: the AMX kernel and the widening ones;
// on AVX512_BF16 it was slower, docs/results.md), else from a narrowed copy.
void grouped_gemm_half_b(Trans tb, int G, const int32_t* offsets, int N, int K, const bf16* a,
                         int lda, const float* B, int ldb, size_t stride_b, float* C, int ldc,
                         const int32_t* r, GroupEpilogue epilogue) {
    float* c                = C + size_t(offsets[0]) * size_t(ldc);
    const int32_t* relative = rebased(offsets, G);
    if (tb == Trans::T ? grouped_gemm_bf16_float_b() : grouped_gemm_bf16_float_b_rows()) {
        grouped_gemm_bf16(Trans::N, tb, G, relative, N, K, 1.f, a, lda, B, ldb, stride_b, 0.f, c,
                          ldc, r, epilogue);
        return;
    }
    size_t wsz    = 0;
    const bf16* w = weights16(tb, G, N, K, B, ldb, stride_b, wsz);
    grouped_gemm_bf16(Trans::N, tb, G, relative, N, K, 1.f, a, lda, w, ldb, wsz, 0.f, c, ldc, r,
                      epilogue);
}

}  // namespace

void bf16_float_operands(bool on) { g_float_operands = on; }
bool half_products_convert(Dtype d) { return on_16bit(d); }
void round_operand(float* x, size_t n, Dtype d) {
    if (!on_16bit(d)) round_inplace(x, n, d);
}

void grouped_gemm_half(Dtype d, Trans tb, int G, const int32_t* offsets, int N, int K,
                       const float* A, int lda, const float* B, int ldb, size_t stride_b, float* C,
                       int ldc, const int32_t* a_rows, GroupEpilogue epilogue) {
    if (!on_16bit(d) || G == 0) {
        grouped_gemm_f32(Trans::N, tb, G, offsets, N, K, 1.f, A, lda, B, ldb, stride_b, 0.f, C, ldc,
                         a_rows, epilogue);
        return;
    }
    const Rows16 a = group_rows16(g_inp16, A, lda, size_t(K), offsets, G, a_rows);
    grouped_gemm_half_b(tb, G, offsets, N, K, a.x, lda, B, ldb, stride_b, C, ldc, a.r, epilogue);
}

void grouped_gemm_half(Dtype d, Trans tb, int G, const int32_t* offsets, int N, int K,
                       const uint16_t* A16, int lda, const float* B, int ldb, size_t stride_b,
                       float* C, int ldc, GroupEpilogue epilogue) {
    BGL_CHECK(on_16bit(d), "grouped_gemm_half: 16-bit operands where the products do not convert");
    if (G == 0) return;
    grouped_gemm_half_b(tb, G, offsets, N, K, A16 + size_t(offsets[0]) * size_t(lda), lda, B, ldb,
                        stride_b, C, ldc, nullptr, epilogue);
}

void grouped_gemm_tn_half(Dtype d, int G, const int32_t* offsets, int M, int N, const float* A,
                          int lda, const uint16_t* B16, int ldb, float* C, int ldc, size_t stride_c,
                          GroupEpilogue epilogue) {
    BGL_CHECK(on_16bit(d),
              "grouped_gemm_tn_half: 16-bit operands where the products do not convert");
    if (G == 0) return;
    const bf16* a = group_rows16(g_inp16, A, lda, size_t(M), offsets, G).x;
    grouped_gemm_tn_bf16(G, rebased(offsets, G), M, N, 1.f, a, lda,
                         B16 + size_t(offsets[0]) * size_t(ldb), ldb, 1.f, C, ldc, stride_c,
                         nullptr, epilogue);
}

void grouped_gemm_tn_half(Dtype d, int G, const int32_t* offsets, int M, int N, const float* A,
                          int lda, const float* B, int ldb, float* C, int ldc, size_t stride_c,
                          const int32_t* b_rows, GroupEpilogue epilogue) {
    if (!on_16bit(d) || G == 0) {
        grouped_gemm_tn_f32(G, offsets, M, N, 1.f, A, lda, B, ldb, 1.f, C, ldc, stride_c, b_rows,
                            epilogue);
        return;
    }
    const bf16* a  = group_rows16(g_inp16, A, lda, size_t(M), offsets, G).x;
    const Rows16 b = group_rows16(g_dout16, B, ldb, size_t(N), offsets, G, b_rows);
    grouped_gemm_tn_bf16(G, rebased(offsets, G), M, N, 1.f, a, lda, b.x, ldb, 1.f, C, ldc, stride_c,
                         b.r, epilogue);
}

namespace {

// grouped_linear_backward_half once dout's and inp's 16-bit rows are at hand (from offsets[0]
// on; r: inp's gather, b its source).
void grouped_backward16(int G, const int32_t* offsets, int OUT, int IN, float* dinp, float* dweight,
                        size_t stride_dw, const bf16* dy, const bf16* b, const int32_t* r,
                        const float* weight, size_t stride_w, GroupEpilogue dweight_epilogue,
                        GroupEpilogue dinp_epilogue) {
    grouped_gemm_tn_bf16(G, rebased(offsets, G), OUT, IN, 1.f, dy, OUT, b, IN, 1.f, dweight, IN,
                         stride_dw, r, dweight_epilogue);
    grouped_gemm_half_b(Trans::N, G, offsets, IN, OUT, dy, OUT, weight, IN, stride_w, dinp, IN,
                        nullptr, dinp_epilogue);
}

}  // namespace

void grouped_linear_backward_half(Dtype d, int G, const int32_t* offsets, int OUT, int IN,
                                  float* dinp, float* dweight, size_t stride_dw, const float* dout,
                                  const float* inp, const int32_t* inp_rows, const float* weight,
                                  size_t stride_w, GroupEpilogue dweight_epilogue,
                                  GroupEpilogue dinp_epilogue) {
    if (!on_16bit(d) || G == 0) {
        grouped_gemm_tn_half(d, G, offsets, OUT, IN, dout, OUT, inp, IN, dweight, IN, stride_dw,
                             inp_rows, dweight_epilogue);
        grouped_gemm_half(d, Trans::N, G, offsets, IN, OUT, dout, OUT, weight, IN, stride_w, dinp,
                          IN, nullptr, dinp_epilogue);
        return;
    }
    const bf16* dy = group_rows16(g_dout16, dout, OUT, size_t(OUT), offsets, G).x;
    const Rows16 b = group_rows16(g_inp16, inp, IN, size_t(IN), offsets, G, inp_rows);
    grouped_backward16(G, offsets, OUT, IN, dinp, dweight, stride_dw, dy, b.x, b.r, weight,
                       stride_w, dweight_epilogue, dinp_epilogue);
}

uint16_t* dout16_scratch(Dtype d, size_t n) {
    BGL_CHECK(on_16bit(d), "dout16_scratch: a 16-bit operand where the products do not convert");
    return grow(g_dout16, n);
}

const uint16_t* narrow_operand_rows(Dtype d, const float* X, int ld, size_t width,
                                    const int32_t* offsets, int G, const int32_t* rows_of) {
    BGL_CHECK(on_16bit(d),
              "narrow_operand_rows: a 16-bit operand where the products do not convert");
    BGL_CHECK(G >= 0 && offsets[0] == 0, "narrow_operand_rows: the rows from 0 on");
    return group_rows16(g_inp16, X, ld, width, offsets, G, rows_of).x;
}

void narrow_dout_rows_serial(Dtype d, uint16_t* out, const float* dout, const int32_t* rows,
                             const float* scale, size_t n, int C) {
    BGL_CHECK(on_16bit(d),
              "narrow_dout_rows_serial: a 16-bit operand where the products do not convert");
    const auto narrow = dispatch().bf16_narrow_scaled;
    for (size_t i = 0; i < n; ++i) {
        narrow(out + i * size_t(C), dout + size_t(rows[i]) * size_t(C), scale[i], size_t(C));
    }
}

const uint16_t* narrow_dout(Dtype d, const float* dout, size_t n) {
    BGL_CHECK(on_16bit(d), "narrow_dout: a 16-bit operand where the products do not convert");
    return to_bf16(g_dout16, dout, n);
}

const uint16_t* narrow_dout_rows(Dtype d, const float* dout, const int32_t* rows,
                                 const float* scale, size_t n, int C) {
    BGL_CHECK(on_16bit(d), "narrow_dout_rows: a 16-bit operand where the products do not convert");
    bf16* out = grow(g_dout16, n * size_t(C));
    parallel_rows(int64_t(n), C, [&](int64_t begin, int64_t end) {
        narrow_dout_rows_serial(d, out + size_t(begin) * size_t(C), dout, rows + begin,
                                scale + begin, size_t(end - begin), C);
    });
    return out;
}

const uint16_t* gelu_backward_dout(Dtype d, Dtype x_dtype, const KeptArray& x, const float* dout,
                                   size_t n, bool fp64) {
    BGL_CHECK(on_16bit(d),
              "gelu_backward_dout: a 16-bit operand where the products do not convert");
    bf16* out                    = grow(g_dout16, n);
    const GeluBackwardRange gelu = gelu_backward_range(fp64);
    in_blocks(
        n, [&](size_t o, size_t len) { gelu_dout_block(gelu, d, out, x_dtype, x, dout, o, len); });
    return out;
}

void grouped_linear_backward_dout16(Dtype d, int G, const int32_t* offsets, int OUT, int IN,
                                    float* dinp, float* dweight, size_t stride_dw,
                                    const uint16_t* dout16, const float* inp,
                                    const int32_t* inp_rows, const uint16_t* inp16,
                                    const float* weight, size_t stride_w,
                                    GroupEpilogue dweight_epilogue, GroupEpilogue dinp_epilogue) {
    BGL_CHECK(on_16bit(d),
              "grouped_linear_backward_dout16: 16-bit operands where the products "
              "do not convert");
    BGL_CHECK(!inp16 || !inp_rows, "grouped_linear_backward_dout16: a gather of 16-bit rows");
    if (G == 0) return;
    const bf16* dy = dout16 + size_t(offsets[0]) * size_t(OUT);
    const Rows16 b = inp16 ? Rows16{inp16 + size_t(offsets[0]) * size_t(IN), nullptr}
                           : group_rows16(g_inp16, inp, IN, size_t(IN), offsets, G, inp_rows);
    grouped_backward16(G, offsets, OUT, IN, dinp, dweight, stride_dw, dy, b.x, b.r, weight,
                       stride_w, dweight_epilogue, dinp_epilogue);
}

void linear_forward_half(Dtype d, float* out, const float* inp, const float* weight,
                         const float* bias, int N, int IC, int OC, Dtype out_dtype,
                         uint16_t* out_half) {
    BGL_CHECK(!out_half || out_dtype != Dtype::float32,
              "linear_forward_half: a 16-bit out needs a half out_dtype");
    const size_t n_out = size_t(N) * size_t(OC);
    if (!on_16bit(d)) {
        linear_forward(out, inp, weight, bias, N, IC, OC);
        round_inplace(out, n_out, out_dtype);
        if (out_half) narrow_half(out_dtype, out_half, out, n_out);
        return;
    }
    linear_forward_half16(d, out, to_bf16(g_inp16, inp, size_t(N) * IC), weight, bias, N, IC, OC,
                          out_dtype, out_half);
}

namespace {
// A linear layer's epilogue on its output (N, OC): bias, rounding to out_dtype and narrowing to
// out_half, a row at a time while the row is in cache (nothing for no bias and float32).
void bias_round_rows(float* out, const float* bias, int N, int OC, Dtype out_dtype,
                     uint16_t* out_half) {
    if (!bias && out_dtype == Dtype::float32) return;
    parallel_rows(N, OC, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            bias_round_serial(out + i * OC, bias, size_t(OC), out_dtype,
                              out_half ? out_half + i * OC : nullptr);
        }
    });
}
}  // namespace

const uint16_t* narrow_weight(Dtype d, const float* weight, size_t n) {
    BGL_CHECK(on_16bit(d), "narrow_weight: a 16-bit operand where the products do not convert");
    return to_bf16(g_w16, weight, n);
}

void linear_forward_w16(Dtype d, float* out, const uint16_t* inp16, const uint16_t* w16, int N,
                        int IC, int OC, Dtype out_dtype) {
    BGL_CHECK(on_16bit(d), "linear_forward_w16: 16-bit operands where the products do not convert");
    gemm_bf16(Trans::N, Trans::T, N, OC, IC, 1.f, inp16, IC, w16, IC, 0.f, out, OC);
    bias_round_rows(out, nullptr, N, OC, out_dtype, nullptr);
}

void linear_forward_half16(Dtype d, float* out, const uint16_t* inp16, const float* weight,
                           const float* bias, int N, int IC, int OC, Dtype out_dtype,
                           uint16_t* out_half) {
    BGL_CHECK(on_16bit(d),
              "linear_forward_half16: 16-bit operands where the products do not convert");
    BGL_CHECK(!out_half || out_dtype != Dtype::float32,
              "linear_forward_half16: a 16-bit out needs a half out_dtype");
    if (gemm_bf16_float_b()) {  // the weight stored by k: packed from its floats (see above)
        gemm_bf16(Trans::N, Trans::T, N, OC, IC, 1.f, inp16, IC, weight, IC, 0.f, out, OC);
    } else {
        const bf16* w = to_bf16(g_w16, weight, size_t(OC) * IC);
        gemm_bf16(Trans::N, Trans::T, N, OC, IC, 1.f, inp16, IC, w, IC, 0.f, out, OC);
    }
    bias_round_rows(out, bias, N, OC, out_dtype, out_half);
}

void linear_backward_half(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int IC, int OC) {
    if (!on_16bit(d)) {
        linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
        return;
    }
    linear_backward_dout16(d, dinp, dweight, dbias, narrow_dout(d, dout, size_t(N) * OC), inp,
                           nullptr, weight, N, IC, OC);
}

namespace {

// linear_backward_half16's products and column sums on the 16-bit dout dy.
void backward16(float* dinp, float* dweight, float* dbias, const bf16* dy, const bf16* inp16,
                const float* weight, int N, int IC, int OC) {
    // dweight first: dinp may overwrite inp16 (the MLP's second layer, its input's 16 bits in the
    // storage its input gradient goes to)
    if (dweight && N > 0) {
        gemm_bf16(Trans::T, Trans::N, OC, IC, N, 1.f, dy, OC, inp16, IC, 1.f, dweight, IC);
    }
    if (dinp && gemm_bf16_float_b_rows()) {
        gemm_bf16(Trans::N, Trans::N, N, IC, OC, 1.f, dy, OC, weight, IC, 0.f, dinp, IC);
    } else if (dinp) {
        const bf16* w = to_bf16(g_w16, weight, size_t(OC) * IC);
        gemm_bf16(Trans::N, Trans::N, N, IC, OC, 1.f, dy, OC, w, IC, 0.f, dinp, IC);
    }
    if (!dbias) return;
    // column sums in double, each column over all rows in order (as ops.cpp), of the 16-bit
    // copy: dout's values rounded, which a caller need not have done itself
    parallel_cols(OC, N, [&](int64_t c0, int64_t c1) {
        add_col_sums(dbias + c0, dy + c0, N, OC, int(c1 - c0));
    });
}

}  // namespace

void linear_backward_half16(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                            const uint16_t* inp16, const float* weight, int N, int IC, int OC) {
    BGL_CHECK(on_16bit(d),
              "linear_backward_half16: 16-bit operands where the products do not convert");
    linear_backward_dout16(d, dinp, dweight, dbias, narrow_dout(d, dout, size_t(N) * OC), nullptr,
                           inp16, weight, N, IC, OC);
}

namespace {
// Floats widened from 16-bit values into buf, grown once: a 16-bit operand where the products
// take floats (kept16 below; g_wide; a 16-bit output gradient: g_wide_dout), or the attention's
// kept arrays where the 16-bit core does not run (attention_*_half16).
AlignedVector<float> g_wide, g_wide_dout;

const float* widened(AlignedVector<float>& buf, Dtype d, const uint16_t* x16, size_t n) {
    float* w = grow(buf, n);
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        widen_serial(d, w + begin, x16 + begin, size_t(end - begin));
    });
    return w;
}
}  // namespace

void linear_backward_dout16(Dtype d, float* dinp, float* dweight, float* dbias,
                            const uint16_t* dout16, const float* inp, const uint16_t* inp16,
                            const float* weight, int N, int IC, int OC) {
    BGL_CHECK(d == Dtype::bfloat16, "linear_backward_dout16: {} is not bf16", dtype_name(d));
    if (!on_16bit(d)) {  // the products take the rounded floats: on the widened values
        const float* dy = widened(g_wide_dout, d, dout16, size_t(N) * size_t(OC));
        const float* x =
            inp || !dweight || N == 0 ? inp : widened(g_wide, d, inp16, size_t(N) * size_t(IC));
        linear_backward_half(d, dinp, dweight, dbias, dy, x, weight, N, IC, OC);
        return;
    }
    const bf16* x = inp16;
    if (!x && dweight && N > 0) x = to_bf16(g_inp16, inp, size_t(N) * IC);
    backward16(dinp, dweight, dbias, dout16, x, weight, N, IC, OC);
}

void linear_forward_kept16(Dtype d, float* out, const uint16_t* inp16, const float* weight,
                           const float* bias, int N, int IC, int OC, Dtype out_dtype,
                           uint16_t* out_half) {
    if (on_16bit(d)) {
        linear_forward_half16(d, out, inp16, weight, bias, N, IC, OC, out_dtype, out_half);
        return;
    }
    linear_forward_half(d, out, widened(g_wide, d, inp16, size_t(N) * size_t(IC)), weight, bias, N,
                        IC, OC, out_dtype, out_half);
}

void linear_backward_kept16(Dtype d, float* dinp, float* dweight, float* dbias, const float* dout,
                            const uint16_t* inp16, const float* weight, int N, int IC, int OC) {
    if (on_16bit(d)) {
        linear_backward_half16(d, dinp, dweight, dbias, dout, inp16, weight, N, IC, OC);
        return;
    }
    const float* inp =
        dweight && N > 0 ? widened(g_wide, d, inp16, size_t(N) * size_t(IC)) : nullptr;
    linear_backward_half(d, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void crossentropy_backward_narrow(Dtype d, uint16_t* dy16, const float* logits,
                                  const int32_t* targets, const float* dlosses, int N, int V,
                                  bool fp64, const float* lse) {
    BGL_CHECK(d == Dtype::bfloat16, "crossentropy_backward_narrow: {} is not bf16", dtype_name(d));
    const CrossentropyBackwardRows ce = crossentropy_backward_rows(fp64);
    parallel_rows(N, V, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> row;
        float* w = grow(row, size_t(V));
        for (int64_t i = begin; i < end; ++i) {
            ce(w, logits + i * V, targets + i, dlosses + i, 0, 1, V, lse ? lse + i : nullptr);
            narrow_half_serial(Dtype::bfloat16, dy16 + i * V, w, size_t(V));
        }
    });
}

void crossentropy_linear_backward_half(Dtype d, float* dinp, float* dweight, float* logits,
                                       const int32_t* targets, const float* dlosses,
                                       const float* inp, const float* weight, int N, int IC, int V,
                                       bool fp64, const float* lse) {
    if (!on_16bit(d)) {
        // dlogits over the logits, each row rounded while it is in cache
        const CrossentropyBackwardRows ce = crossentropy_backward_rows(fp64);
        parallel_rows(N, V, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                ce(logits, logits, targets, dlosses, i, i + 1, V, lse);
                round_inplace_serial(logits + i * V, size_t(V), d);
            }
        });
        linear_backward(dinp, dweight, nullptr, logits, inp, weight, N, IC, V);
        return;
    }
    // each row's dlogits in a buffer in cache, kept only as its 16 bits: the floats never reach
    // memory and the product's operand needs no pass of its own. The 16 bits go over the
    // logits' own storage (no N x V scratch): row i's lie over float rows i / 2 to (i + 1) / 2,
    // so the rows run in slices [s, 2 s) (the first [0, 1)), one parallel call each: a slice's
    // 16 bits land only on float rows of earlier slices, all read by then, and row 0's on its own
    // floats, read whole into the buffer first.
    bf16* dy = reinterpret_cast<bf16*>(logits);
    for (int64_t s0 = 0; s0 < N; s0 = s0 == 0 ? 1 : 2 * s0) {
        const int64_t s1 = std::min<int64_t>(N, s0 == 0 ? 1 : 2 * s0);
        crossentropy_backward_narrow(d, dy + s0 * V, logits + s0 * V, targets + s0, dlosses + s0,
                                     int(s1 - s0), V, fp64, lse ? lse + s0 : nullptr);
    }
    const bf16* x = dweight && N > 0 ? to_bf16(g_inp16, inp, size_t(N) * IC) : nullptr;
    backward16(dinp, dweight, nullptr, dy, x, weight, N, IC, V);
}

// ---- layernorm ----

namespace {

void layernorm_forward_f64_rows(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int64_t begin, int64_t end,
                                int C) {
    for (int64_t i = begin; i < end; ++i) {
        const float* x = inp + i * C;
        double m       = 0;
        for (int c = 0; c < C; ++c) m += double(x[c]);
        m /= C;
        double var = 0;
        for (int c = 0; c < C; ++c) var += (double(x[c]) - m) * (double(x[c]) - m);
        var /= C;
        const double s = 1.0 / std::sqrt(var + 1e-5);
        for (int c = 0; c < C; ++c) {
            out[i * C + c] = float((double(x[c]) - m) * s * double(weight[c]) + double(bias[c]));
        }
        mean[i] = float(m);
        rstd[i] = float(s);
    }
}

}  // namespace

void layernorm_forward_f64(float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int N, int C) {
    parallel_rows(N, 4 * C, [&](int64_t begin, int64_t end) {
        layernorm_forward_f64_rows(out, mean, rstd, inp, weight, bias, begin, end, C);
    });
}

void layernorm_forward_narrow(Dtype d, uint16_t* out16, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, bool fp64) {
    BGL_CHECK(d != Dtype::float32, "layernorm_forward_narrow: float32 is not a half type");
    const auto rows = fp64 ? layernorm_forward_f64_rows : dispatch().layernorm_forward_rows;
    // a block of rows at a time into a per-thread buffer in L1/L2, then narrowed from there
    const int64_t block = std::max<int64_t>(1, kFuseBlock / std::max(C, 1));
    parallel_rows(N, fp64 ? 4 * C : C, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> buf;
        float* w = grow(buf, size_t(block) * size_t(C));
        for (int64_t i0 = begin; i0 < end; i0 += block) {
            const int64_t n = std::min(block, end - i0);
            rows(w, mean + i0, rstd + i0, inp + i0 * C, weight, bias, 0, n, C);
            narrow_half_serial(d, out16 + i0 * C, w, size_t(n) * size_t(C));
        }
    });
}

void layernorm_backward_f64(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, const float* mean,
                            const float* rstd, int N, int C) {
    parallel_rows(N, 6 * C, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float* x  = inp + i * C;
            const float* dy = dout + i * C;
            const double m = mean[i], s = rstd[i];
            double dnorm_mean = 0, dnorm_norm_mean = 0;
            for (int c = 0; c < C; ++c) {
                const double dnorm = double(weight[c]) * double(dy[c]);
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * (double(x[c]) - m) * s;
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            for (int c = 0; c < C; ++c) {
                const double norm  = (double(x[c]) - m) * s;
                const double dnorm = double(weight[c]) * double(dy[c]);
                dinp[i * C + c]    = float(double(dinp[i * C + c]) +
                                        (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
            }
        }
    });
    const int64_t nblk = (C + kColBlock - 1) / kColBlock;
    parallel_rows(nblk, int64_t(N) * kColBlock, [&](int64_t b0, int64_t b1) {
        for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t c0 = blk * kColBlock, c1 = std::min<int64_t>(c0 + kColBlock, C);
            double aw[kColBlock] = {}, ab[kColBlock] = {};
            for (int64_t i = 0; i < N; ++i) {
                const double m = mean[i], s = rstd[i];
                for (int64_t c = c0; c < c1; ++c) {
                    const double dy = dout[i * C + c];
                    aw[c - c0] += (double(inp[i * C + c]) - m) * s * dy;
                    ab[c - c0] += dy;
                }
            }
            for (int64_t c = c0; c < c1; ++c) {
                dweight[c] = float(double(dweight[c]) + aw[c - c0]);
                dbias[c]   = float(double(dbias[c]) + ab[c - c0]);
            }
        }
    });
}

// ---- GELU ----

void gelu_forward_f64(float* out, const float* inp, size_t n) {
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        gelu_forward_f64_range(out, inp, begin, end);
    });
}

void gelu_backward_f64(float* dinp, const float* inp, const float* dout, size_t n) {
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        gelu_backward_f64_range(dinp, inp, dout, begin, end);
    });
}

// ---- linear layers in FP64 ----

void linear_forward_f64(float* out, const float* inp, const float* weight, const float* bias, int N,
                        int IC, int OC) {
    parallel_rows(N, int64_t(IC) * OC, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* x = inp + t * IC;
            for (int64_t o = 0; o < OC; ++o) {
                const float* w = weight + o * IC;
                double acc     = bias ? double(bias[o]) : 0.0;
                for (int64_t i = 0; i < IC; ++i) acc += double(x[i]) * double(w[i]);
                out[t * OC + o] = float(acc);
            }
        }
    });
}

void linear_backward_f64(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, int N, int IC, int OC) {
    // dinp[t, :] = sum_o dout[t, o] weight[o, :], summed over o in order into a double row
    if (dinp) {
        parallel_rows(N, int64_t(IC) * OC, [&](int64_t t0, int64_t t1) {
            thread_local std::vector<double> acc;
            double* a = grow(acc, size_t(IC));
            for (int64_t t = t0; t < t1; ++t) {
                std::fill(a, a + IC, 0.0);
                for (int64_t o = 0; o < OC; ++o) {
                    const double d = dout[t * OC + o];
                    const float* w = weight + o * IC;
                    for (int64_t i = 0; i < IC; ++i) a[i] += d * double(w[i]);
                }
                for (int64_t i = 0; i < IC; ++i) dinp[t * IC + i] = float(a[i]);
            }
        });
    }
    // dweight[o, :] += sum_t dout[t, o] inp[t, :], summed over t in order
    parallel_rows(OC, int64_t(IC) * N, [&](int64_t o0, int64_t o1) {
        thread_local std::vector<double> acc;
        double* a = grow(acc, size_t(IC));
        for (int64_t o = o0; o < o1; ++o) {
            std::fill(a, a + IC, 0.0);
            double db = 0;
            for (int64_t t = 0; t < N; ++t) {
                const double d = dout[t * OC + o];
                db += d;
                const float* x = inp + t * IC;
                for (int64_t i = 0; i < IC; ++i) a[i] += d * double(x[i]);
            }
            float* dw = dweight + o * IC;
            for (int64_t i = 0; i < IC; ++i) dw[i] += float(a[i]);
            if (dbias) dbias[o] += float(db);
        }
    });
}

HalfAttention half_attention(Dtype d, int hs) {
    if (d != Dtype::bfloat16 || !avx512::attention_bf16_shape_supported(hs)) {
        return HalfAttention::none;
    }
    const gemm::Path active = gemm::active_path();
    const gemm::Path p      = active == gemm::Path::automatic ? gemm::best_path() : active;
    if (p == gemm::Path::amx) return HalfAttention::tiles;
    // vdpbf16ps runs at twice the float FMA rate on the AMD Zen 4/5 but at half of it where the
    // CPU has AMX (measured there: 0.77x the float attention, docs/results.md), so not there.
    if (p == gemm::Path::avx512 && cpu_features().avx512_bf16 && !cpu_features().amx_bf16) {
        return HalfAttention::dots;
    }
    return HalfAttention::none;
}

const char* half_attention_name(HalfAttention h) {
    switch (h) {
        case HalfAttention::tiles:
            return "amx tiles";
        case HalfAttention::dots:
            return "avx512_bf16 dots";
        case HalfAttention::none:
            break;
    }
    return "none";
}

void attention_forward_half(Dtype d, float* out, float* lse, const float* qkv, int B, int T, int C,
                            int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const HalfAttention h = half_attention(d, C / NH);
    if (h == HalfAttention::none) {
        attention_forward(out, lse, qkv, B, T, C, NH);
    } else {
        avx512::attention_forward_bf16(h == HalfAttention::tiles, out, lse, qkv, B, T, C, NH);
    }
}

void attention_backward_half(Dtype d, float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const HalfAttention h = half_attention(d, C / NH);
    if (h == HalfAttention::none) {
        attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    } else {
        avx512::attention_backward_bf16(h == HalfAttention::tiles, dqkv, dout, qkv, out, lse, B, T,
                                        C, NH);
    }
}

const uint16_t* attention_backward_dout(Dtype d, float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C,
                                        int NH, bool fp64) {
    BGL_CHECK(on_16bit(d),
              "attention_backward_dout: a 16-bit operand where the products do not convert");
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const size_t n        = size_t(B) * size_t(T) * 3 * size_t(C);
    const HalfAttention h = fp64 ? HalfAttention::none : half_attention(d, C / NH);
    if (h == HalfAttention::none) {
        (fp64 ? attention_backward_f64 : attention_backward)(dqkv, dout, qkv, out, lse, B, T, C,
                                                             NH);
        return narrow_dout(d, dqkv, n);
    }
    bf16* out16 = grow(g_dout16, n);
    avx512::attention_backward_bf16(h == HalfAttention::tiles, nullptr, dout, qkv, out, lse, B, T,
                                    C, NH, out16);
    return out16;
}

bool attention_rounds_qkv(Dtype d, int hs, bool fp64) {
    return !fp64 && d == Dtype::bfloat16 && hs > 0 && half_attention(d, hs) == HalfAttention::none;
}

bool attention_kept16(Dtype d, int hs, bool fp64) {
    if (attention_rounds_qkv(d, hs, fp64)) return true;
    // 1 / sqrt(hs) a power of two: hs a power of four
    const bool scale_exact =
        hs > 0 && (hs & (hs - 1)) == 0 && std::countr_zero(unsigned(hs)) % 2 == 0;
    return !fp64 && scale_exact && half_attention(d, hs) != HalfAttention::none;
}

namespace {
// Whether attention_forward_half16 / backward_dout16 run the bf16 core on the 16 bits directly.
bool core_on_kept16(Dtype d, int hs) {
    return attention_kept16(d, hs, false) && half_attention(d, hs) != HalfAttention::none;
}

// The kept Q, K, V and O widened, where the 16-bit core does not run (see attention_kept16).
AlignedVector<float> g_attn_qkv, g_attn_out;
}  // namespace

void attention_forward_half16(Dtype d, uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                              int T, int C, int NH) {
    BGL_CHECK(d != Dtype::float32, "attention_forward_half16: float32 is not a half type");
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    if (core_on_kept16(d, C / NH)) {
        avx512::attention_forward_bf16(half_attention(d, C / NH) == HalfAttention::tiles, out16,
                                       lse, qkv16, B, T, C, NH);
        return;
    }
    const size_t n = size_t(B) * size_t(T) * size_t(C);
    float* out     = grow(g_attn_out, n);
    attention_forward_half(d, out, lse, widened(g_attn_qkv, d, qkv16, 3 * n), B, T, C, NH);
    narrow_half(d, out16, out, n);
}

const uint16_t* attention_backward_dout16(Dtype d, float* dqkv, const float* dout,
                                          const uint16_t* qkv16, const uint16_t* out16,
                                          const float* lse, int B, int T, int C, int NH) {
    BGL_CHECK(d != Dtype::float32, "attention_backward_dout16: float32 is not a half type");
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const size_t n = size_t(B) * size_t(T) * size_t(C);
    if (core_on_kept16(d, C / NH) && on_16bit(d)) {
        bf16* g16 = grow(g_dout16, 3 * n);
        avx512::attention_backward_bf16(half_attention(d, C / NH) == HalfAttention::tiles, g16,
                                        dout, qkv16, out16, lse, B, T, C, NH);
        return g16;
    }
    const float* qkv = widened(g_attn_qkv, d, qkv16, 3 * n);
    const float* out = widened(g_attn_out, d, out16, n);
    if (on_16bit(d)) return attention_backward_dout(d, dqkv, dout, qkv, out, lse, B, T, C, NH);
    attention_backward_half(d, dqkv, dout, qkv, out, lse, B, T, C, NH);
    return nullptr;
}

// ---- attention: one (batch, head) pair per work item ----

void attention_forward_f64(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int64_t hs = C / NH, C3 = 3 * int64_t(C);
    const double scale = 1.0 / std::sqrt(double(hs));
    parallel_rows(int64_t(B) * NH, int64_t(T) * T * hs, [&](int64_t begin, int64_t end) {
        thread_local std::vector<double> sbuf, obuf;
        double* s = grow(sbuf, size_t(T));
        double* o = grow(obuf, size_t(hs));
        for (int64_t bh = begin; bh < end; ++bh) {
            const int64_t b = bh / NH, h = bh % NH;
            const float* base = qkv + b * T * C3 + h * hs;
            for (int64_t t = 0; t < T; ++t) {
                const float* q = base + t * C3;
                double m       = -INFINITY;
                for (int64_t j = 0; j <= t; ++j) {
                    const float* k = base + j * C3 + C;
                    double d       = 0;
                    for (int64_t e = 0; e < hs; ++e) d += double(q[e]) * double(k[e]);
                    s[j] = d * scale;
                    m    = std::max(m, s[j]);
                }
                double sum = 0;
                for (int64_t j = 0; j <= t; ++j) sum += std::exp(s[j] - m);
                const double l = m + std::log(sum);
                std::fill(o, o + hs, 0.0);
                for (int64_t j = 0; j <= t; ++j) {
                    const double p = std::exp(s[j] - l);
                    const float* v = base + j * C3 + 2 * C;
                    for (int64_t e = 0; e < hs; ++e) o[e] += p * double(v[e]);
                }
                lse[bh * T + t] = float(l);
                float* y        = out + (b * T + t) * C + h * hs;
                for (int64_t e = 0; e < hs; ++e) y[e] = float(o[e]);
            }
        }
    });
}

void attention_backward_f64(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int B, int T, int C, int NH) {
    const int64_t hs = C / NH, C3 = 3 * int64_t(C);
    const double scale = 1.0 / std::sqrt(double(hs));
    parallel_rows(int64_t(B) * NH, 2 * int64_t(T) * T * hs, [&](int64_t begin, int64_t end) {
        thread_local std::vector<double> gbuf;
        double* g = grow(gbuf, size_t(T * 3 * hs));  // [t][q | k | v] of this head
        for (int64_t bh = begin; bh < end; ++bh) {
            const int64_t b = bh / NH, h = bh % NH;
            const float* base = qkv + b * T * C3 + h * hs;
            std::fill(g, g + T * 3 * hs, 0.0);
            for (int64_t t = 0; t < T; ++t) {
                const float* q  = base + t * C3;
                const float* dy = dout + (b * T + t) * C + h * hs;
                const float* y  = out + (b * T + t) * C + h * hs;
                const double l  = lse[bh * T + t];
                double D        = 0;
                for (int64_t e = 0; e < hs; ++e) D += double(dy[e]) * double(y[e]);
                double* gq = g + t * 3 * hs;
                for (int64_t j = 0; j <= t; ++j) {
                    const float* k = base + j * C3 + C;
                    const float* v = k + C;
                    double d = 0, dp = 0;
                    for (int64_t e = 0; e < hs; ++e) {
                        d += double(q[e]) * double(k[e]);
                        dp += double(dy[e]) * double(v[e]);
                    }
                    const double p  = std::exp(d * scale - l);
                    const double ds = p * (dp - D) * scale;
                    double* gk      = g + j * 3 * hs + hs;
                    double* gv      = gk + hs;
                    for (int64_t e = 0; e < hs; ++e) {
                        gq[e] += ds * double(k[e]);
                        gk[e] += ds * double(q[e]);
                        gv[e] += p * double(dy[e]);
                    }
                }
            }
            for (int64_t t = 0; t < T; ++t) {
                float* row = dqkv + (b * T + t) * C3 + h * hs;
                for (int part = 0; part < 3; ++part) {
                    for (int64_t e = 0; e < hs; ++e) {
                        row[part * C + e] = float(g[t * 3 * hs + part * hs + e]);
                    }
                }
            }
        }
    });
}

// ---- cross-entropy ----

namespace {
double row_logsumexp_f64(const float* x, int V) {
    double m = -INFINITY;
    for (int j = 0; j < V; ++j) m = std::max(m, double(x[j]));
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(x[j]) - m);
    return m + std::log(sum);
}
// crossentropy_backward_f64 of rows [begin, end) on the calling thread. lse is not read: the
// logsumexp is computed again in double (a float one would round it).
void crossentropy_backward_f64_rows(float* dlogits, const float* logits, const int32_t* targets,
                                    const float* dlosses, int64_t begin, int64_t end, int V,
                                    const float*) {
    // dlogits may alias logits: each element is read before it is written.
    for (int64_t i = begin; i < end; ++i) {
        const float* x  = logits + i * V;
        float* d        = dlogits + i * V;
        const double l  = row_logsumexp_f64(x, V);
        const double dl = dlosses[i];
        const int tg    = targets[i];
        for (int j = 0; j < V; ++j) {
            d[j] = float((std::exp(double(x[j]) - l) - (j == tg ? 1.0 : 0.0)) * dl);
        }
    }
}

}  // namespace

void crossentropy_forward_f64(float* losses, const float* logits, const int32_t* targets, int N,
                              int V, float*) {
    parallel_rows(N, V, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float* x = logits + i * V;
            losses[i]      = float(row_logsumexp_f64(x, V) - double(x[targets[i]]));
        }
    });
}

void crossentropy_backward_f64(float* dlogits, const float* logits, const int32_t* targets,
                               const float* dlosses, int N, int V) {
    parallel_rows(N, V, [&](int64_t begin, int64_t end) {
        crossentropy_backward_f64_rows(dlogits, logits, targets, dlosses, begin, end, V, nullptr);
    });
}

// ---- AdamW ----

namespace {

void adamw_f64_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                     int64_t end, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step, float grad_scale) {
    const double b1 = beta1, b2 = beta2;
    const double c1 = 1.0 - std::pow(b1, step), c2 = 1.0 - std::pow(b2, step);
    for (int64_t i = begin; i < end; ++i) {
        const double g  = grad[i] * grad_scale;
        const double mi = b1 * double(m[i]) + (1.0 - b1) * g;
        const double vi = b2 * double(v[i]) + (1.0 - b2) * g * g;
        const double p  = param[i];
        m[i]            = float(mi);
        v[i]            = float(vi);
        param[i]        = float(p - double(lr) * ((mi / c1) / (std::sqrt(vi / c2) + double(eps)) +
                                           double(weight_decay) * p));
    }
}

}  // namespace

void adamw_update_f64(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale) {
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        adamw_f64_range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, step,
                        grad_scale);
    });
}

namespace {

// param[0, n) = master[0, n) rounded to d, after the optimizer's update of a slice
void round_master_slice(Dtype d, float* param, const float* master, size_t n) {
    if (d == Dtype::float32) {
        std::copy(master, master + n, param);
    } else if (d == Dtype::bfloat16) {
        // the parameters are read again in the next forward, after the whole pass
        dispatch().bf16_round_stream(param, master, n);
    } else {
        round_range(param, master, n, d);
    }
}

}  // namespace

void adamw_update_rounded(Dtype d, bool fp64, float* param, float* master, const float* grad,
                          float* m, float* v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int step, float grad_scale) {
    // Slices of 4 Ki elements: the master's 16 KiB are still in L1 when they are rounded.
    constexpr int64_t kSlice = 4096;
    const AdamWCorrections c = adamw_corrections(beta1, beta2, step);
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; s += kSlice) {
            const int64_t e = std::min(end, s + kSlice);
            if (fp64) {
                adamw_f64_range(master, grad, m, v, s, e, lr, beta1, beta2, eps, weight_decay, step,
                                grad_scale);
            } else {
                adamw_update_range(master, grad, m, v, s, e, lr, beta1, beta2, eps, weight_decay, c,
                                   grad_scale);
            }
            round_master_slice(d, param + s, master + s, size_t(e - s));
        }
    });
}

void adamw_update_bf16_moments(Dtype d, bool fp64, float* param, float* master, const float* grad,
                               uint16_t* m, uint16_t* v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int step,
                               float grad_scale) {
    // Slices of 2 Ki elements: the widened m and v (16 KiB) and the slice's parameters, master
    // and gradient stay in L1 between the widening, the update and the narrowing (and the
    // master's rounding).
    constexpr int64_t kSlice = 2048;
    const AdamWCorrections c = adamw_corrections(beta1, beta2, step);
    const KernelTable& k     = dispatch();
    // the AVX2 and AVX-512 kernels convert the moments in their registers: the same bits, no
    // extra passes
    const bool fused = !fp64 && k.adamw_range_bf16m != nullptr;
    parallel_rows(int64_t(n), 8, [&](int64_t begin, int64_t end) {
        alignas(64) float mf[kSlice], vf[kSlice];
        for (int64_t s = begin; s < end; s += kSlice) {
            const size_t len = size_t(std::min(end, s + kSlice) - s);
            if (fused) {
                float* x = master ? master : param;
                k.adamw_range_bf16m(x, grad, m, v, s, s + int64_t(len), lr, beta1, beta2, eps,
                                    weight_decay, c.c1, c.c2, grad_scale);
                if (master) round_master_slice(d, param + s, master + s, len);
                continue;
            }
            k.bf16_widen(mf, m + s, len);
            k.bf16_widen(vf, v + s, len);
            float* x = master ? master + s : param + s;  // what the update changes
            if (fp64) {
                adamw_f64_range(x, grad + s, mf, vf, 0, int64_t(len), lr, beta1, beta2, eps,
                                weight_decay, step, grad_scale);
            } else {
                adamw_update_range(x, grad + s, mf, vf, 0, int64_t(len), lr, beta1, beta2, eps,
                                   weight_decay, c, grad_scale);
            }
            k.bf16_narrow(m + s, mf, len);
            k.bf16_narrow(v + s, vf, len);
            if (master) round_master_slice(d, param + s, master + s, len);
        }
    });
}

}  // namespace bagualu::kernels

// Expert MLPs over the permuted rows: each matrix product is one grouped GEMM over all local
// experts (kernels/grouped_gemm.h), so threads balance over experts' rows together and an expert
// with no rows costs nothing. The bias adds and the bias gradients' sums run inside the products,
// on each finished rectangle of the output (BiasEpilogue) and after each expert's weight gradient
// (BiasGradEpilogue), while what they read is in cache.
// Results match running linear_forward / linear_backward per expert, bit for bit. With bf16
// operands on a CPU with 16-bit arithmetic all six products run on 16-bit copies
// (kernels::grouped_gemm_half, grouped_gemm_tn_half); the two weight gradients' bf16 kernel sums
// the depth in the float kernel's blocks, so that a split at grouped_gemm_tn_depth_block()
// whatever the rounds and pieces (moe_layer.h) stays exact, as bitwise equality over budgets
// needs.
#include "moe/experts.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/grouped_gemm.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"

namespace bagualu::moe {

using kernels::Trans;

namespace {

// The bias add of a forward-form product, as its epilogue (kernels/grouped_gemm.h): on each
// finished rectangle of out (rows, D) while it is in the computing thread's cache, out[r, c] +=
// bias_e[c] for the rows r of expert e, bias_e = bias + e * stride; then the values are stored as
// values of round_to (kernels::round_inplace) and, with half, also as their 16 bits there
// (kernels::narrow_half), all three in one pass a row (kernels::bias_round_serial). The same
// operations on every element as a pass over out after the product, without reading out again
// from memory (perf gave that pass about 2.6 ms of a step with the 64 experts of 96 of
// docs/results.md). With bias null, the rounding (and narrowing) only: the input gradient's, in
// experts_backward, instead of a read and a write of its (rows, C) floats after the product.
// rows rows of out (stride ld) from out on, w values each: += b (may be null), rounded to d and,
// with half (the same stride), narrowed into it (kernels::bias_round_serial).
void bias_round_rows(float* out, uint16_t* half, const float* b, int64_t rows, size_t w, int ld,
                     Dtype d) {
    for (int64_t r = 0; r < rows; ++r) {
        kernels::bias_round_serial(out + r * ld, b, w, d, half ? half + r * ld : nullptr);
    }
}

struct BiasEpilogue {
    float* out;
    const float* bias;
    size_t stride;
    const int32_t* offsets;
    int D;
    Dtype round_to = Dtype::float32;
    uint16_t* half = nullptr;

    void operator()(int g, int i0, int i1, int j0, int j1) const {
        const float* b  = bias ? bias + static_cast<size_t>(g) * stride + j0 : nullptr;
        const int64_t o = (int64_t{offsets[g]} + i0) * D + j0;
        bias_round_rows(out + o, half ? half + o : nullptr, b, i1 - i0,
                        static_cast<size_t>(j1 - j0), D, round_to);
    }
};

// dbias_e (D) += sum over expert e's rows of dout (rows, D), dbias_e = dbias + e * stride.
// Each column is summed in double over the rows in order, as linear_backward sums its bias
// gradient, then added once (kernels::add_col_sums); with acc (E, acc_ld) the sums continue
// there instead. dout: floats, or the bf16 bits of values of bf16 (the same sums). Allocates
// nothing: the epilogue runs on whichever thread finished the expert's first rectangle.
template <typename T>
void expert_bias_grad(float* dbias, size_t stride, const T* dout, const int32_t* offsets, int e,
                      int D, double* acc, int acc_ld) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) return;
    const T* x = dout + int64_t{offsets[e]} * D;
    if (!acc) {
        kernels::add_col_sums(dbias + static_cast<size_t>(e) * stride, x, n, D, D);
        return;
    }
    double* s = acc + static_cast<size_t>(e) * static_cast<size_t>(acc_ld);
    if constexpr (std::is_same_v<T, float>) {
        kernels::col_sums_f64(s, x, n, D, D);
    } else {
        kernels::col_sums_f64_bf16(s, x, n, D, D);
    }
}

// The bias gradients as the weight gradient's epilogue (kernels/grouped_gemm.h): expert g's on
// the rectangle at (0, 0) of its weight gradient, which every expert with rows has once, on the
// thread that computed it, right after the product read that expert's rows of dout (in place,
// where the product is in float), so they are summed from cache rather than in a pass over all
// of dout afterwards. The same sums as that pass.
// dout: floats, or the bf16 bits of values of bf16 (the products' 16-bit operand).
template <typename T>
struct BiasGradEpilogue {
    float* dbias;
    size_t stride;
    const T* dout;
    const int32_t* offsets;
    int D;
    double* acc;
    int acc_ld;

    void operator()(int g, int i0, int /*i1*/, int j0, int /*j1*/) const {
        if (i0 == 0 && j0 == 0) expert_bias_grad(dbias, stride, dout, offsets, g, D, acc, acc_ld);
    }
};

// Expert rows from r0 on of the experts' input x (rows of C values), as a product takes them:
// the tokens' rows through x_rows where given, else x's own rows from r0.
template <typename T>
struct InputRows {
    const T* x;
    const int32_t* rows;
};
template <typename T>
InputRows<T> input_rows(const T* x, const int32_t* x_rows, size_t r0, int C) {
    return x_rows ? InputRows<T>{x, x_rows + r0} : InputRows<T>{x + r0 * size_t(C), nullptr};
}

bool g_whole_experts = true;  // set_whole_experts

// The 16-bit experts run whole keep their (rows, F) 16-bit arrays in the first half of a
// (rows, F) float scratch's bytes, and each thread's float rows for one expert in its share of
// the second half: floats a thread (a multiple of 16, so that shares start on cache lines).
size_t whole_share(size_t rf) {
    return rf / 2 / static_cast<size_t>(compute_pool().size()) / 16 * 16;
}
float* whole_scratch(float* base, size_t rf, int thread) {
    return base + (rf + 1) / 2 + size_t(thread) * whole_share(rf);
}

// Whether the experts' rows suit running each expert whole on one thread: groups that suit it
// (kernels::whole_groups_suit: many, none large), and the largest expert's (rows, F) floats, one
// intermediate of its chain, within half of L2, so that they are still in cache for the next
// product, and within max_floats. (8 experts of 512 rows by 768, 1.5 MB each, took the bf16
// default.toml's experts 0-12% longer whole than in passes on the AVX2 kernels:
// docs/results.md.)
bool experts_suit_whole(int E, const int32_t* offsets, int F,
                        size_t max_floats = std::numeric_limits<size_t>::max()) {
    if (!kernels::whole_groups_suit(E, offsets)) return false;
    int most = 0;
    for (int e = 0; e < E; ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
    const size_t floats = size_t(most) * size_t(F);
    return floats * sizeof(float) <= kernels::cache_sizes().l2 / 2 && floats <= max_floats;
}

// Whether the experts run whole, one thread each (kernels::for_each_group): their products in
// float32 with float32 outputs, on experts that suit it.
bool whole_experts(const ExpertPrecision& prec, int E, const int32_t* offsets, int F) {
    return g_whole_experts && prec.gemm == Dtype::float32 && prec.act == Dtype::float32 &&
           experts_suit_whole(E, offsets, F);
}

// The same for the 16-bit products (kernels::half_products_convert): bf16 operands and
// activations, float weights the bf16 kernel packs itself (kernels::grouped_gemm_bf16_float_b),
// rows from 0, and an expert's float scratch (its rows of F floats) within its thread's share
// of the second half of the (rows, F) float scratch, whose first half holds the 16-bit rows
// (whole_scratch).
bool whole_experts_16(const ExpertPrecision& prec, int E, const int32_t* offsets, int F) {
    return g_whole_experts && prec.gemm == Dtype::bfloat16 && prec.act == Dtype::bfloat16 &&
           kernels::half_products_convert(prec.gemm) && kernels::grouped_gemm_bf16_float_b() &&
           offsets[0] == 0 &&
           experts_suit_whole(E, offsets, F, whole_share(size_t(offsets[E]) * size_t(F)));
}

}  // namespace

void set_whole_experts(bool on) { g_whole_experts = on; }

bool experts_run_whole(const ExpertPrecision& prec, int E, const int32_t* offsets, int F) {
    return whole_experts(prec, E, offsets, F) || whole_experts_16(prec, E, offsets, F);
}

void experts_forward(float* y, const kernels::KeptArray& h, float* g, const float* x,
                     const ExpertWeights& w, const int32_t* offsets, int E, int C, int F,
                     const ExpertPrecision& prec, const int32_t* x_rows, uint16_t* y16) {
    const int64_t rows = offsets[E];
    const size_t RF    = static_cast<size_t>(rows * F);
    BGL_CHECK((h.half != nullptr) != (h.f32 != nullptr) && (!h.half || prec.act != Dtype::float32),
              "experts_forward: the hidden is kept in float32 or in 16 bits of a half act dtype");
    BGL_CHECK(!y16 || prec.act != Dtype::float32,
              "experts_forward: a 16-bit copy of the output needs a half act dtype");
    if (whole_experts(prec, E, offsets, F)) {
        // each expert's two products and GELU on one thread, h_e and g_e in its cache
        const BiasEpilogue fc_bias{h.f32, w.fc_b, w.fc_b_stride, offsets, F};
        const BiasEpilogue proj_bias{y, w.proj_b, w.proj_b_stride, offsets, C};
        kernels::for_each_group(E, offsets, 2.0 * C * F, [&](int e, int) {
            const size_t r0 = static_cast<size_t>(offsets[e]), ex = static_cast<size_t>(e);
            const int n   = offsets[e + 1] - offsets[e];
            float* he     = h.f32 + r0 * F;
            float* ge     = g + r0 * F;
            const auto in = input_rows(x, x_rows, r0, C);
            kernels::group_gemm_f32(Trans::N, Trans::T, n, F, C, 1.0f, in.x, C, in.rows,
                                    w.fc_w + ex * w.fc_w_stride, C, 0.0f, he, F);
            fc_bias(e, 0, n, 0, F);
            kernels::gelu_forward_serial(ge, he, static_cast<size_t>(n) * F, prec.fp64);
            kernels::group_gemm_f32(Trans::N, Trans::T, n, C, F, 1.0f, ge, F, nullptr,
                                    w.proj_w + ex * w.proj_w_stride, F, 0.0f, y + r0 * C, C);
            proj_bias(e, 0, n, 0, C);
        });
        return;
    }
    if (whole_experts_16(prec, E, offsets, F)) {
        // each expert on one thread: the tokens narrowed once for all of them (read through
        // x_rows), then per expert h in float (kept, or in the thread's scratch) narrowed into
        // the kept 16 bits, g's 16 bits in g's first half, and y
        const uint16_t* x16 = kernels::narrow_operand_rows(prec.gemm, x, C, static_cast<size_t>(C),
                                                           offsets, E, x_rows);
        auto* g16           = reinterpret_cast<uint16_t*>(g);
        const BiasEpilogue proj_bias{y, w.proj_b, w.proj_b_stride, offsets, C, prec.act, y16};
        kernels::for_each_group(E, offsets, 2.0 * C * F, [&](int e, int thread) {
            const size_t r0 = static_cast<size_t>(offsets[e]), ex = static_cast<size_t>(e);
            const int n   = offsets[e + 1] - offsets[e];
            float* he     = h.f32 ? h.f32 + r0 * F : whole_scratch(g, RF, thread);
            const auto in = input_rows(reinterpret_cast<const bf16*>(x16), x_rows, r0, C);
            kernels::group_gemm_bf16(Trans::N, Trans::T, n, F, C, 1.0f, in.x, C, in.rows,
                                     w.fc_w + ex * w.fc_w_stride, C, 0.0f, he, F);
            bias_round_rows(he, h.half ? h.half + r0 * F : nullptr, w.fc_b + ex * w.fc_b_stride, n,
                            static_cast<size_t>(F), F, prec.act);
            const kernels::KeptArray he_kept =
                h.half ? h.rows_from(r0, static_cast<size_t>(F)) : kernels::KeptArray{he, nullptr};
            kernels::gelu_forward_narrow_serial(prec.gemm, g16 + r0 * F, prec.act, he_kept,
                                                static_cast<size_t>(n) * F, prec.fp64);
            kernels::group_gemm_bf16(Trans::N, Trans::T, n, C, F, 1.0f,
                                     reinterpret_cast<const bf16*>(g16 + r0 * F), F, nullptr,
                                     w.proj_w + ex * w.proj_w_stride, F, 0.0f, y + r0 * C, C);
            proj_bias(e, 0, n, 0, C);
        });
        return;
    }
    // h (rows, F) = x_e (rows_e, C) @ fc_w_e^T (C, F) + fc_b_e: into h, or for a 16-bit h into
    // g, narrowed from there
    float* hf = h.half ? g : h.f32;
    const BiasEpilogue fc_bias{hf, w.fc_b, w.fc_b_stride, offsets, F, prec.act, h.half};
    kernels::grouped_gemm_half(prec.gemm, Trans::T, E, offsets, F, C, x, C, w.fc_w, C,
                               w.fc_w_stride, hf, F, x_rows, fc_bias);
    const BiasEpilogue proj_bias{y, w.proj_b, w.proj_b_stride, offsets, C, prec.act, y16};
    // y (rows, C) = g_e (rows_e, F) @ proj_w_e^T (F, C) + proj_b_e, g = gelu(h): where the
    // products convert, g only as the 16-bit operand, formed in g's own storage from h (a
    // 16-bit h is read rather than hf, the same values, which its 16 bits overwrite)
    if (kernels::half_products_convert(prec.gemm)) {
        auto* g16 = reinterpret_cast<uint16_t*>(g);
        kernels::gelu_forward_narrow(prec.gemm, g16, prec.act,
                                     h.half ? h : kernels::KeptArray{hf, nullptr}, RF, prec.fp64);
        kernels::grouped_gemm_half(prec.gemm, Trans::T, E, offsets, C, F, g16, F, w.proj_w, F,
                                   w.proj_w_stride, y, C, proj_bias);
    } else {
        kernels::gelu_forward_kept(prec.act, g, {hf, nullptr}, RF, prec.fp64, prec.gemm);
        kernels::grouped_gemm_half(prec.gemm, Trans::T, E, offsets, C, F, g, F, w.proj_w, F,
                                   w.proj_w_stride, y, C, nullptr, proj_bias);
    }
}

bool experts_gather_dy(const ExpertPrecision& prec) {
    return kernels::half_products_convert(prec.gemm);
}

void experts_backward(float* dx, float* dh, ExpertGrads& dw, float* dy, const float* x,
                      const kernels::KeptArray& h, const ExpertWeights& w, const int32_t* offsets,
                      int E, int C, int F, const ExpertPrecision& prec, double* bias_acc,
                      const int32_t* x_rows, const int32_t* dy_rows, const float* dy_scale) {
    const int64_t rows = offsets[E];
    BGL_CHECK(!dy_rows || (dy_scale && experts_gather_dy(prec) && offsets[0] == 0),
              "experts_backward: a gathered output gradient needs its scales, from row 0, and "
              "products that narrow it themselves");
    // bias_acc rows: (F) fc_b then (C) proj_b
    double *acc_fc = bias_acc, *acc_proj = bias_acc ? bias_acc + F : nullptr;
    const size_t RF = static_cast<size_t>(rows * F), RC = static_cast<size_t>(rows * C);
    // dx rounded to prec.act as its product's epilogue (nothing to do in float32)
    const BiasEpilogue round_dx{dx, nullptr, 0, offsets, C, prec.act};
    const kernels::GroupEpilogue dx_round =
        prec.act == Dtype::float32 ? kernels::GroupEpilogue{} : kernels::GroupEpilogue{round_dx};
    if (whole_experts_16(prec, E, offsets, F)) {
        // each expert's chain on one thread: its rows of dy narrowed (formed from the tokens'
        // with dy_rows), g's and then dh's 16 bits in dh's first half, dg in the thread's
        // float scratch; the tokens narrowed once for all experts
        uint16_t* dy16      = kernels::dout16_scratch(prec.gemm, RC);
        const uint16_t* x16 = kernels::narrow_operand_rows(prec.gemm, x, C, static_cast<size_t>(C),
                                                           offsets, E, x_rows);
        auto* gh16          = reinterpret_cast<uint16_t*>(dh);
        const BiasGradEpilogue<uint16_t> proj_b{dw.proj_b, dw.proj_b_stride, dy16, offsets,
                                                C,         acc_proj,         F + C};
        const BiasGradEpilogue<uint16_t> fc_b{dw.fc_b, dw.fc_b_stride, gh16, offsets,
                                              F,       acc_fc,         F + C};
        kernels::for_each_group(E, offsets, 4.0 * C * F, [&](int e, int thread) {
            const size_t r0 = static_cast<size_t>(offsets[e]), ex = static_cast<size_t>(e);
            const int n     = offsets[e + 1] - offsets[e];
            const size_t nf = static_cast<size_t>(n) * F;
            uint16_t* dye   = dy16 + r0 * C;
            if (dy_rows) {
                kernels::narrow_dout_rows_serial(prec.gemm, dye, dy, dy_rows + r0, dy_scale + r0,
                                                 static_cast<size_t>(n), C);
            } else {
                kernels::narrow_half_serial(prec.gemm, dye, dy + r0 * C,
                                            static_cast<size_t>(n) * C);
            }
            uint16_t* ghe               = gh16 + r0 * F;
            const kernels::KeptArray he = h.rows_from(r0, static_cast<size_t>(F));
            kernels::gelu_forward_narrow_serial(prec.gemm, ghe, prec.act, he, nf, prec.fp64);
            const auto* dyb = reinterpret_cast<const bf16*>(dye);
            kernels::group_gemm_tn_bf16(C, F, n, 1.0f, dyb, C, reinterpret_cast<const bf16*>(ghe),
                                        F, nullptr, 1.0f, dw.proj_w + ex * dw.proj_w_stride, F);
            proj_b(e, 0, C, 0, F);
            float* dg = whole_scratch(dh, RF, thread);
            kernels::group_gemm_bf16(Trans::N, Trans::N, n, F, C, 1.0f, dyb, C, nullptr,
                                     w.proj_w + ex * w.proj_w_stride, F, 0.0f, dg, F);
            kernels::gelu_backward_dout_serial(prec.gemm, ghe, prec.act, he, dg, nf, prec.fp64);
            fc_b(e, 0, F, 0, C);
            const auto* dhb = reinterpret_cast<const bf16*>(ghe);
            const auto in   = input_rows(reinterpret_cast<const bf16*>(x16), x_rows, r0, C);
            kernels::group_gemm_tn_bf16(F, C, n, 1.0f, dhb, F, in.x, C, in.rows, 1.0f,
                                        dw.fc_w + ex * dw.fc_w_stride, C);
            kernels::group_gemm_bf16(Trans::N, Trans::N, n, C, F, 1.0f, dhb, F, nullptr,
                                     w.fc_w + ex * w.fc_w_stride, C, 0.0f, dx + r0 * C, C);
            if (dx_round) dx_round(e, 0, n, 0, C);
        });
        return;
    }
    if (kernels::half_products_convert(prec.gemm)) {
        // The output gradients only as the products' 16-bit operands: dy narrowed once (for
        // dproj_b_e (C) += sum dy_e as the weight gradient's epilogue, and both products); g =
        // gelu(h) again, as forward made it, as its 16 bits in dh's storage; dproj_w_e (C, F) +=
        // dy_e^T g_e, then dg (rows, F) = dy_e proj_w_e into dh (g is no longer needed); dh =
        // dg gelu'(h) formed as its 16 bits, never as floats; dfc_w_e (F, C) += dh_e^T x_e, then
        // dx (rows, C) = dh_e fc_w_e, dfc_b_e (F) += sum dh_e as the epilogue.
        const uint16_t* dy16 = dy_rows ? kernels::narrow_dout_rows(prec.gemm, dy, dy_rows, dy_scale,
                                                                   static_cast<size_t>(rows), C)
                                       : kernels::narrow_dout(prec.gemm, dy, RC);
        const BiasGradEpilogue<uint16_t> proj_b{dw.proj_b, dw.proj_b_stride, dy16, offsets,
                                                C,         acc_proj,         F + C};
        auto* g16 = reinterpret_cast<uint16_t*>(dh);
        kernels::gelu_forward_narrow(prec.gemm, g16, prec.act, h, RF, prec.fp64);
        kernels::grouped_linear_backward_dout16(prec.gemm, E, offsets, C, F, dh, dw.proj_w,
                                                dw.proj_w_stride, dy16, nullptr, nullptr, g16,
                                                w.proj_w, w.proj_w_stride, proj_b);
        const uint16_t* dh16 =
            kernels::gelu_backward_dout(prec.gemm, prec.act, h, dh, RF, prec.fp64);
        const BiasGradEpilogue<uint16_t> fc_b{dw.fc_b, dw.fc_b_stride, dh16, offsets,
                                              F,       acc_fc,         F + C};
        kernels::grouped_linear_backward_dout16(prec.gemm, E, offsets, F, C, dx, dw.fc_w,
                                                dw.fc_w_stride, dh16, x, x_rows, nullptr, w.fc_w,
                                                w.fc_w_stride, fc_b, dx_round);
        return;
    }
    if (whole_experts(prec, E, offsets, F)) {
        // each expert's chain below on one thread, its rows of dy, g, dg and dh in its cache
        const BiasGradEpilogue<float> proj_b{dw.proj_b, dw.proj_b_stride, dy,   offsets,
                                             C,         acc_proj,         F + C};
        const BiasGradEpilogue<float> fc_b{dw.fc_b, dw.fc_b_stride, dh, offsets, F, acc_fc, F + C};
        kernels::for_each_group(E, offsets, 4.0 * C * F, [&](int e, int) {
            const size_t r0 = static_cast<size_t>(offsets[e]), ex = static_cast<size_t>(e);
            const int n      = offsets[e + 1] - offsets[e];
            const size_t nf  = static_cast<size_t>(n) * F;
            const float* he  = h.f32 + r0 * F;
            const float* dye = dy + r0 * C;
            float* dhe       = dh + r0 * F;
            kernels::gelu_forward_serial(dhe, he, nf, prec.fp64);
            kernels::group_gemm_tn_f32(C, F, n, 1.0f, dye, C, dhe, F, nullptr, 1.0f,
                                       dw.proj_w + ex * dw.proj_w_stride, F);
            proj_b(e, 0, C, 0, F);
            kernels::group_gemm_f32(Trans::N, Trans::N, n, F, C, 1.0f, dye, C, nullptr,
                                    w.proj_w + ex * w.proj_w_stride, F, 0.0f, dhe, F);
            kernels::gelu_backward_serial(dhe, he, dhe, nf, prec.fp64);
            const auto in = input_rows(x, x_rows, r0, C);
            kernels::group_gemm_tn_f32(F, C, n, 1.0f, dhe, F, in.x, C, in.rows, 1.0f,
                                       dw.fc_w + ex * dw.fc_w_stride, C);
            fc_b(e, 0, F, 0, C);
            kernels::group_gemm_f32(Trans::N, Trans::N, n, C, F, 1.0f, dhe, F, nullptr,
                                    w.fc_w + ex * w.fc_w_stride, C, 0.0f, dx + r0 * C, C);
        });
        return;
    }
    kernels::round_inplace(dy, RC, prec.gemm);
    // g = gelu(h) again, as forward made it, into dh, rounded as the products' operand;
    // dproj_w_e (C, F) += dy_e^T (C, rows_e) @ g_e (rows_e, F), then dg (rows, F) = dy_e (rows_e,
    // C) @ proj_w_e (C, F) into dh (g is no longer needed); dproj_b_e (C) += sum dy_e, as the
    // weight gradient's epilogue
    const BiasGradEpilogue<float> proj_b{dw.proj_b, dw.proj_b_stride, dy,   offsets,
                                         C,         acc_proj,         F + C};
    float* g = dh;
    kernels::gelu_forward_kept(prec.act, g, h, RF, prec.fp64, prec.gemm);
    kernels::grouped_linear_backward_half(prec.gemm, E, offsets, C, F, dh, dw.proj_w,
                                          dw.proj_w_stride, dy, g, nullptr, w.proj_w,
                                          w.proj_w_stride, proj_b);
    kernels::gelu_backward_kept(prec.act, dh, h, dh, RF, prec.fp64, prec.gemm);
    // dfc_w_e (F, C) += dh_e^T (F, rows_e) @ x_e (rows_e, C), then dx (rows, C) = dh_e (rows_e, F)
    // @ fc_w_e (F, C); dfc_b_e (F) += sum dh_e, as the weight gradient's epilogue
    const BiasGradEpilogue<float> fc_b{dw.fc_b, dw.fc_b_stride, dh, offsets, F, acc_fc, F + C};
    kernels::grouped_linear_backward_half(prec.gemm, E, offsets, F, C, dx, dw.fc_w, dw.fc_w_stride,
                                          dh, x, x_rows, w.fc_w, w.fc_w_stride, fc_b, dx_round);
}

void experts_bias_grad_flush(ExpertGrads& dw, const double* bias_acc, const uint8_t* had_rows,
                             int E, int C, int F) {
    for (int e = 0; e < E; ++e) {
        if (!had_rows[e]) continue;
        const double* a = bias_acc + static_cast<size_t>(e) * static_cast<size_t>(F + C);
        float* fb       = dw.fc_b + static_cast<size_t>(e) * dw.fc_b_stride;
        float* pb       = dw.proj_b + static_cast<size_t>(e) * dw.proj_b_stride;
        for (int c = 0; c < F; ++c) fb[c] = float(double(fb[c]) + a[c]);
        for (int c = 0; c < C; ++c) pb[c] = float(double(pb[c]) + a[F + c]);
    }
}

}  // namespace bagualu::moe

// Tests for kernels/mixed.h: rounding to bf16 / fp16, the bf16 linear layers, and every FP64
// sensitive kernel against its float32 namesake (kernels/ops.h) and against the scalar oracle
// (kernels/ref/ops_ref.h, double inside) on ragged shapes.
#include "kernels/mixed.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include "core/rng.h"
#pragma GCC diagnostic pop
#include "isa_params.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace bagualu::kernels {
namespace {

std::vector<float> randn(Rng& rng, size_t n, double scale = 1.0) {
    std::vector<float> x(n);
    for (auto& v : x) v = float(scale * rng.normal());
    return x;
}

// max_i |got_i - want_i| / (1 + |want_i|)
double max_err(const std::vector<float>& got, const std::vector<float>& want) {
    EXPECT_EQ(got.size(), want.size());
    double m = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(got[i]) - double(want[i])) / (1.0 + std::fabs(want[i]));
        if (!(e <= m)) m = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
    }
    return m;
}

// Tolerances. The float32 kernels evaluate exp/tanh in float (< 2 ulp) and combine in float, so
// they sit within a few 1e-7 of the exact result per element; sums over up to a few hundred
// terms lose at most ~1e-6. kF32: FP64 path vs float32 path. kRef: FP64 path vs the double
// oracle, which differ only in summation order before the final rounding to float.
constexpr double kF32 = 2e-5;
constexpr double kRef = 1e-6;

TEST(Rounding, Bf16AndFp16Values) {
    // bf16 above 1.0: 7 fraction bits, one ulp = 1/128
    EXPECT_EQ(round_to(Dtype::bfloat16, 1.0f + 2.0f / 512), 1.0f);  // half an ulp: to even
    EXPECT_EQ(round_to(Dtype::bfloat16, 1.0f + 6.0f / 512), 1.0f + 1.0f / 64);  // 1.5 ulp: to even
    EXPECT_EQ(round_to(Dtype::bfloat16, 1.0f + 3.0f / 512), 1.0f + 1.0f / 128);
    EXPECT_EQ(round_to(Dtype::float16, 1.0f + 1.0f / 4096), 1.0f);
    EXPECT_EQ(round_to(Dtype::float16, 65504.0f), 65504.0f);
    EXPECT_TRUE(std::isinf(round_to(Dtype::float16, 70000.0f)));
    EXPECT_EQ(round_to(Dtype::float16, 1e-8f), 0.0f);  // below half the smallest subnormal
    EXPECT_EQ(round_to(Dtype::float32, 0.1f), 0.1f);
    std::vector<float> x = {0.1f, -3.3f, 1e-3f, 12345.678f};
    std::vector<float> y(x.size());
    round_copy(y.data(), x.data(), x.size(), Dtype::bfloat16);
    round_inplace(x.data(), x.size(), Dtype::bfloat16);
    EXPECT_EQ(x, y);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bf16_to_float(bf16_from_float(x[i])), x[i]);
}

// Activations of a half type kept in 16 bits: narrow_half is exact on them, and the GELU of the
// 16-bit values is bit for bit the float kernels' on the widened values, over many of the
// threads' blocks, the aliased narrowing's slices and a ragged tail, FP64 versions included;
// dinp may alias dout, and gelu_forward_narrow's 16 bits may overwrite its float input.
TEST(HalfActivations, NarrowIsExactAndGeluMatchesTheFloatKernels) {
    Rng rng(21);
    const size_t n = 3 * (size_t{1} << 16) + 123;
    for (const Dtype d : {Dtype::bfloat16, Dtype::float16}) {
        std::vector<float> x = randn(rng, n, 2.0), dy = randn(rng, n);
        round_inplace(x.data(), n, d);
        std::vector<uint16_t> x16(n);
        narrow_half(d, x16.data(), x.data(), n);
        std::vector<float> back(n);
        from_half(d, x16.data(), back.data(), n);
        EXPECT_EQ(back, x) << dtype_name(d);
        for (const bool fp64 : {false, true}) {
            std::vector<float> want(n), got(n), dwant(n), dgot = dy;
            (fp64 ? gelu_forward_f64 : gelu_forward)(want.data(), x.data(), n);
            gelu_forward_kept(d, got.data(), {nullptr, x16.data()}, n, fp64);
            EXPECT_EQ(got, want) << dtype_name(d) << " fp64 " << fp64;
            (fp64 ? gelu_backward_f64 : gelu_backward)(dwant.data(), x.data(), dy.data(), n);
            gelu_backward_kept(d, dgot.data(), {nullptr, x16.data()}, dgot.data(), n, fp64);
            EXPECT_EQ(dgot, dwant) << dtype_name(d) << " fp64 " << fp64;
            // the input gradient stored as values of d: the float kernel's, rounded; from a
            // float x as from its 16 bits
            std::vector<float> dround = dwant, dgot32(n);
            round_inplace(dround.data(), n, d);
            for (const KeptArray kept : {KeptArray{nullptr, x16.data()}, KeptArray{x.data()}}) {
                gelu_backward_kept(d, dgot32.data(), kept, dy.data(), n, fp64, d);
                EXPECT_EQ(dgot32, dround) << dtype_name(d) << " fp64 " << fp64;
            }
            // the output stored as values of d: the float kernel's, rounded; from the 16-bit x,
            // from the float x, and over the float x itself
            std::vector<float> round_want = want, rgot(n);
            round_inplace(round_want.data(), n, d);
            for (const KeptArray kept : {KeptArray{nullptr, x16.data()}, KeptArray{x.data()}}) {
                gelu_forward_kept(d, rgot.data(), kept, n, fp64, d);
                EXPECT_EQ(rgot, round_want) << dtype_name(d) << " fp64 " << fp64;
            }
            rgot = x;
            gelu_forward_kept(d, rgot.data(), {rgot.data()}, n, fp64, d);
            EXPECT_EQ(rgot, round_want) << dtype_name(d) << " fp64 " << fp64;
            // the 16 bits of the GELU's output rounded to d, from the 16-bit x, from the float
            // x, and written over the float x itself
            std::vector<uint16_t> want16(n), got16(n);
            narrow_half(d, want16.data(), want.data(), n);
            gelu_forward_narrow(d, got16.data(), d, {nullptr, x16.data()}, n, fp64);
            EXPECT_EQ(got16, want16) << dtype_name(d) << " fp64 " << fp64;
            std::fill(got16.begin(), got16.end(), uint16_t{0});
            gelu_forward_narrow(d, got16.data(), d, {x.data()}, n, fp64);
            EXPECT_EQ(got16, want16) << dtype_name(d) << " fp64 " << fp64;
            std::vector<float> over = x;
            auto* over16            = reinterpret_cast<uint16_t*>(over.data());
            gelu_forward_narrow(d, over16, d, {over.data()}, n, fp64);
            EXPECT_TRUE(std::equal(want16.begin(), want16.end(), over16))
                << dtype_name(d) << " fp64 " << fp64;
        }
    }
}

// A layernorm's output kept only as its 16 bits (layernorm_forward_narrow) is bitwise the float
// kernel's output narrowed, with the same mean and rstd: both half dtypes, both precisions, on
// every kernel table; rows ragged around the per-thread blocks (2048 / C rows) and widths around
// the vector lengths.
class LayernormNarrow : public testing::IsaTest {};

TEST_P(LayernormNarrow, IsTheFloatOutputNarrowed) {
    Rng rng(41);
    for (const int C : {1, 100, 771}) {
        const int N  = 137;
        const auto x = randn(rng, size_t(N) * C, 3.0), w = randn(rng, C), b = randn(rng, C);
        for (const Dtype d : {Dtype::bfloat16, Dtype::float16}) {
            for (const bool fp64 : {false, true}) {
                std::vector<float> out(x.size()), mean(N), rstd(N), mean16(N), rstd16(N);
                (fp64 ? layernorm_forward_f64 : layernorm_forward)(
                    out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
                std::vector<uint16_t> want(x.size()), got(x.size(), 0xffff);
                narrow_half(d, want.data(), out.data(), out.size());
                layernorm_forward_narrow(d, got.data(), mean16.data(), rstd16.data(), x.data(),
                                         w.data(), b.data(), N, C, fp64);
                EXPECT_EQ(got, want) << dtype_name(d) << " C=" << C << " fp64 " << fp64;
                EXPECT_EQ(mean16, mean) << dtype_name(d) << " C=" << C << " fp64 " << fp64;
                EXPECT_EQ(rstd16, rstd) << dtype_name(d) << " C=" << C << " fp64 " << fp64;
            }
        }
    }
}

BGL_INSTANTIATE_ISAS(LayernormNarrow);

// A linear layer's input kept only as its 16 bits (linear_forward_kept16 / linear_backward_kept16)
// gives the bits of the same layer on the rounded floats (linear_forward_half /
// linear_backward_half): for bf16 on 16-bit copies (the default), bf16 on the rounded floats
// where gemm_bf16 only widens (bf16_float_operands), and fp16 (always the floats).
TEST(HalfLinear, KeptSixteenBitInputIsTheRoundedFloatInput) {
    Rng rng(12, 0);
    const int N = 45, IC = 64, OC = 33;
    for (const bool force : {false, true}) {
        bf16_float_operands(!force);
        for (const Dtype d : {Dtype::bfloat16, Dtype::float16}) {
            auto x = randn(rng, size_t(N) * IC), w = randn(rng, size_t(OC) * IC),
                 b = randn(rng, OC), dy = randn(rng, size_t(N) * OC);
            for (auto* v : {&x, &w, &dy}) round_inplace(v->data(), v->size(), d);
            std::vector<uint16_t> x16(x.size());
            narrow_half(d, x16.data(), x.data(), x.size());
            std::vector<float> o1(size_t(N) * OC), o2(o1.size());
            std::vector<uint16_t> h1(o1.size()), h2(o1.size());
            linear_forward_half(d, o1.data(), x.data(), w.data(), b.data(), N, IC, OC, d,
                                h1.data());
            linear_forward_kept16(d, o2.data(), x16.data(), w.data(), b.data(), N, IC, OC, d,
                                  h2.data());
            EXPECT_EQ(o2, o1) << dtype_name(d) << " forced " << force;
            EXPECT_EQ(h2, h1) << dtype_name(d) << " forced " << force;
            std::vector<float> dx1(x.size()), dx2(x.size()), dw1(w.size(), 0.25f),
                dw2 = dw1, db1(OC, 0.5f), db2 = db1;
            linear_backward_half(d, dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(),
                                 w.data(), N, IC, OC);
            linear_backward_kept16(d, dx2.data(), dw2.data(), db2.data(), dy.data(), x16.data(),
                                   w.data(), N, IC, OC);
            EXPECT_EQ(dx2, dx1) << dtype_name(d) << " forced " << force;
            EXPECT_EQ(dw2, dw1) << dtype_name(d) << " forced " << force;
            EXPECT_EQ(db2, db1) << dtype_name(d) << " forced " << force;
        }
    }
    bf16_float_operands(false);
}

// An output gradient kept only as the products' 16 bits: narrow_dout is narrow_half, and
// gelu_backward_dout the 16 bits of gelu_backward_kept's input gradient rounded to bf16, from a
// float and from a 16-bit x, both precisions, over many blocks and a ragged tail; the linear
// layer's backward on them (linear_backward_dout16, float or 16-bit input) is bitwise
// linear_backward_half on the rounded floats. Where the products do not convert (fp16, or bf16
// on the rounded floats where gemm_bf16 only widens) both refuse.
TEST(HalfLinear, SixteenBitOutputGradientIsTheRoundedFloatOne) {
    Rng rng(14, 0);
    const Dtype d = Dtype::bfloat16;
    bf16_float_operands(false);
    const size_t n       = 2 * (size_t{1} << 14) + 77;
    std::vector<float> x = randn(rng, n, 2.0), dy = randn(rng, n);
    round_inplace(x.data(), n, d);
    std::vector<uint16_t> x16(n), want16(n);
    narrow_half(d, x16.data(), x.data(), n);
    const uint16_t* dy16 = narrow_dout(d, dy.data(), n);
    narrow_half(d, want16.data(), dy.data(), n);
    EXPECT_TRUE(std::equal(want16.begin(), want16.end(), dy16));
    {
        // narrow_dout_rows: the rows gathered from dout and scaled, rounded to float, then to
        // bf16, as narrow_dout of that copy (rows repeated and out of order, a zero scale, and
        // scales that round the products: random ones)
        const int C = 37, T = 23, R = 60;
        const auto src = randn(rng, size_t(T) * C, 3.0);
        std::vector<int32_t> rows(R);
        std::vector<float> scale = randn(rng, R), copy(size_t(R) * C);
        scale[5]                 = 0.0f;
        for (int r = 0; r < R; ++r) {
            rows[size_t(r)] = int32_t((r * 7 + 3) % T);
            for (int c = 0; c < C; ++c)
                copy[size_t(r) * C + size_t(c)] =
                    scale[size_t(r)] * src[size_t(rows[size_t(r)]) * C + size_t(c)];
        }
        std::vector<uint16_t> want(copy.size());
        narrow_half(d, want.data(), copy.data(), copy.size());
        const uint16_t* got = narrow_dout_rows(d, src.data(), rows.data(), scale.data(), R, C);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got));
        EXPECT_ANY_THROW(
            narrow_dout_rows(Dtype::float16, src.data(), rows.data(), scale.data(), R, C));
    }
    for (const bool fp64 : {false, true}) {
        std::vector<float> dwant(n);
        gelu_backward_kept(d, dwant.data(), {x.data()}, dy.data(), n, fp64, d);
        narrow_half(d, want16.data(), dwant.data(), n);
        for (const KeptArray kept : {KeptArray{nullptr, x16.data()}, KeptArray{x.data()}}) {
            const uint16_t* got = gelu_backward_dout(d, d, kept, dy.data(), n, fp64);
            EXPECT_TRUE(std::equal(want16.begin(), want16.end(), got)) << "fp64 " << fp64;
        }
    }
    const int N = 41, IC = 48, OC = 35;
    auto in = randn(rng, size_t(N) * IC), w = randn(rng, size_t(OC) * IC),
         dout = randn(rng, size_t(N) * OC);
    for (auto* v : {&in, &w, &dout}) round_inplace(v->data(), v->size(), d);
    std::vector<uint16_t> in16(in.size());
    narrow_half(d, in16.data(), in.data(), in.size());
    std::vector<float> dx1(in.size()), dw1(w.size(), 0.25f), db1(OC, 0.5f);
    linear_backward_half(d, dx1.data(), dw1.data(), db1.data(), dout.data(), in.data(), w.data(), N,
                         IC, OC);
    for (const bool as16 : {false, true}) {
        std::vector<float> dx2(in.size()), dw2(w.size(), 0.25f), db2(OC, 0.5f);
        linear_backward_dout16(d, dx2.data(), dw2.data(), db2.data(),
                               narrow_dout(d, dout.data(), dout.size()), as16 ? nullptr : in.data(),
                               as16 ? in16.data() : nullptr, w.data(), N, IC, OC);
        EXPECT_EQ(dx2, dx1) << "16-bit input " << as16;
        EXPECT_EQ(dw2, dw1) << "16-bit input " << as16;
        EXPECT_EQ(db2, db1) << "16-bit input " << as16;
    }
    bf16_float_operands(false);
    EXPECT_ANY_THROW(narrow_dout(Dtype::float16, dy.data(), n));
    EXPECT_ANY_THROW(gelu_backward_dout(Dtype::float16, Dtype::float16, {x.data()}, dy.data(), n));
    bf16_float_operands(true);
    if (!half_products_convert(d)) {
        EXPECT_ANY_THROW(narrow_dout(d, dy.data(), n));
    }
    bf16_float_operands(false);
}

TEST(HalfLinear, Bf16GemmEqualsFloatGemmOnRoundedOperands) {
    Rng rng(9, 0);
    const int N = 33, IC = 40, OC = 27;
    auto inp = randn(rng, size_t(N) * IC), w = randn(rng, size_t(OC) * IC), b = randn(rng, OC),
         dy = randn(rng, size_t(N) * OC);
    for (auto* v : {&inp, &w, &dy}) round_inplace(v->data(), v->size(), Dtype::bfloat16);
    std::vector<float> o16(size_t(N) * OC), o32(o16.size());
    linear_forward_half(Dtype::bfloat16, o16.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    linear_forward(o32.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    // products of bf16 values are exact in float: only the summation order may differ
    EXPECT_LE(max_err(o16, o32), 1e-5);
    std::vector<float> di16(inp.size()), di32(inp.size()), dw16(w.size(), 0.5f),
        dw32 = dw16, db16(OC, 0.5f), db32 = db16;
    linear_backward_half(Dtype::bfloat16, di16.data(), dw16.data(), db16.data(), dy.data(),
                         inp.data(), w.data(), N, IC, OC);
    linear_backward(di32.data(), dw32.data(), db32.data(), dy.data(), inp.data(), w.data(), N, IC,
                    OC);
    EXPECT_LE(max_err(di16, di32), 1e-5);
    EXPECT_LE(max_err(dw16, dw32), 1e-5);
    EXPECT_EQ(db16, db32);  // the same double column sums
    // float32 and fp16 are the ops.h kernels themselves
    std::vector<float> o(o32.size());
    linear_forward_half(Dtype::float16, o.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    EXPECT_EQ(o, o32);
}

// The router's FP64 linear layers round the exact result once: every float product is exact in
// double and a sum of a few hundred of them loses ~1e-14 relative, so each output is within half
// a float ulp of the long-double sum (plus that slack). Inputs with cancellation (large terms of
// both signs) make the float32 GEMM miss by many ulps, which the last check shows.
// linear_backward_half16 reads its 16-bit input for the weight gradient before it writes the
// input gradient, so the input gradient may go where the 16 bits lie (the MLP's second layer
// does that): the same bits as with separate arrays. On 16-bit operands (the default, also where
// gemm_bf16 widens).
TEST(HalfLinear, BackwardOn16BitInputMayWriteItsInputGradientOverIt) {
    bf16_float_operands(false);
    Rng rng(10, 0);
    const int N = 37, IC = 48, OC = 21;
    auto x = randn(rng, size_t(N) * IC), w = randn(rng, size_t(OC) * IC),
         dy = randn(rng, size_t(N) * OC);
    for (auto* v : {&x, &w, &dy}) round_inplace(v->data(), v->size(), Dtype::bfloat16);
    std::vector<uint16_t> x16(x.size());
    narrow_half(Dtype::bfloat16, x16.data(), x.data(), x.size());
    std::vector<float> dx(x.size()), dw(w.size(), 0.25f), db(OC, 0.5f);
    std::vector<float> dw2 = dw, db2 = db;
    linear_backward_half16(Dtype::bfloat16, dx.data(), dw.data(), db.data(), dy.data(), x16.data(),
                           w.data(), N, IC, OC);
    // the 16 bits of x at the start of the float array the input gradient is written to
    std::vector<float> shared(x.size());
    std::memcpy(shared.data(), x16.data(), x16.size() * sizeof(uint16_t));
    linear_backward_half16(Dtype::bfloat16, shared.data(), dw2.data(), db2.data(), dy.data(),
                           reinterpret_cast<const uint16_t*>(shared.data()), w.data(), N, IC, OC);
    bf16_float_operands(false);
    EXPECT_EQ(shared, dx);
    EXPECT_EQ(dw2, dw);
    EXPECT_EQ(db2, db);
}

// The LM head's backward from its logits in one call: the bits of the cross-entropy gradient in
// place, round_operand and linear_backward_half, for every dtype, both ways of forming the
// products' operands (16-bit copies or the rounded floats) and both precisions of the
// cross-entropy; V not a multiple of any vector width, values that need rounding.
TEST(HalfLinear, CrossEntropyHeadBackwardIsTheThreeCalls) {
    const int N = 23, IC = 40, V = 301;
    Rng rng(11, 0);
    auto x = randn(rng, size_t(N) * IC), w = randn(rng, size_t(V) * IC),
         logits = randn(rng, size_t(N) * V);
    for (auto& v : logits) v *= 3.f;
    std::vector<int32_t> tg(N);
    std::vector<float> dl(N);
    for (int i = 0; i < N; ++i) {
        tg[size_t(i)] = int32_t((i * 37) % V);
        dl[size_t(i)] = 1.f / float(N + i);
    }
    for (const Dtype d : {Dtype::float32, Dtype::bfloat16, Dtype::float16}) {
        auto xr = x, wr = w;
        round_inplace(xr.data(), xr.size(), d);
        round_inplace(wr.data(), wr.size(), d);
        for (const bool force : {false, true}) {
            for (const bool fp64 : {false, true}) {
                SCOPED_TRACE(::testing::Message()
                             << dtype_name(d) << " force16 " << force << " fp64 " << fp64);
                bf16_float_operands(!force);
                std::vector<float> dx(xr.size(), 7.f), dw(wr.size(), 0.25f);
                auto dx2 = dx, dw2 = dw, lg = logits, lg2 = logits;
                if (fp64) {
                    crossentropy_backward_f64(lg.data(), lg.data(), tg.data(), dl.data(), N, V);
                } else {
                    crossentropy_backward(lg.data(), lg.data(), tg.data(), dl.data(), N, V);
                }
                round_operand(lg.data(), lg.size(), d);
                linear_backward_half(d, dx.data(), dw.data(), nullptr, lg.data(), xr.data(),
                                     wr.data(), N, IC, V);
                crossentropy_linear_backward_half(d, dx2.data(), dw2.data(), lg2.data(), tg.data(),
                                                  dl.data(), xr.data(), wr.data(), N, IC, V, fp64);
                // the forward's logsumexps instead of computing them again: the same bits (the
                // FP64 backward reads none: NaNs there change nothing)
                std::vector<float> losses(N), lse(N, std::nanf(""));
                if (!fp64)
                    crossentropy_forward(losses.data(), logits.data(), tg.data(), N, V, lse.data());
                auto dx3 = dx2, dw3 = dw2, lg3 = logits;
                std::fill(dx3.begin(), dx3.end(), 7.f);
                std::fill(dw3.begin(), dw3.end(), 0.25f);
                crossentropy_linear_backward_half(d, dx3.data(), dw3.data(), lg3.data(), tg.data(),
                                                  dl.data(), xr.data(), wr.data(), N, IC, V, fp64,
                                                  lse.data());
                const bool sixteen = half_products_convert(d);
                bf16_float_operands(false);
                EXPECT_EQ(dx2, dx);
                EXPECT_EQ(dw2, dw);
                EXPECT_EQ(dx3, dx);
                EXPECT_EQ(dw3, dw);
                EXPECT_EQ(lg3, lg2);
                // the 16-bit path leaves the gradient's 16 bits over the logits' storage (rows
                // in slices of doubling length, 23 rows cut as 1, 1, 2, 4, 8, 7), the other
                // the rounded gradient as floats
                if (sixteen) {
                    std::vector<uint16_t> want16(lg.size());
                    narrow_half(Dtype::bfloat16, want16.data(), lg.data(), lg.size());
                    EXPECT_EQ(std::memcmp(lg2.data(), want16.data(), want16.size() * 2), 0);
                } else {
                    EXPECT_EQ(lg2, lg);
                }
            }
        }
    }
}

TEST(Fp64Ops, LinearRoundsTheExactSumOnce) {
    Rng rng(9, 0);
    const int N = 29, IC = 203, OC = 13;
    std::vector<float> x(size_t(N) * IC), w(size_t(OC) * IC), dy(size_t(N) * OC);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i % 7 == 0 ? 1e4 : 1.0) * rng.normal());
    for (auto& v : w) v = float(rng.normal());
    for (auto& v : dy) v = float(rng.normal());
    // within half an ulp of the long-double value, with 1e-12 relative slack for the double sum
    auto near_exact = [](float got, long double want) {
        const float f    = float(want);
        const double ulp = std::nextafter(std::fabs(f), INFINITY) - std::fabs(f);
        return std::fabs(double(got) - double(want)) <= 0.5 * ulp + 1e-12 * std::fabs(double(want));
    };
    std::vector<float> out64(size_t(N) * OC), out32(out64.size());
    linear_forward_f64(out64.data(), x.data(), w.data(), nullptr, N, IC, OC);
    linear_forward(out32.data(), x.data(), w.data(), nullptr, N, IC, OC);
    double worst32 = 0;  // the float32 path's largest error in units of the output's magnitude
    for (int t = 0; t < N; ++t) {
        for (int o = 0; o < OC; ++o) {
            long double want = 0;
            for (int i = 0; i < IC; ++i)
                want += (long double)x[size_t(t) * IC + i] * w[size_t(o) * IC + i];
            EXPECT_TRUE(near_exact(out64[size_t(t) * OC + o], want)) << t << " " << o;
            worst32 = std::max(worst32, double(std::fabs(out32[size_t(t) * OC + o] - want)) /
                                            (1e-30 + double(std::fabs(want))));
        }
    }
    EXPECT_GT(worst32, 1e-6);  // cancellation is real here: float32 accumulation misses
    std::vector<float> dx(x.size(), 7.0f), dw(w.size(), 0.25f), db(size_t(OC), 0.5f);
    linear_backward_f64(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, IC, OC);
    for (int t = 0; t < N; ++t) {
        for (int i = 0; i < IC; ++i) {
            long double want = 0;  // dx is overwritten
            for (int o = 0; o < OC; ++o)
                want += (long double)dy[size_t(t) * OC + o] * w[size_t(o) * IC + i];
            EXPECT_TRUE(near_exact(dx[size_t(t) * IC + i], want)) << t << " " << i;
        }
    }
    for (int o = 0; o < OC; ++o) {
        long double sb = 0;
        for (int t = 0; t < N; ++t) sb += dy[size_t(t) * OC + o];
        EXPECT_EQ(db[size_t(o)], 0.5f + float(sb)) << o;  // += the rounded sum
        for (int i = 0; i < IC; ++i) {
            long double want = 0;  // dw accumulates: its old 0.25 plus the rounded sum
            for (int t = 0; t < N; ++t)
                want += (long double)dy[size_t(t) * OC + o] * x[size_t(t) * IC + i];
            EXPECT_EQ(dw[size_t(o) * IC + i], 0.25f + float(want)) << o << " " << i;
        }
    }
}

TEST(Fp64Ops, Layernorm) {
    Rng rng(1, 0);
    const int N = 37, C = 53;
    const auto x = randn(rng, size_t(N) * C, 2.0), w = randn(rng, C), b = randn(rng, C),
               dy = randn(rng, size_t(N) * C);
    std::vector<float> o32(x.size()), o64(x.size()), oref(x.size()), m32(N), r32(N), m64(N), r64(N),
        mref(N), rref(N);
    layernorm_forward(o32.data(), m32.data(), r32.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_forward_f64(o64.data(), m64.data(), r64.data(), x.data(), w.data(), b.data(), N, C);
    ref::layernorm_forward(oref.data(), mref.data(), rref.data(), x.data(), w.data(), b.data(), N,
                           C);
    EXPECT_LE(max_err(o64, o32), kF32);
    EXPECT_LE(max_err(r64, r32), kF32);
    EXPECT_LE(max_err(o64, oref), kRef);
    std::vector<float> d32(x.size(), 0.5f), d64 = d32, dref = d32, dw32(C, 1), dw64 = dw32,
                                            dwref = dw32, db32(C, 1), db64 = db32, dbref = db32;
    layernorm_backward(d32.data(), dw32.data(), db32.data(), dy.data(), x.data(), w.data(),
                       m64.data(), r64.data(), N, C);
    layernorm_backward_f64(d64.data(), dw64.data(), db64.data(), dy.data(), x.data(), w.data(),
                           m64.data(), r64.data(), N, C);
    ref::layernorm_backward(dref.data(), dwref.data(), dbref.data(), dy.data(), x.data(), w.data(),
                            m64.data(), r64.data(), N, C);
    EXPECT_LE(max_err(d64, d32), kF32);
    EXPECT_LE(max_err(dw64, dw32), kF32);
    EXPECT_LE(max_err(db64, db32), kF32);
    EXPECT_LE(max_err(d64, dref), kRef);
    EXPECT_LE(max_err(dw64, dwref), kRef);
    EXPECT_LE(max_err(db64, dbref), kRef);
}

TEST(Fp64Ops, Gelu) {
    Rng rng(2, 0);
    const size_t n = 20011;
    const auto x = randn(rng, n, 3.0), dy = randn(rng, n);
    std::vector<float> o32(n), o64(n), oref(n), d32(n), d64(n), dref(n);
    gelu_forward(o32.data(), x.data(), n);
    gelu_forward_f64(o64.data(), x.data(), n);
    ref::gelu_forward(oref.data(), x.data(), n);
    EXPECT_LE(max_err(o64, o32), kF32);
    EXPECT_LE(max_err(o64, oref), kRef);
    gelu_backward(d32.data(), x.data(), dy.data(), n);
    gelu_backward_f64(d64.data(), x.data(), dy.data(), n);
    ref::gelu_backward(dref.data(), x.data(), dy.data(), n);
    EXPECT_LE(max_err(d64, d32), kF32);
    EXPECT_LE(max_err(d64, dref), kRef);
}

TEST(Fp64Ops, Attention) {
    Rng rng(3, 0);
    const int B = 2, T = 19, C = 24, NH = 3;
    const auto qkv = randn(rng, size_t(B) * T * 3 * C), dy = randn(rng, size_t(B) * T * C);
    std::vector<float> o32(size_t(B) * T * C), o64 = o32, oref = o32, l32(size_t(B) * NH * T),
                                               l64 = l32, lref = l32;
    attention_forward(o32.data(), l32.data(), qkv.data(), B, T, C, NH);
    attention_forward_f64(o64.data(), l64.data(), qkv.data(), B, T, C, NH);
    ref::attention_forward(oref.data(), lref.data(), qkv.data(), B, T, C, NH);
    EXPECT_LE(max_err(o64, o32), kF32);
    EXPECT_LE(max_err(l64, l32), kF32);
    EXPECT_LE(max_err(o64, oref), kRef);
    EXPECT_LE(max_err(l64, lref), kRef);
    std::vector<float> d32(qkv.size()), d64(qkv.size()), dref(qkv.size());
    attention_backward(d32.data(), dy.data(), qkv.data(), o64.data(), l64.data(), B, T, C, NH);
    attention_backward_f64(d64.data(), dy.data(), qkv.data(), o64.data(), l64.data(), B, T, C, NH);
    ref::attention_backward(dref.data(), dy.data(), qkv.data(), o64.data(), l64.data(), B, T, C,
                            NH);
    EXPECT_LE(max_err(d64, d32), kF32);
    EXPECT_LE(max_err(d64, dref), kRef);
}

TEST(Fp64Ops, CrossEntropy) {
    Rng rng(4, 0);
    const int N = 29, V = 301;
    const auto logits = randn(rng, size_t(N) * V, 4.0), dl = randn(rng, N);
    std::vector<int32_t> tg(N);
    for (auto& t : tg) t = int32_t(rng.below(V));
    std::vector<float> l32(N), l64(N), lref(N);
    crossentropy_forward(l32.data(), logits.data(), tg.data(), N, V);
    crossentropy_forward_f64(l64.data(), logits.data(), tg.data(), N, V);
    ref::crossentropy_forward(lref.data(), logits.data(), tg.data(), N, V);
    EXPECT_LE(max_err(l64, l32), kF32);
    EXPECT_LE(max_err(l64, lref), kRef);
    std::vector<float> d32(logits.size()), d64(logits.size()), dref(logits.size());
    crossentropy_backward(d32.data(), logits.data(), tg.data(), dl.data(), N, V);
    crossentropy_backward_f64(d64.data(), logits.data(), tg.data(), dl.data(), N, V);
    ref::crossentropy_backward(dref.data(), logits.data(), tg.data(), dl.data(), N, V);
    EXPECT_LE(max_err(d64, d32), kF32);
    EXPECT_LE(max_err(d64, dref), kRef);
}

TEST(Fp64Ops, AdamW) {
    Rng rng(5, 0);
    const size_t n = 4099;
    const auto g   = randn(rng, n, 1e-3);
    auto p32 = randn(rng, n), m32 = randn(rng, n, 1e-3), v32 = std::vector<float>(n, 1e-6f);
    auto p64 = p32, m64 = m32, v64 = v32, pref = p32, mref = m32, vref = v32;
    adamw_update(p32.data(), g.data(), m32.data(), v32.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 7);
    adamw_update_f64(p64.data(), g.data(), m64.data(), v64.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, 7);
    ref::adamw_update(pref.data(), g.data(), mref.data(), vref.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                      0.1f, 7);
    EXPECT_LE(max_err(p64, p32), kF32);
    EXPECT_LE(max_err(m64, m32), kF32);
    EXPECT_LE(max_err(v64, v32), kF32);
    EXPECT_EQ(max_err(p64, pref), 0.0);  // the same double formula, elementwise
}

TEST(Fp64Ops, AdamWScaledAndRoundedIsTheThreeCallsBitwise) {
    // adamw_update_rounded(d, fp64, ..., s) against scale_inplace(g, s), the update on the
    // master (float32 or FP64 kernel) and round_copy(param, master, n, d): the same bits for
    // bf16, fp16 and float32 copies, on a length that is threaded and leaves a ragged slice.
    Rng rng(6, 0);
    const size_t n = 3 * 4096 * 4 + 1234;
    for (Dtype d : {Dtype::bfloat16, Dtype::float16, Dtype::float32}) {
        for (bool fp64 : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(d) << (fp64 ? " fp64" : " fp32"));
            auto master = randn(rng, n, 0.05), m = randn(rng, n, 1e-3);
            std::vector<float> v(n, 1e-6f), param(n, 0.0f), param2(n, 0.0f);
            auto master2 = master, m2 = m, v2 = v;
            for (int step = 1; step <= 2; ++step) {
                const auto g  = randn(rng, n, 1e-2);
                const float s = 0.377f * float(step);
                auto gs       = g;
                scale_inplace(gs.data(), s, n);
                (fp64 ? adamw_update_f64 : adamw_update)(master.data(), gs.data(), m.data(),
                                                         v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                                         0.1f, step, 1.0f);
                round_copy(param.data(), master.data(), n, d);
                adamw_update_rounded(d, fp64, param2.data(), master2.data(), g.data(), m2.data(),
                                     v2.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, s);
            }
            EXPECT_EQ(0, std::memcmp(master.data(), master2.data(), n * sizeof(float)));
            EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), n * sizeof(float)));
            EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), n * sizeof(float)));
            EXPECT_EQ(0, std::memcmp(param.data(), param2.data(), n * sizeof(float)));
            if (d != Dtype::float32) {
                EXPECT_NE(param, master);  // the copy is rounded
            }
        }
    }
}

// adamw_update_bf16_moments against the float32 calls on the widened moments (in place:
// adamw_update / adamw_update_f64; with a master: adamw_update_rounded), then m and v rounded to
// bf16: the same bits over three steps, threaded, with a ragged last slice, on each kernel table
// (AVX-512's and AVX2's convert in their registers, the generic one a slice at a time).
class AdamWBf16Moments : public testing::IsaTest {};

TEST_P(AdamWBf16Moments, AreTheFloatUpdateRoundedBitwise) {
    Rng rng(7, 0);
    const size_t n     = 3 * 2048 * 4 + 777;
    const auto to_bf16 = [](const std::vector<float>& x) {
        std::vector<uint16_t> h(x.size());
        to_half(Dtype::bfloat16, x.data(), h.data(), x.size());
        return h;
    };
    const auto widened = [](const std::vector<uint16_t>& h) {
        std::vector<float> x(h.size());
        from_half(Dtype::bfloat16, h.data(), x.data(), h.size());
        return x;
    };
    for (bool with_master : {false, true}) {
        for (bool fp64 : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << (with_master ? "master" : "in place") << (fp64 ? " fp64" : " fp32"));
            const Dtype d = Dtype::bfloat16;  // the rounded parameter's dtype (with a master)
            auto x        = randn(rng, n, 0.05);
            std::vector<float> param(n, 0.0f);
            auto x2 = x, param2 = param;
            std::vector<float> m(n, 0.0f), v(n, 0.0f);
            std::vector<uint16_t> m16(n, 0), v16(n, 0);
            for (int step = 1; step <= 3; ++step) {
                const auto g  = randn(rng, n, 1e-2);
                const float s = 0.5f + 0.25f * float(step);
                if (with_master) {
                    adamw_update_rounded(d, fp64, param.data(), x.data(), g.data(), m.data(),
                                         v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, s);
                } else {
                    (fp64 ? adamw_update_f64 : adamw_update)(x.data(), g.data(), m.data(), v.data(),
                                                             n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                                             step, s);
                }
                m = widened(to_bf16(m));
                v = widened(to_bf16(v));
                adamw_update_bf16_moments(d, fp64, with_master ? param2.data() : x2.data(),
                                          with_master ? x2.data() : nullptr, g.data(), m16.data(),
                                          v16.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, s);
            }
            EXPECT_EQ(0, std::memcmp(x.data(), x2.data(), n * sizeof(float)));
            EXPECT_EQ(0, std::memcmp(param.data(), param2.data(), n * sizeof(float)));
            EXPECT_EQ(to_bf16(m), m16);
            EXPECT_EQ(to_bf16(v), v16);
            EXPECT_NE(m16, std::vector<uint16_t>(n, 0));  // the moments did move
        }
    }
}

BGL_INSTANTIATE_ISAS(AdamWBf16Moments);

}  // namespace
}  // namespace bagualu::kernels

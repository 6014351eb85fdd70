// Tests for the attention core on bf16 operands (kernels/avx512/attention_bf16.cpp), on AMX
// tiles and on AVX512_BF16 dot products, and its choice (kernels/mixed.h half_attention,
// attention_forward_half / attention_backward_half): against a double reference that rounds the
// operands to bf16 where the kernel does, on ragged sequence lengths and four head sizes;
// bitwise the same for any thread count; and the float kernels' bits wherever neither is used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include "core/rng.h"
#pragma GCC diagnostic pop
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "gemm_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels {
namespace {

// The product kinds: AMX tiles (the amx GEMM path's unit) and AVX512_BF16 dot products.
bool usable(bool tiles) {
    return tiles ? gemm::path_supported(gemm::Path::amx) : cpu_features().avx512_bf16;
}
const char* requirement(bool tiles) { return tiles ? "needs AMX-BF16" : "needs AVX512_BF16"; }

std::vector<float> randn(Rng& rng, size_t n) {
    std::vector<float> x(n);
    for (auto& v : x) v = float(rng.normal());
    return x;
}

// max_i |got_i - want_i| / (1 + |want_i|), NaN as infinity.
double max_err(const std::vector<float>& got, const std::vector<double>& want) {
    EXPECT_EQ(got.size(), want.size());
    double m = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(want[i]));
        if (!(e <= m)) m = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
    }
    return m;
}

double r16(double x) { return double(bf16_to_float(bf16_from_float(float(x)))); }

struct Shape {
    int B, T, C, NH;
    int hs() const { return C / NH; }
    size_t qkv() const { return size_t(B) * T * 3 * C; }
    size_t out() const { return size_t(B) * T * C; }
    size_t lse() const { return size_t(B) * NH * T; }
};

// The kernel's arithmetic in double, with the operands rounded to bf16 where it rounds them:
// scale * q (scaled in float), k, v; the probabilities as the weights of v; dout; dS in dq and
// dk; q (unscaled) in dk; p in dv. Softmax and sums exact.
struct Reference {
    std::vector<double> out, lse, dqkv;
};
Reference reference(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dy,
                    const std::vector<float>& y, const std::vector<float>& lse_in) {
    const int hs = s.hs(), T = s.T, C = s.C;
    const int64_t C3  = 3 * int64_t(C);
    const float scale = 1.f / std::sqrt(float(hs));
    Reference r{std::vector<double>(s.out()), std::vector<double>(s.lse()),
                std::vector<double>(s.qkv())};
    std::vector<double> sc(static_cast<size_t>(T)), p(static_cast<size_t>(T));
    for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
            const float* base = qkv.data() + b * T * C3 + h * hs;
            auto q            = [&](int t, int e) { return double(base[t * C3 + e]); };
            auto k            = [&](int t, int e) { return r16(base[t * C3 + C + e]); };
            auto v            = [&](int t, int e) { return r16(base[t * C3 + 2 * C + e]); };
            auto qs           = [&](int t, int e) { return r16(float(base[t * C3 + e]) * scale); };
            for (int t = 0; t < T; ++t) {
                double m = -INFINITY;
                for (int j = 0; j <= t; ++j) {
                    double d = 0;
                    for (int e = 0; e < hs; ++e) d += qs(t, e) * k(j, e);
                    sc[size_t(j)] = d;
                    m             = std::max(m, d);
                }
                double sum = 0;
                for (int j = 0; j <= t; ++j) sum += (p[size_t(j)] = std::exp(sc[size_t(j)] - m));
                const int64_t row = (int64_t(b) * T + t) * C + h * hs;
                for (int e = 0; e < hs; ++e) {
                    double o = 0;
                    for (int j = 0; j <= t; ++j) o += r16(p[size_t(j)]) * v(j, e);
                    r.out[size_t(row + e)] = o / sum;
                }
                const size_t li = (size_t(b) * s.NH + h) * T + t;
                r.lse[li]       = m + std::log(sum);
                // backward, from the given out and lse
                double D = 0;
                for (int e = 0; e < hs; ++e) D += double(dy[size_t(row + e)]) * y[size_t(row + e)];
                double* g = r.dqkv.data() + b * T * C3 + h * hs;
                for (int j = 0; j <= t; ++j) {
                    const double pj = std::exp(sc[size_t(j)] - double(lse_in[li]));
                    double dp       = 0;
                    for (int e = 0; e < hs; ++e) dp += r16(dy[size_t(row + e)]) * v(j, e);
                    const double ds = r16(pj * (dp - D) * scale);
                    for (int e = 0; e < hs; ++e) {
                        g[t * C3 + e] += ds * k(j, e);
                        g[j * C3 + C + e] += ds * r16(q(t, e));
                        g[j * C3 + 2 * C + e] += r16(pj) * r16(dy[size_t(row + e)]);
                    }
                }
            }
        }
    }
    return r;
}

// Tolerances, relative to 1 + |want|. The reference rounds the same operands to bf16, but
// from its double exponentials and sums where the kernel has float ones: a probability (or an
// element of dS) a hair from a bf16 rounding boundary can round the other way, one bf16 ulp
// (2^-8 relative) on one term of a sum of up to T terms, and the tile products' float sums
// add ~1e-7. Seen on these shapes: forward <= 1.4e-7, backward <= 6.2e-4 (dS near its
// boundaries). A causal limit one key too far, or dV summed over 16 keys too few, gives 0.3 and
// more.
constexpr double kForward  = 1e-3;
constexpr double kBackward = 5e-3;

class AttentionBf16 : public ::testing::TestWithParam<std::tuple<bool, Shape>> {};

std::string case_name(const ::testing::TestParamInfo<std::tuple<bool, Shape>>& info) {
    const bool tiles = std::get<0>(info.param);
    const Shape s    = std::get<1>(info.param);
    return std::string(tiles ? "tiles" : "dots") + "_T" + std::to_string(s.T) + "_hs" +
           std::to_string(s.hs());
}

TEST_P(AttentionBf16, MatchesTheRoundedOperandReference) {
    const auto [tiles, s] = GetParam();
    if (!usable(tiles)) GTEST_SKIP() << requirement(tiles);
    Rng rng(11, uint64_t(s.T * 131 + s.C));
    const auto qkv = randn(rng, s.qkv()), dy = randn(rng, s.out());
    std::vector<float> out(s.out()), lse(s.lse()), dqkv(s.qkv(), -1.f);
    avx512::attention_forward_bf16(tiles, out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    avx512::attention_backward_bf16(tiles, dqkv.data(), dy.data(), qkv.data(), out.data(),
                                    lse.data(), s.B, s.T, s.C, s.NH);
    const Reference r = reference(s, qkv, dy, out, lse);
    EXPECT_LE(max_err(out, r.out), kForward);
    EXPECT_LE(max_err(lse, r.lse), kForward);
    EXPECT_LE(max_err(dqkv, r.dqkv), kBackward);
}

TEST_P(AttentionBf16, SameBitsForAnyThreadCount) {
    const auto [tiles, s] = GetParam();
    if (!usable(tiles)) GTEST_SKIP() << requirement(tiles);
    Rng rng(12, uint64_t(s.T));
    const auto qkv = randn(rng, s.qkv()), dy = randn(rng, s.out());
    std::vector<float> out[2], lse[2], dqkv[2];
    for (int i = 0; i < 2; ++i) {
        set_compute_threads(i + 1);
        out[i].assign(s.out(), 0.f);
        lse[i].assign(s.lse(), 0.f);
        dqkv[i].assign(s.qkv(), 0.f);
        avx512::attention_forward_bf16(tiles, out[i].data(), lse[i].data(), qkv.data(), s.B, s.T,
                                       s.C, s.NH);
        avx512::attention_backward_bf16(tiles, dqkv[i].data(), dy.data(), qkv.data(), out[i].data(),
                                        lse[i].data(), s.B, s.T, s.C, s.NH);
    }
    set_compute_threads(0);
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(lse[0], lse[1]);
    EXPECT_EQ(dqkv[0], dqkv[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionBf16,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(Shape{2, 1, 64, 2}, Shape{1, 31, 64, 2},
                                         Shape{2, 32, 64, 1}, Shape{1, 33, 96, 3},
                                         Shape{2, 77, 128, 2}, Shape{1, 130, 256, 2})),
    case_name);

// The two kinds compute the same thing in different orders of float sums: close, not equal.
TEST(AttentionBf16Kinds, TilesAndDotsAgree) {
    if (!usable(true) || !usable(false)) GTEST_SKIP() << "needs AMX-BF16 and AVX512_BF16";
    const Shape s{2, 70, 128, 2};
    Rng rng(14, 0);
    const auto qkv = randn(rng, s.qkv()), dy = randn(rng, s.out());
    std::vector<float> out[2], lse[2], dqkv[2];
    for (int i = 0; i < 2; ++i) {
        out[i].assign(s.out(), 0.f);
        lse[i].assign(s.lse(), 0.f);
        dqkv[i].assign(s.qkv(), 0.f);
        avx512::attention_forward_bf16(i == 0, out[i].data(), lse[i].data(), qkv.data(), s.B, s.T,
                                       s.C, s.NH);
        avx512::attention_backward_bf16(i == 0, dqkv[i].data(), dy.data(), qkv.data(),
                                        out[0].data(), lse[0].data(), s.B, s.T, s.C, s.NH);
    }
    const auto wide = [](const std::vector<float>& v) {
        return std::vector<double>(v.begin(), v.end());
    };
    EXPECT_LE(max_err(out[1], wide(out[0])), kForward);
    EXPECT_LE(max_err(lse[1], wide(lse[0])), kForward);
    EXPECT_LE(max_err(dqkv[1], wide(dqkv[0])), kBackward);
}

// attention_forward_half / attention_backward_half: bf16 on the unit of the GEMM path's bf16
// products (amx: tiles; avx512 with AVX512_BF16 and no AMX: dots), the float kernels' bits
// otherwise (fp16, float32, a head size of no multiple of 32, a path without 16-bit products).
TEST(AttentionHalf, Bf16OnTheGemmPathsUnitFloatElsewhere) {
    testing::PathGuard guard;
    const CpuFeatures& cpu = cpu_features();
    for (const Shape s : {Shape{2, 45, 128, 2}, Shape{2, 45, 96, 2}}) {
        Rng rng(13, uint64_t(s.C));
        const auto qkv = randn(rng, s.qkv()), dy = randn(rng, s.out());
        std::vector<float> o32(s.out()), l32(s.lse()), d32(s.qkv());
        attention_forward(o32.data(), l32.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        attention_backward(d32.data(), dy.data(), qkv.data(), o32.data(), l32.data(), s.B, s.T, s.C,
                           s.NH);
        // whether attention_*_half gives the float kernels' bits
        auto floats = [&](Dtype d) {
            std::vector<float> o(s.out()), l(s.lse()), g(s.qkv());
            attention_forward_half(d, o.data(), l.data(), qkv.data(), s.B, s.T, s.C, s.NH);
            attention_backward_half(d, g.data(), dy.data(), qkv.data(), o32.data(), l32.data(), s.B,
                                    s.T, s.C, s.NH);
            return o == o32 && l == l32 && g == d32;
        };
        const bool shape = s.hs() % 32 == 0;
        for (const gemm::Path p : testing::supported_paths()) {
            gemm::set_active_path(p);
            const gemm::Path unit = p == gemm::Path::automatic ? gemm::best_path() : p;
            const HalfAttention want =
                !shape                    ? HalfAttention::none
                : unit == gemm::Path::amx ? HalfAttention::tiles
                : unit == gemm::Path::avx512 && cpu.avx512_bf16 && !cpu.amx_bf16
                    ? HalfAttention::dots
                    : HalfAttention::none;
            EXPECT_EQ(half_attention(Dtype::bfloat16, s.hs()), want)
                << gemm::path_name(p) << " head size " << s.hs();
            EXPECT_EQ(floats(Dtype::bfloat16), want == HalfAttention::none)
                << gemm::path_name(p) << " head size " << s.hs();
            EXPECT_EQ(half_attention(Dtype::float16, s.hs()), HalfAttention::none);
            EXPECT_TRUE(floats(Dtype::float16));
            EXPECT_TRUE(floats(Dtype::float32));
            if (!half_products_convert(Dtype::bfloat16)) continue;
            // the gradient kept only as the products' 16 bits: attention_backward_half's (or the
            // FP64 core's) narrowed, the float scratch untouched where the bf16 core runs
            for (const bool fp64 : {false, true}) {
                std::vector<float> g(s.qkv()), scratch(s.qkv(), 0.75f);
                if (fp64) {
                    attention_backward_f64(g.data(), dy.data(), qkv.data(), o32.data(), l32.data(),
                                           s.B, s.T, s.C, s.NH);
                } else {
                    attention_backward_half(Dtype::bfloat16, g.data(), dy.data(), qkv.data(),
                                            o32.data(), l32.data(), s.B, s.T, s.C, s.NH);
                }
                std::vector<uint16_t> want16(s.qkv());
                narrow_half(Dtype::bfloat16, want16.data(), g.data(), g.size());
                const uint16_t* got =
                    attention_backward_dout(Dtype::bfloat16, scratch.data(), dy.data(), qkv.data(),
                                            o32.data(), l32.data(), s.B, s.T, s.C, s.NH, fp64);
                EXPECT_TRUE(std::equal(want16.begin(), want16.end(), got))
                    << gemm::path_name(p) << " head size " << s.hs() << " fp64 " << fp64;
                if (!fp64 && want != HalfAttention::none) {
                    EXPECT_TRUE(std::all_of(scratch.begin(), scratch.end(),
                                            [](float v) { return v == 0.75f; }));
                }
            }
        }
    }
}

// Q, K, V and O kept as 16 bits (attention_forward_half16 / attention_backward_dout16): where
// attention_kept16 holds (the bf16 core, a head size whose 1 / sqrt(hs) is a power of two), the
// bits of attention_forward_half / attention_backward_dout on the float Q, K, V with the output
// rounded; elsewhere the kernels on the widened 16-bit values. Every path, three head sizes, and
// each product kind (tiles, dots) the CPU has directly.
TEST(AttentionHalf, KeptSixteenBitsGiveTheFloatInputsBits) {
    testing::PathGuard guard;
    constexpr Dtype bf = Dtype::bfloat16;
    for (const Shape s : {Shape{2, 45, 128, 2}, Shape{2, 45, 64, 2}, Shape{2, 45, 256, 2}}) {
        Rng rng(17, uint64_t(s.C));
        const auto qkv = randn(rng, s.qkv()), dy = randn(rng, s.out());
        std::vector<uint16_t> qkv16(s.qkv());
        narrow_half(bf, qkv16.data(), qkv.data(), qkv.size());
        std::vector<float> qkv_r(s.qkv());  // the kept values, widened
        for (size_t i = 0; i < qkv.size(); ++i) qkv_r[i] = bf16_to_float(qkv16[i]);
        const bool pow4 = s.hs() == 64 || s.hs() == 256;
        // each product kind the CPU has, whichever the GEMM path would choose
        for (const bool tiles : {true, false}) {
            if (!usable(tiles) || !pow4) continue;
            const std::string at =
                std::string(tiles ? "tiles" : "dots") + " head size " + std::to_string(s.hs());
            std::vector<float> o(s.out()), l(s.lse()), l16(s.lse()), g(s.qkv());
            avx512::attention_forward_bf16(tiles, o.data(), l.data(), qkv.data(), s.B, s.T, s.C,
                                           s.NH);
            std::vector<uint16_t> want_o(s.out()), got_o(s.out());
            narrow_half(bf, want_o.data(), o.data(), o.size());
            avx512::attention_forward_bf16(tiles, got_o.data(), l16.data(), qkv16.data(), s.B, s.T,
                                           s.C, s.NH);
            EXPECT_EQ(got_o, want_o) << at;
            EXPECT_EQ(l16, l) << at;
            for (size_t i = 0; i < o.size(); ++i) o[i] = bf16_to_float(want_o[i]);
            std::vector<uint16_t> want(s.qkv()), got(s.qkv());
            avx512::attention_backward_bf16(tiles, g.data(), dy.data(), qkv.data(), o.data(),
                                            l.data(), s.B, s.T, s.C, s.NH, want.data());
            avx512::attention_backward_bf16(tiles, got.data(), dy.data(), qkv16.data(),
                                            want_o.data(), l.data(), s.B, s.T, s.C, s.NH);
            EXPECT_EQ(got, want) << at;
        }
        for (const gemm::Path p : testing::supported_paths()) {
            gemm::set_active_path(p);
            const std::string at =
                std::string(gemm::path_name(p)) + " head size " + std::to_string(s.hs());
            const bool core = half_attention(bf, s.hs()) != HalfAttention::none;
            const bool kept = attention_kept16(bf, s.hs(), false);
            // the bf16 core where its scale is exact; without it, the float core on Q, K, V
            // rounded to bf16 (attention_rounds_qkv), whatever the head size
            EXPECT_EQ(kept, core ? pow4 : true) << at;
            EXPECT_EQ(attention_rounds_qkv(bf, s.hs(), false), !core) << at;
            EXPECT_FALSE(attention_kept16(bf, s.hs(), true)) << at;
            EXPECT_FALSE(attention_rounds_qkv(bf, s.hs(), true)) << at;
            EXPECT_FALSE(attention_kept16(Dtype::float16, s.hs(), false)) << at;
            EXPECT_FALSE(attention_rounds_qkv(Dtype::float16, s.hs(), false)) << at;
            // forward: the float inputs where the bf16 core keeps them (it rounds them itself),
            // else the widened ones; the output narrowed
            const std::vector<float>& in = kept && core ? qkv : qkv_r;
            std::vector<float> o(s.out()), l(s.lse()), l16(s.lse());
            attention_forward_half(bf, o.data(), l.data(), in.data(), s.B, s.T, s.C, s.NH);
            std::vector<uint16_t> want_o(s.out()), got_o(s.out());
            narrow_half(bf, want_o.data(), o.data(), o.size());
            attention_forward_half16(bf, got_o.data(), l16.data(), qkv16.data(), s.B, s.T, s.C,
                                     s.NH);
            EXPECT_EQ(got_o, want_o) << at;
            EXPECT_EQ(l16, l) << at;
            // backward on the rounded output
            std::vector<float> o_r(s.out());
            for (size_t i = 0; i < o_r.size(); ++i) o_r[i] = bf16_to_float(want_o[i]);
            std::vector<float> g(s.qkv()), g16(s.qkv());
            if (half_products_convert(bf)) {
                const uint16_t* w = attention_backward_dout(
                    bf, g.data(), dy.data(), in.data(), o_r.data(), l.data(), s.B, s.T, s.C, s.NH);
                const std::vector<uint16_t> want(w, w + s.qkv());
                const uint16_t* got =
                    attention_backward_dout16(bf, g16.data(), dy.data(), qkv16.data(),
                                              want_o.data(), l.data(), s.B, s.T, s.C, s.NH);
                ASSERT_NE(got, nullptr) << at;
                EXPECT_TRUE(std::equal(want.begin(), want.end(), got)) << at;
            } else {
                attention_backward_half(bf, g.data(), dy.data(), in.data(), o_r.data(), l.data(),
                                        s.B, s.T, s.C, s.NH);
                EXPECT_EQ(attention_backward_dout16(bf, g16.data(), dy.data(), qkv16.data(),
                                                    want_o.data(), l.data(), s.B, s.T, s.C, s.NH),
                          nullptr)
                    << at;
                EXPECT_EQ(g16, g) << at;
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::kernels

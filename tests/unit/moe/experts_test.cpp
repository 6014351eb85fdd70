// The experts keep only their pre-activation h from forward to backward: backward computes
// g = gelu(h) again for the second product's weight gradient. These tests check that this g is
// the very one forward multiplied by (the weight gradient equals the one formed from forward's
// g, bit for bit, float32 and bf16) and that the gradients are those of the experts' math.
#include "moe/experts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/grouped_gemm.h"
#include "kernels/mixed.h"

namespace bagualu::moe {
namespace {

struct ThreeExperts {
    int C = 12, F = 20, E = 3;
    std::vector<int32_t> offsets{0, 7, 7, 19};  // expert 1 has no rows
    std::vector<float> fc_w, fc_b, proj_w, proj_b, x, dy;
    ExpertPrecision prec;
    explicit ThreeExperts(Dtype half) {
        Rng rng(11);
        auto fill = [&](std::vector<float>& v, size_t n, double s) {
            v.resize(n);
            for (auto& a : v) a = round_to(half, static_cast<float>(s * rng.normal()));
        };
        const size_t R = static_cast<size_t>(offsets.back());
        fill(fc_w, size_t(E) * F * C, 0.4);
        fill(fc_b, size_t(E) * F, 0.2);
        fill(proj_w, size_t(E) * C * F, 0.4);
        fill(proj_b, size_t(E) * C, 0.2);
        fill(x, R * C, 1.0);
        fill(dy, R * C, 1.0);
        prec.gemm = half;
        prec.act  = half;
    }
    ExpertWeights weights() const {
        const size_t C_ = size_t(C), F_ = size_t(F);
        return {fc_w.data(), fc_b.data(), proj_w.data(), proj_b.data(), F_ * C_, F_, C_ * F_, C_};
    }
    int rows() const { return offsets.back(); }
};

struct ExpertsRun {
    std::vector<float> y, g_fwd, dx, dfc_w, dfc_b, dproj_w, dproj_b, dy;
};

// forward then backward, the hidden kept in float32 or (half16) in 16 bits
ExpertsRun run(const ThreeExperts& s, bool half16) {
    const int R = s.rows(), C = s.C, F = s.F, E = s.E;
    const size_t RF = size_t(R) * F;
    ExpertsRun r;
    r.y.resize(size_t(R) * C);
    std::vector<float> h32(half16 ? 0 : RF), g(RF, -1.f);
    std::vector<uint16_t> h16(half16 ? RF : 0);
    const kernels::KeptArray h{half16 ? nullptr : h32.data(), half16 ? h16.data() : nullptr};
    experts_forward(r.y.data(), h, g.data(), s.x.data(), s.weights(), s.offsets.data(), E, C, F,
                    s.prec);
    // what forward multiplied by (not kept by the layer): where the products convert, forward
    // leaves only its 16 bits, at the start of g's storage
    r.g_fwd = g;
    if (kernels::half_products_convert(s.prec.gemm)) {
        std::vector<uint16_t> g16(RF);
        std::memcpy(g16.data(), g.data(), RF * sizeof(uint16_t));
        for (size_t i = 0; i < RF; ++i) r.g_fwd[i] = bf16_to_float(g16[i]);
    }
    r.dfc_w.resize(s.fc_w.size());
    r.dfc_b.resize(s.fc_b.size());
    r.dproj_w.resize(s.proj_w.size());
    r.dproj_b.resize(s.proj_b.size());
    ExpertGrads dw{r.dfc_w.data(), r.dfc_b.data(), r.dproj_w.data(), r.dproj_b.data(),
                   size_t(F) * C,  size_t(F),      size_t(C) * F,    size_t(C)};
    r.dx.resize(size_t(R) * C);
    std::vector<float> dh(RF);
    r.dy = s.dy;
    experts_backward(r.dx.data(), dh.data(), dw, r.dy.data(), s.x.data(), h, s.weights(),
                     s.offsets.data(), E, C, F, s.prec);
    return r;
}

// Every output and gradient of two runs, bit for bit.
void expect_same_bits(const ExpertsRun& a, const ExpertsRun& b) {
    EXPECT_EQ(a.y, b.y);
    EXPECT_EQ(a.dx, b.dx);
    EXPECT_EQ(a.dfc_w, b.dfc_w);
    EXPECT_EQ(a.dfc_b, b.dfc_b);
    EXPECT_EQ(a.dproj_w, b.dproj_w);
    EXPECT_EQ(a.dproj_b, b.dproj_b);
}

class ExpertsGelu : public ::testing::TestWithParam<Dtype> {};

TEST_P(ExpertsGelu, BackwardMultipliesByForwardsGeluOutput) {
    const ThreeExperts s(GetParam());
    const int C = s.C, F = s.F, E = s.E;
    const ExpertsRun r = run(s, false);
    // dproj_w from forward's g: the same GEMM on the same operands gives the same bits
    std::vector<float> want(s.proj_w.size());
    kernels::grouped_gemm_tn_half(s.prec.gemm, E, s.offsets.data(), C, F, r.dy.data(), C,
                                  r.g_fwd.data(), F, want.data(), F, size_t(C) * F);
    EXPECT_EQ(r.dproj_w, want);
    // and the rows of expert 1 (none) leave its gradients at zero
    for (size_t i = size_t(C) * F; i < 2 * size_t(C) * F; ++i) EXPECT_EQ(r.dproj_w[i], 0.0f);
    // dx holds values of the activations' dtype, every row of every expert (rounded as each
    // rectangle of its product finished)
    size_t unrounded = 0;
    for (const float v : r.dx) unrounded += round_to(s.prec.act, v) != v;
    EXPECT_EQ(unrounded, 0u);
}

// The hidden kept in 16 bits (half act dtypes) gives every output and gradient bit for bit.
class ExpertsHalfHidden : public ::testing::TestWithParam<Dtype> {};

TEST_P(ExpertsHalfHidden, SixteenBitHiddenGivesTheSameBits) {
    const ThreeExperts s(GetParam());
    const ExpertsRun a = run(s, false), b = run(s, true);
    EXPECT_EQ(a.g_fwd, b.g_fwd);
    expect_same_bits(a, b);
}

// bf16 products on 16-bit copies (kernels::grouped_gemm_half, the default) where gemm_bf16 only
// widens: bitwise the float path there (kernels::bf16_float_operands; the widening kernels share
// the float kernels' blocking), which checks the copies' rows, groups and strides. Where the CPU
// has 16-bit arithmetic both runs take the 16-bit path and the test compares it with itself (it
// then runs in the model tests).
TEST(ExpertsSixteenBitOperands, SameBitsAsTheFloatPathWhereGemmBf16Widens) {
    const ThreeExperts s(Dtype::bfloat16);
    kernels::bf16_float_operands(true);
    const ExpertsRun a = run(s, true);
    kernels::bf16_float_operands(false);
    const ExpertsRun b = run(s, true);
    expect_same_bits(a, b);
    if (!kernels::gemm_bf16_widens()) GTEST_SKIP() << "gemm_bf16 has 16-bit arithmetic here";
}

// The gradients against the math in double: a wrong or unrounded g (or a dh that still held g)
// moves them far beyond float32 rounding. Float32 only: the check is of the formulas.
TEST(ExpertsMath, GradientsMatchTheMathInDouble) {
    const ThreeExperts s(Dtype::float32);
    const int C = s.C, F = s.F, E = s.E;
    const ExpertsRun res        = run(s, false);
    const std::vector<float>&dx = res.dx, &dproj_w = res.dproj_w, &dfc_w = res.dfc_w;
    const double k = std::sqrt(2.0 / M_PI);
    for (int e = 0; e < E; ++e) {
        const float* W1 = s.fc_w.data() + size_t(e) * F * C;
        const float* b1 = s.fc_b.data() + size_t(e) * F;
        const float* W2 = s.proj_w.data() + size_t(e) * C * F;
        std::vector<double> dW2(size_t(C) * F, 0.0), dW1(size_t(F) * C, 0.0);
        for (int r = s.offsets[e]; r < s.offsets[e + 1]; ++r) {
            const float* xr  = s.x.data() + size_t(r) * C;
            const float* dyr = s.dy.data() + size_t(r) * C;
            std::vector<double> dxr(C, 0.0);
            for (int f = 0; f < F; ++f) {
                double u = b1[f];
                for (int c = 0; c < C; ++c) u += double(W1[size_t(f) * C + c]) * xr[c];
                const double t  = std::tanh(k * (u + 0.044715 * u * u * u));
                const double gf = 0.5 * u * (1 + t);
                const double dg_du =
                    0.5 * (1 + t) + 0.5 * u * (1 - t * t) * k * (1 + 3 * 0.044715 * u * u);
                double dg = 0;
                for (int c = 0; c < C; ++c) {
                    dW2[size_t(c) * F + f] += double(dyr[c]) * gf;
                    dg += double(dyr[c]) * W2[size_t(c) * F + f];
                }
                const double du = dg * dg_du;
                for (int c = 0; c < C; ++c) {
                    dW1[size_t(f) * C + c] += du * xr[c];
                    dxr[c] += du * W1[size_t(f) * C + c];
                }
            }
            // 1e-4: float32 products and sums of about 20 terms of size 1 against double
            for (int c = 0; c < C; ++c) EXPECT_NEAR(dx[size_t(r) * C + c], dxr[c], 1e-4);
        }
        for (size_t i = 0; i < dW2.size(); ++i)
            EXPECT_NEAR(dproj_w[size_t(e) * C * F + i], dW2[i], 1e-4) << "expert " << e;
        for (size_t i = 0; i < dW1.size(); ++i)
            EXPECT_NEAR(dfc_w[size_t(e) * F * C + i], dW1[i], 1e-4) << "expert " << e;
    }
}

// Many experts, none large (kernels::whole_groups_suit): each expert's chain whole on one thread
// gives the bits of the passes over all experts, forward and backward, in float32 and, where
// the products convert, bf16: the tokens read in place or from permuted rows, the bias sums
// continued in bias_acc or added, the GELU in float32 or FP64; with bf16 the kept h in 16 bits
// or in float, the output's 16-bit copy, the output gradient given or gathered from the tokens'
// with scales; on 1 and 2 threads.
TEST(ExpertsWhole, OneThreadAnExpertGivesThePassesBits) {
    const int C = 32, F = 24, E = 12, T = 80;
    std::vector<int> sizes = {18, 0, 28, 22, 14, 26, 2, 20, 24, 16, 12, 30};
    std::vector<int32_t> offsets(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) offsets[size_t(e) + 1] = offsets[size_t(e)] + sizes[size_t(e)];
    const int R = offsets.back();
    ASSERT_TRUE(kernels::whole_groups_suit(E, offsets.data()));
    Rng rng(5);
    auto normal = [&](size_t n, double sd) {
        std::vector<float> v(n);
        for (auto& a : v) a = static_cast<float>(sd * rng.normal());
        return v;
    };
    const auto fc_w = normal(size_t(E) * F * C, 0.3), fc_b = normal(size_t(E) * F, 0.2),
               proj_w = normal(size_t(E) * C * F, 0.3), proj_b = normal(size_t(E) * C, 0.2),
               tokens = normal(size_t(T) * C, 1.0), dy0 = normal(size_t(R) * C, 1.0);
    std::vector<int32_t> rows(static_cast<size_t>(R));
    for (auto& r : rows) r = static_cast<int32_t>(rng.below(uint64_t(T)));
    std::vector<float> xperm(size_t(R) * C);
    for (int i = 0; i < R; ++i)
        std::copy_n(tokens.data() + size_t(rows[size_t(i)]) * C, C, xperm.data() + size_t(i) * C);
    const ExpertWeights w{fc_w.data(),   fc_b.data(), proj_w.data(), proj_b.data(),
                          size_t(F) * C, size_t(F),   size_t(C) * F, size_t(C)};
    const auto dout = normal(size_t(T) * C, 1.0), scale = normal(size_t(R), 0.5);
    struct Out {
        ExpertsRun r;  // y, dx and the parameter gradients
        std::vector<float> h;
        std::vector<uint16_t> h16, y16;
        std::vector<double> acc;
    };
    struct Case {
        bool gathered, with_acc, fp64;
        Dtype d;
        bool half_h, gathered_dy;
    };
    auto run = [&](bool whole, const Case& c) {
        set_whole_experts(whole);
        ExpertPrecision prec;
        prec.gemm = prec.act = c.d;
        prec.fp64            = c.fp64;
        Out o;
        o.r.y.assign(size_t(R) * C, 0.f);
        o.h.assign(c.half_h ? 0 : size_t(R) * F, 0.f);
        o.h16.assign(c.half_h ? size_t(R) * F : 0, 0);
        o.y16.assign(c.d == Dtype::float32 ? 0 : size_t(R) * C, 0);
        const kernels::KeptArray h{c.half_h ? nullptr : o.h.data(),
                                   c.half_h ? o.h16.data() : nullptr};
        std::vector<float> g(size_t(R) * F), dh(size_t(R) * F);
        std::vector<float> dy = c.gathered_dy ? dout : dy0;
        const float* x        = c.gathered ? tokens.data() : xperm.data();
        const int32_t* xrows  = c.gathered ? rows.data() : nullptr;
        experts_forward(o.r.y.data(), h, g.data(), x, w, offsets.data(), E, C, F, prec, xrows,
                        o.y16.empty() ? nullptr : o.y16.data());
        o.r.dx.assign(size_t(R) * C, 0.f);
        o.r.dfc_w.assign(fc_w.size(), 0.25f);
        o.r.dfc_b.assign(fc_b.size(), 0.25f);
        o.r.dproj_w.assign(proj_w.size(), 0.25f);
        o.r.dproj_b.assign(proj_b.size(), 0.25f);
        o.acc.assign(c.with_acc ? size_t(E) * (F + C) : 0, 0.5);
        ExpertGrads dw{o.r.dfc_w.data(), o.r.dfc_b.data(), o.r.dproj_w.data(), o.r.dproj_b.data(),
                       size_t(F) * C,    size_t(F),        size_t(C) * F,      size_t(C)};
        experts_backward(o.r.dx.data(), dh.data(), dw, dy.data(), x, h, w, offsets.data(), E, C, F,
                         prec, c.with_acc ? o.acc.data() : nullptr, xrows,
                         c.gathered_dy ? rows.data() : nullptr,
                         c.gathered_dy ? scale.data() : nullptr);
        set_whole_experts(true);
        return o;
    };
    for (int threads : {1, 2}) {
        set_compute_threads(threads);
        for (const Dtype d : {Dtype::float32, Dtype::bfloat16}) {
            // the 16-bit forms where the products convert (16-bit copies): the kept h in 16 bits
            // or in float, the output gradient given or gathered from the tokens'
            const bool half = kernels::half_products_convert(d);
            for (const bool gathered : {false, true}) {
                for (const bool with_acc : {false, true}) {
                    for (const bool fp64 : {false, true}) {
                        for (const bool half_h : {false, true}) {
                            for (const bool gathered_dy : {false, true}) {
                                if ((half_h || gathered_dy) && !half) continue;
                                const Case c{gathered, with_acc, fp64, d, half_h, gathered_dy};
                                SCOPED_TRACE(::testing::Message()
                                             << threads << " threads, " << dtype_name(d)
                                             << ", gathered " << gathered << ", bias_acc "
                                             << with_acc << ", fp64 " << fp64 << ", 16-bit h "
                                             << half_h << ", gathered dy " << gathered_dy);
                                ExpertPrecision prec;
                                prec.gemm = prec.act = d;
                                // the whole experts run in float32, and in bf16 where the
                                // products also pack float weights themselves
                                EXPECT_EQ(
                                    experts_run_whole(prec, E, offsets.data(), F),
                                    d == Dtype::float32 || kernels::grouped_gemm_bf16_float_b());
                                const Out a = run(true, c), b = run(false, c);
                                expect_same_bits(a.r, b.r);
                                EXPECT_EQ(a.h, b.h);
                                EXPECT_EQ(a.h16, b.h16);
                                EXPECT_EQ(a.y16, b.y16);
                                EXPECT_EQ(a.acc, b.acc);
                            }
                        }
                    }
                }
            }
        }
    }
    set_compute_threads(0);
}

// The experts run whole only where the largest one's (rows, F) floats fit in half of L2: the
// rows that just fit, and one more.
TEST(ExpertsWhole, OnlyWhereAnExpertsRowsFitInHalfOfL2) {
    const int E = 64, F = 96;
    const size_t half_l2 = kernels::cache_sizes().l2 / 2;
    const int fit        = static_cast<int>(half_l2 / (size_t(F) * sizeof(float)));
    ASSERT_GT(fit, 1);
    auto offsets = [&](int largest) {
        std::vector<int32_t> off(size_t(E) + 1, 0);
        for (int e = 0; e < E; ++e)
            off[size_t(e) + 1] = off[size_t(e)] + (e == 5 ? largest : fit - 1);
        return off;
    };
    const ExpertPrecision prec;
    EXPECT_TRUE(experts_run_whole(prec, E, offsets(fit).data(), F));
    EXPECT_FALSE(experts_run_whole(prec, E, offsets(fit + 1).data(), F));
    set_whole_experts(false);
    EXPECT_FALSE(experts_run_whole(prec, E, offsets(fit).data(), F));
    set_whole_experts(true);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExpertsGelu,
                         ::testing::Values(Dtype::float32, Dtype::bfloat16, Dtype::float16),
                         [](const ::testing::TestParamInfo<Dtype>& p) {
                             return std::string(dtype_name(p.param));
                         });
INSTANTIATE_TEST_SUITE_P(HalfDtypes, ExpertsHalfHidden,
                         ::testing::Values(Dtype::bfloat16, Dtype::float16),
                         [](const ::testing::TestParamInfo<Dtype>& p) {
                             return std::string(dtype_name(p.param));
                         });

}  // namespace
}  // namespace bagualu::moe

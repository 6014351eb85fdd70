// The balancing bias (moe/balance_bias.h): the update rule on hand-computed loads, loads summed
// over micro-batches, and in the router: the bias changes the choice of experts but not their
// weights, and the router's gradient with a nonzero bias matches central differences of a
// double-precision reference.
#include "moe/balance_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "moe/router.h"

namespace bagualu::moe {
namespace {

TEST(BalanceBiasTest, UpdateIsRateTimesSignOfMeanMinusLoadThenRecentred) {
    BalanceBias b(4);
    // loads {9, 5, 5, 5}: mean 6, signs {-, +, +, +} -> {-r, r, r, r}, mean r/2 removed
    const std::vector<int64_t> half1 = {4, 2, 3, 1}, half2 = {5, 3, 2, 4};
    b.add_load(half1.data());
    b.add_load(half2.data());
    b.end_step(0.25);  // exact in float: the expected values are exact too
    const std::vector<float> got(b.values(), b.values() + 4);
    EXPECT_EQ(got, (std::vector<float>{-0.375f, 0.125f, 0.125f, 0.125f}));
    EXPECT_DOUBLE_EQ(b.max_violation(), 9.0 / 6.0 - 1.0);
    EXPECT_EQ(b.step_load(), (std::vector<int64_t>{9, 5, 5, 5}));  // both micro-batches
    const BiasStats s = b.stats();
    EXPECT_EQ(s.min, -0.375);
    EXPECT_EQ(s.max, 0.125);
    EXPECT_EQ(s.mean_abs, 0.1875);
    // the load was cleared: a balanced step moves nothing (every sign is 0)
    const std::vector<int64_t> even = {3, 3, 3, 3};
    b.add_load(even.data());
    b.end_step(0.25);
    EXPECT_EQ(std::vector<float>(b.values(), b.values() + 4), got);
    EXPECT_EQ(b.max_violation(), 0.0);
    // rate 0: measured, not updated
    b.add_load(half1.data());
    b.end_step(0.0);
    EXPECT_EQ(std::vector<float>(b.values(), b.values() + 4), got);
    EXPECT_DOUBLE_EQ(b.max_violation(), 4.0 / 2.5 - 1.0);
    // a discarded step leaves no load behind, and the last ended step's as it was
    b.add_load(half1.data());
    b.discard_step();
    EXPECT_EQ(b.step_load(), half1);
    b.add_load(even.data());
    b.end_step(0.25);
    EXPECT_EQ(std::vector<float>(b.values(), b.values() + 4), got);
}

TEST(BalanceBiasTest, ProportionalUpdateIsRateTimesRelativeErrorThenRecentred) {
    BalanceBias b(4);
    // loads {9, 5, 5, 5}: mean 6, relative errors {-1/2, 1/6, 1/6, 1/6}, which sum to 0 (no
    // recentring left); rate 0.75: {-0.375, 0.125, 0.125, 0.125}
    const std::vector<int64_t> load = {9, 5, 5, 5};
    b.add_load(load.data());
    b.end_step(0.75, true);
    const std::vector<float> want = {-0.375f, 0.125f, 0.125f, 0.125f};
    for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(b.values()[e], want[static_cast<size_t>(e)]);
    // a step four times as far from balance moves four times as far (the sign rule would not)
    BalanceBias far(4);
    const std::vector<int64_t> skew = {21, 1, 1, 1};  // mean 6: errors {-2.5, 5/6, 5/6, 5/6}
    far.add_load(skew.data());
    far.end_step(0.75, true);
    EXPECT_FLOAT_EQ(far.values()[0], -1.875f);
    EXPECT_FLOAT_EQ(far.values()[1], 0.625f);
    // and the same bits for one micro-batch or a split of it
    BalanceBias one(4), two(4);
    const std::vector<int64_t> a = {4, 2, 3, 1}, c = {5, 3, 2, 4}, sum = {9, 5, 5, 5};
    one.add_load(sum.data());
    two.add_load(a.data());
    two.add_load(c.data());
    one.end_step(0.3, true);
    two.end_step(0.3, true);
    EXPECT_EQ(std::vector<float>(one.values(), one.values() + 4),
              std::vector<float>(two.values(), two.values() + 4));
}

TEST(BalanceBiasTest, OneMicroBatchOrFourGiveTheSameBits) {
    Rng rng(5);
    const int E = 8;
    BalanceBias one(E), four(E);
    for (int step = 0; step < 50; ++step) {
        std::vector<int64_t> total(E, 0);
        for (int m = 0; m < 4; ++m) {
            std::vector<int64_t> part(E);
            for (auto& v : part) v = static_cast<int64_t>(rng.below(100));
            for (int e = 0; e < E; ++e)
                total[static_cast<size_t>(e)] += part[static_cast<size_t>(e)];
            four.add_load(part.data());
        }
        one.add_load(total.data());
        one.end_step(1e-3);
        four.end_step(1e-3);
        ASSERT_EQ(std::vector<float>(one.values(), one.values() + E),
                  std::vector<float>(four.values(), four.values() + E));
    }
    double mean = 0;
    for (int e = 0; e < E; ++e) mean += one.values()[e];
    EXPECT_NEAR(mean / E, 0.0, 1e-7);  // recentred; float rounding of values ~1e-2
}

// ---- the bias in the router ----

struct Problem {
    int N = 48, C = 6, E = 6, K = 2;
    std::vector<float> inp, gate_w, bias, dprobs;
};
Problem make_problem() {
    Problem p;
    Rng rng(11);
    auto fill = [&](std::vector<float>& v, size_t n, double scale) {
        v.resize(n);
        for (auto& x : v) x = static_cast<float>(scale * rng.normal());
    };
    fill(p.inp, static_cast<size_t>(p.N * p.C), 1.0);
    fill(p.gate_w, static_cast<size_t>(p.E * p.C), 0.5);
    fill(p.bias, static_cast<size_t>(p.E), 1.0);
    fill(p.dprobs, static_cast<size_t>(p.N * p.K), 1.0);
    return p;
}

// double reference: logits of token t under gate weights w
std::vector<double> logits_of(const Problem& p, const std::vector<double>& w, int t) {
    std::vector<double> l(static_cast<size_t>(p.E), 0.0);
    for (int e = 0; e < p.E; ++e) {
        for (int c = 0; c < p.C; ++c)
            l[static_cast<size_t>(e)] +=
                w[static_cast<size_t>(e * p.C + c)] * p.inp[static_cast<size_t>(t * p.C + c)];
    }
    return l;
}

GateConfig topk_with_bias() {
    GateConfig g;
    g.kind         = GateKind::topk;
    g.balance_bias = true;
    return g;
}

TEST(BalanceBiasTest, RouterBiasChangesTheChoiceButNotTheWeights) {
    const Problem p = make_problem();
    Router biased(p.C, p.E, p.K, 0.0, topk_with_bias(), p.N, nullptr);
    Router plain(p.C, p.E, p.K, 0.0, GateConfig{}, p.N, nullptr);
    biased.balance_bias().set(p.bias);
    biased.forward(p.inp.data(), p.gate_w.data(), nullptr, p.N);
    plain.forward(p.inp.data(), p.gate_w.data(), nullptr, p.N);
    const std::vector<double> w(p.gate_w.begin(), p.gate_w.end());
    int changed = 0;
    std::vector<int64_t> counts(static_cast<size_t>(p.E), 0);
    for (int t = 0; t < p.N; ++t) {
        const std::vector<double> l = logits_of(p, w, t);
        std::vector<int> order(static_cast<size_t>(p.E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return l[static_cast<size_t>(a)] + p.bias[static_cast<size_t>(a)] >
                   l[static_cast<size_t>(b)] + p.bias[static_cast<size_t>(b)];
        });
        double z = 0;
        for (int k = 0; k < p.K; ++k)
            z += std::exp(l[static_cast<size_t>(order[static_cast<size_t>(k)])]);
        for (int k = 0; k < p.K; ++k) {
            const int e = order[static_cast<size_t>(k)];
            ASSERT_EQ(biased.expert_idx()[t * p.K + k], e) << "token " << t << " slot " << k;
            // the weight is the softmax of the unbiased logits over the chosen experts; float32
            // logits of C = 6 terms: 1e-6 relative
            EXPECT_NEAR(biased.probs()[t * p.K + k], std::exp(l[static_cast<size_t>(e)]) / z, 2e-6);
            changed += plain.expert_idx()[t * p.K + k] != e;
            ++counts[static_cast<size_t>(e)];
        }
    }
    EXPECT_GT(changed, p.N / 4) << "a bias of unit scale should move many choices";
    EXPECT_EQ(biased.stats().topk_per_expert, counts);
}

TEST(BalanceBiasTest, RouterGradientWithBiasMatchesCentralDifferencesInDouble) {
    const Problem p = make_problem();
    Router r(p.C, p.E, p.K, 0.0, topk_with_bias(), p.N, nullptr);
    r.balance_bias().set(p.bias);
    r.forward(p.inp.data(), p.gate_w.data(), nullptr, p.N);
    const std::vector<int32_t> idx(r.expert_idx(), r.expert_idx() + p.N * p.K);
    std::vector<float> dinp(static_cast<size_t>(p.N * p.C)),
        dw(static_cast<size_t>(p.E * p.C), 0.0f);
    r.backward(dinp.data(), dw.data(), nullptr, p.dprobs.data(), p.inp.data(), p.gate_w.data(),
               nullptr, 0.0);
    // f(w) = sum_{t,k} dprobs[t,k] * softmax over the chosen experts of the unbiased logits;
    // the choice is held at the router's (the bias moves it, but it is piecewise constant)
    auto f = [&](const std::vector<double>& w) {
        double out = 0;
        for (int t = 0; t < p.N; ++t) {
            const std::vector<double> l = logits_of(p, w, t);
            double z                    = 0;
            for (int k = 0; k < p.K; ++k)
                z += std::exp(l[static_cast<size_t>(idx[static_cast<size_t>(t * p.K + k)])]);
            for (int k = 0; k < p.K; ++k) {
                out += p.dprobs[static_cast<size_t>(t * p.K + k)] *
                       std::exp(l[static_cast<size_t>(idx[static_cast<size_t>(t * p.K + k)])]) / z;
            }
        }
        return out;
    };
    const std::vector<double> w(p.gate_w.begin(), p.gate_w.end());
    for (size_t i = 0; i < w.size(); ++i) {
        std::vector<double> a = w, b = w;
        const double h = 1e-5;
        a[i] += h;
        b[i] -= h;
        const double num = (f(a) - f(b)) / (2 * h);  // double: error ~1e-10
        // the router computes in float32 over 48 tokens: 1e-5 absolute on sums of order 1
        EXPECT_NEAR(dw[i], num, 1e-5 + 1e-5 * std::fabs(num)) << "gate_w[" << i << "]";
    }
}

}  // namespace
}  // namespace bagualu::moe

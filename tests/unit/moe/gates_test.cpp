// The gates of docs/model.md ("Gates") on one process: routing, capacity and dropping, random
// second-expert routing, noise determinism, SWIPE balance with virtual workers, aux losses, and
// a whole-model gradient check by central differences for every gate (noise fixed by the
// routing context, as in training).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../../common/tiny_model.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "moe/gate.h"
#include "moe/moe_layer.h"
#include "moe/noisy_gate.h"
#include "moe/router.h"

namespace bagualu::moe {
namespace {

struct Inputs {
    std::vector<float> gate_w, noise_w, inp;
};
Inputs random_inputs(int N, int C, int E, uint64_t seed) {
    Rng rng(seed);
    Inputs in;
    auto fill = [&](std::vector<float>& v, size_t n) {
        v.resize(n);
        for (auto& x : v) x = static_cast<float>(rng.normal());
    };
    fill(in.gate_w, static_cast<size_t>(E * C));
    fill(in.noise_w, static_cast<size_t>(E * C));
    fill(in.inp, static_cast<size_t>(N * C));
    return in;
}

GateConfig gate_of(GateKind kind, double cf = 1.0, double jitter = 0.0, int vw = 1) {
    GateConfig g;
    g.kind            = kind;
    g.capacity_factor = cf;
    g.jitter          = jitter;
    g.virtual_workers = vw;
    return g;
}

const RoutingContext kTrain{7, 3, true};

TEST(GatesTest, SwitchIsTop1WithFullSoftmaxWeightAndCapacityInTokenOrder) {
    const int C = 6, E = 4, K = 1, N = 40;
    Inputs in = random_inputs(N, C, E, 1);
    for (int c = 0; c < C; ++c) in.gate_w[static_cast<size_t>(c)] += 1.5f;  // crowd expert 0
    Router r(C, E, K, 0.0, gate_of(GateKind::switch_top1, 1.0), N, nullptr);
    r.set_context(kTrain);
    r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    std::vector<float> logits(N * E), sm(N * E);
    std::vector<int32_t> top(N);
    for (int t = 0; t < N; ++t) {
        for (int e = 0; e < E; ++e) {
            double a = 0;
            for (int c = 0; c < C; ++c) a += double(in.inp[t * C + c]) * in.gate_w[e * C + c];
            logits[t * E + e] = static_cast<float>(a);
        }
    }
    std::vector<double> ent(N);
    softmax_rows(sm.data(), ent.data(), logits.data(), N, E);
    rank_experts(top.data(), logits.data(), N, E, 1);
    const int64_t capacity = N / E;  // ceil(1.0 * N * 1 / E)
    std::vector<int64_t> seen(E, 0);
    int64_t dropped = 0;
    for (int t = 0; t < N; ++t) {
        const bool keep = seen[top[t]]++ < capacity;
        EXPECT_EQ(r.expert_idx()[t], keep ? top[t] : -1) << "token " << t;
        EXPECT_NEAR(r.probs()[t], sm[t * E + top[t]], 1e-6);
        dropped += keep ? 0 : 1;
    }
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(r.stats().dropped, dropped);
    for (int e = 0; e < E; ++e) EXPECT_LE(r.tokens_per_expert()[e], capacity);
    // at inference: no capacity
    r.set_context(RoutingContext{});
    r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    for (int t = 0; t < N; ++t) EXPECT_EQ(r.expert_idx()[t], top[t]);
    EXPECT_EQ(r.stats().dropped, 0);
}

TEST(GatesTest, DroppedTokensPassThroughWithZeroExpertOutput) {
    const int C = 5, F = 7, E = 4, K = 1, N = 24;
    Inputs in = random_inputs(N, C, E, 2);
    for (int c = 0; c < C; ++c) in.gate_w[static_cast<size_t>(c)] += 3.0f;
    std::vector<float> fc_w(E * F * C, 0.1f), fc_b(E * F, 0.1f), proj_w(E * C * F, 0.1f),
        proj_b(E * C, 0.1f);
    MoEWeights w;
    w.gate_w  = in.gate_w.data();
    w.experts = {fc_w.data(),   fc_b.data(), proj_w.data(), proj_b.data(),
                 size_t(F * C), size_t(F),   size_t(C * F), size_t(C)};
    MoEShape shape{C, F, E, K, 0.0};
    shape.gate = gate_of(GateKind::switch_top1, 0.5);
    MoELayer layer(shape, N);
    layer.set_routing_context(kTrain);
    std::vector<float> out(N * C, 1.0f);
    layer.forward(out.data(), in.inp.data(), w, N);
    int dropped = 0;
    for (int t = 0; t < N; ++t) {
        const bool d = layer.expert_idx()[t] < 0;
        dropped += d;
        for (int c = 0; c < C; ++c) {
            if (d) {
                EXPECT_EQ(out[t * C + c], 0.0f);
            } else {
                EXPECT_NE(out[t * C + c], 0.0f);
            }
        }
    }
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(layer.routing_stats().dropped, dropped);
}

TEST(GatesTest, GShardKeepsSecondExpertWithProbabilityTwiceItsWeight) {
    const int C = 8, E = 4, K = 2, N = 4000;
    Inputs in = random_inputs(N, C, E, 3);
    Router r(C, E, K, 0.0, gate_of(GateKind::gshard, 100.0), N, nullptr);  // no capacity drops
    r.set_context(kTrain);
    r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    double expect = 0, kept = 0;
    for (int t = 0; t < N; ++t) {
        EXPECT_GE(r.expert_idx()[t * K], 0);
        expect += std::min(1.0, 2.0 * r.probs()[t * K + 1]);
        kept += r.expert_idx()[t * K + 1] >= 0;
        EXPECT_NEAR(r.probs()[t * K] + r.probs()[t * K + 1], 1.0, 1e-6);  // normalised top-2
    }
    EXPECT_NEAR(kept / N, expect / N, 0.03);
    EXPECT_LT(kept, N);
    // deterministic in (seed, step, layer, token)
    std::vector<int32_t> first(r.expert_idx(), r.expert_idx() + N * K);
    r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), r.expert_idx()));
    // capacity 1.0: the first choices of all tokens queue before any second choice
    Router rc(C, E, K, 0.0, gate_of(GateKind::gshard, 1.0), N, nullptr);
    rc.set_context(kTrain);
    rc.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    for (int e = 0; e < E; ++e) EXPECT_LE(rc.tokens_per_expert()[e], 2 * N / E);
}

TEST(GatesTest, NoisyTopKNoiseIsDeterministicAndOffAtInference) {
    const int C = 6, E = 5, K = 2, N = 30;
    Inputs in = random_inputs(N, C, E, 4);
    Router r(C, E, K, 0.1, gate_of(GateKind::noisy), N, nullptr);
    Router topk(C, E, K, 0.0, gate_of(GateKind::topk), N, nullptr);
    topk.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
    r.forward(in.inp.data(), in.gate_w.data(), in.noise_w.data(), N);  // inference: clean logits
    EXPECT_TRUE(std::equal(topk.expert_idx(), topk.expert_idx() + N * K, r.expert_idx()));
    r.set_context(kTrain);
    const double a1 = r.forward(in.inp.data(), in.gate_w.data(), in.noise_w.data(), N);
    std::vector<int32_t> s1(r.expert_idx(), r.expert_idx() + N * K);
    const double a2 = r.forward(in.inp.data(), in.gate_w.data(), in.noise_w.data(), N);
    EXPECT_EQ(a1, a2);
    EXPECT_TRUE(std::equal(s1.begin(), s1.end(), r.expert_idx()));
    EXPECT_FALSE(std::equal(s1.begin(), s1.end(), topk.expert_idx()));  // noise moved some
    r.set_context({7, 4, true});
    r.forward(in.inp.data(), in.gate_w.data(), in.noise_w.data(), N);
    EXPECT_FALSE(std::equal(s1.begin(), s1.end(), r.expert_idx()));  // another step, other noise
    EXPECT_GT(a1, 0.0);
}

TEST(GatesTest, CvSquaredMatchesDefinitionAndGradient) {
    const std::vector<double> v = {3, 1, 4, 1, 5};
    std::vector<double> dv(5);
    const double cv = cv_squared(dv.data(), v.data(), 5);
    const double m  = 14.0 / 5;
    double var      = 0;
    for (double x : v) var += (x - m) * (x - m) / 5;
    EXPECT_NEAR(cv, var / (m * m), 1e-12);
    for (int e = 0; e < 5; ++e) {
        std::vector<double> p = v, q = v, d(5);
        p[e] += 1e-6;
        q[e] -= 1e-6;
        EXPECT_NEAR(dv[e],
                    (cv_squared(d.data(), p.data(), 5) - cv_squared(d.data(), q.data(), 5)) / 2e-6,
                    1e-6);
    }
}

TEST(GatesTest, SwipeWithVirtualWorkersBalancesEveryExpertExactly) {
    const int C = 6, E = 8, K = 2, N = 64;
    Inputs in = random_inputs(N, C, E, 5);
    for (int c = 0; c < C; ++c)
        in.gate_w[static_cast<size_t>(3 * C + c)] += 2.0f;  // crowd expert 3
    for (int vw : {1, 2, 4, 8}) {
        Router r(C, E, K, 0.01, gate_of(GateKind::swipe, 1.0, 0.0, vw), N, nullptr);
        r.set_context(kTrain);
        r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
        for (int e = 0; e < E; ++e) EXPECT_EQ(r.tokens_per_expert()[e], N * K / E) << "vw " << vw;
        EXPECT_GT(r.stats().reassigned, 0);
        EXPECT_EQ(r.stats().dropped, 0);
        for (int t = 0; t < N; ++t) {
            float sum = 0;
            for (int k = 0; k < K; ++k) sum += r.probs()[t * K + k];
            EXPECT_NEAR(sum, 1.0f, 1e-6);
        }
    }
}

TEST(GatesTest, LimitToGroupsKeepsTheBestGroupsByTheirTopScores) {
    // E = 8 in G = 4 groups of 2, two tokens
    const float s[16] = {5, -9, 4, 4,  0, 0, -1, 6,   // token 0
                         1, 1,  3, -1, 0, 0, 1,  1};  // token 1
    const float inf   = std::numeric_limits<float>::infinity();
    std::vector<float> m(16);
    // K = 2 over M = 2 groups: each group scores its best expert (5, 4, 0, 6): groups 3 and 0
    limit_to_groups(m.data(), s, 2, 8, 4, 2, 2);
    const std::vector<float> want0 = {5, -9, -inf, -inf, -inf, -inf, -1, 6};
    EXPECT_EQ(std::vector<float>(m.begin(), m.begin() + 8), want0);
    // token 1: best experts 1, 3, 0, 1: group 1, then groups 0 and 3 tie at 1: the lower, 0
    const std::vector<float> want1 = {1, 1, 3, -1, -inf, -inf, -inf, -inf};
    EXPECT_EQ(std::vector<float>(m.begin() + 8, m.end()), want1);
    // K = 4 over M = 2: the sum of each group's two best (-4, 8, 0, 5) for token 0
    limit_to_groups(m.data(), s, 1, 8, 4, 2, 4);
    const std::vector<float> want2 = {-inf, -inf, 4, 4, -inf, -inf, -1, 6};
    EXPECT_EQ(std::vector<float>(m.begin(), m.begin() + 8), want2);
}

TEST(GatesTest, NodeLimitedRoutingKeepsEachTokenToItsBestGroups) {
    const int N = 64, C = 16, E = 16, K = 4, G = 4;
    const Inputs in = random_inputs(N, C, E, 11);
    std::vector<float> logits(static_cast<size_t>(N * E));
    for (int t = 0; t < N; ++t) {
        for (int e = 0; e < E; ++e) {
            double acc = 0;
            for (int c = 0; c < C; ++c) acc += double(in.inp[t * C + c]) * in.gate_w[e * C + c];
            logits[static_cast<size_t>(t * E + e)] = static_cast<float>(acc);
        }
    }
    for (const int M : {1, 2, 4}) {
        GateConfig g   = gate_of(GateKind::topk);
        g.route_nodes  = M;
        g.route_groups = G;
        Router r(C, E, K, 0.0, g, N, nullptr);
        r.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
        Router free(C, E, K, 0.0, gate_of(GateKind::topk), N, nullptr);
        free.forward(in.inp.data(), in.gate_w.data(), nullptr, N);
        std::vector<float> masked(static_cast<size_t>(N * E));
        limit_to_groups(masked.data(), logits.data(), N, E, G, M, K);
        std::vector<int32_t> top(static_cast<size_t>(N * K));
        rank_experts(top.data(), masked.data(), N, E, K);
        int limited = 0;
        for (int t = 0; t < N; ++t) {
            std::vector<int> groups;
            for (int k = 0; k < K; ++k) {
                const int32_t e = r.expert_idx()[t * K + k];
                EXPECT_EQ(e, top[static_cast<size_t>(t * K + k)]) << "M " << M << " token " << t;
                if (std::find(groups.begin(), groups.end(), e / (E / G)) == groups.end())
                    groups.push_back(e / (E / G));
                limited += e != free.expert_idx()[t * K + k];
            }
            EXPECT_LE(static_cast<int>(groups.size()), M) << "token " << t;
        }
        // M = G is no limit; M = 1 must change some token's experts
        if (M == G) {
            EXPECT_EQ(limited, 0);
        }
        if (M == 1) {
            EXPECT_GT(limited, 0);
        }
    }
}

TEST(GatesTest, RoutingUniformIsAPureFunctionOfItsKey) {
    const double u = routing_uniform(1, 2, 3, 4, 5, 6);
    EXPECT_EQ(u, routing_uniform(1, 2, 3, 4, 5, 6));
    EXPECT_NE(u, routing_uniform(1, 2, 3, 4, 6, 6));
    EXPECT_NE(u, routing_uniform(1, 3, 3, 4, 5, 6));
    double mean = 0;
    for (int i = 0; i < 10000; ++i) {
        const double v = routing_uniform(9, 0, 0, 1, i, 0);
        ASSERT_TRUE(v >= 0 && v < 1);
        mean += v / 10000;
    }
    EXPECT_NEAR(mean, 0.5, 0.02);
}

// ---- whole-model gradient check per gate ----

ModelConfig tiny(const std::string& gate, int K) {
    ModelConfig m     = testing::tiny_moe_config();
    m.top_k           = K;
    m.gate            = parse_enum<GateKind>(gate, "model.gate");
    m.capacity_factor = 1.0;
    m.jitter          = 0.1;
    return m;
}

// gate, K, virtual workers, balancing bias (a nonzero one: it moves the choice, not the weights)
class GateGradientTest : public ::testing::TestWithParam<std::tuple<const char*, int, int, bool>> {
};

TEST_P(GateGradientTest, FullGradientMatchesCentralDifferences) {
    const auto [gate, K, vw, bias] = GetParam();
    ModelConfig m                  = tiny(gate, K);
    if (bias) m.balance_bias_rate = 1e-3;
    const int B = 2, T = 12;
    model::GPT gpt(m, B, nullptr, vw);
    model::init_params(gpt.params(), gpt.layout(), m, 7);
    Rng rng(99);
    for (size_t i = 0; i < gpt.n_floats(); ++i)
        gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
    BalanceBiases bias_values(gpt.moe_layers().size(),
                              std::vector<float>(static_cast<size_t>(m.n_experts), 0.0f));
    if (bias) {  // from its own stream: the tokens below stay those of the run without bias
        Rng brng(3);
        for (auto& layer : bias_values) {
            for (float& v : layer) v = static_cast<float>(0.2 * brng.normal());
        }
    }
    gpt.set_balance_biases(bias_values);
    std::vector<int32_t> x(B * T), y(B * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(61));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(61));
    gpt.set_routing_context(kTrain);
    auto objective = [&] { return gpt.forward(x.data(), y.data(), B, T) + gpt.aux_loss(); };
    objective();
    gpt.zero_grad();
    gpt.backward(1.0f);
    const std::vector<float> grad(gpt.grads(), gpt.grads() + gpt.n_floats());
    // Routing is piecewise constant in the parameters: a difference whose step changes any
    // slot's expert (or drop), or the top-k choice counts the aux loss reads (under SWIPE a
    // choice can flip while the final expert stays), crosses into another piece and is not a
    // derivative. Such a direction is retried with a quarter of the step, and skipped if it
    // still crosses.
    auto routing = [&] {
        std::vector<int32_t> r;
        for (const auto& layer : gpt.moe_layers()) {
            r.insert(r.end(), layer->expert_idx(), layer->expert_idx() + B * T * K);
            for (const int64_t c : layer->routing_stats().topk_per_expert)
                r.push_back(static_cast<int32_t>(c));
        }
        return r;
    };
    if (bias) {  // the same model without its bias routes otherwise
        const BalanceBiases zero(bias_values.size(),
                                 std::vector<float>(static_cast<size_t>(m.n_experts), 0.0f));
        gpt.set_balance_biases(zero);
        objective();
        const std::vector<int32_t> unbiased = routing();
        gpt.set_balance_biases(bias_values);
        objective();
        EXPECT_NE(routing(), unbiased) << "the bias must move some choice";
    }
    objective();
    const std::vector<int32_t> base = routing();
    const RoutingStats& st          = gpt.moe_layers()[0]->routing_stats();
    const std::string name          = gate;
    EXPECT_TRUE(st.dropped > 0 || (name != "switch" && name != "gshard"));
    EXPECT_TRUE(st.reassigned > 0 || name != "swipe");
    int checked = 0, skipped = 0;
    for (const model::ParamSpec& s : gpt.layout().specs()) {
        double gnorm = 0;
        for (size_t i = 0; i < s.numel; ++i)
            gnorm += double(grad[s.offset + i]) * grad[s.offset + i];
        gnorm = std::sqrt(gnorm);
        if (gnorm < 1e-3) continue;
        std::vector<float> saved(gpt.params() + s.offset, gpt.params() + s.offset + s.numel);
        bool crossed = false;
        auto shift   = [&](double t) {
            for (size_t i = 0; i < s.numel; ++i) {
                gpt.params()[s.offset + i] =
                    saved[i] + static_cast<float>(t * grad[s.offset + i] / gnorm);
            }
            const double v = objective();
            crossed        = crossed || routing() != base;
            return v;
        };
        double h = 1e-2, num = 0;
        for (int attempt = 0; attempt < 2; ++attempt, h /= 4) {
            crossed = false;
            num     = (shift(h) - shift(-h)) / (2 * h);
            if (!crossed) break;
        }
        std::copy(saved.begin(), saved.end(), gpt.params() + s.offset);
        if (crossed) {
            ++skipped;
            continue;
        }
        // float32 forward: ~1e-6 relative noise in the loss, so 2e-4 absolute at h = 1e-2
        EXPECT_NEAR(gnorm, num, 2e-4 * 1e-2 / h + 2e-2 * gnorm)
            << gate << ": " << s.name << " along its gradient";
        ++checked;
    }
    // a skip is a near-tie of some token's scores; with the bias the noisy gate has 4 of 41
    EXPECT_LE(skipped, bias ? 4 : 3);
    std::printf("%s: %d tensors checked, %d skipped\n", gate, checked, skipped);
    EXPECT_GT(checked, 20);
}

INSTANTIATE_TEST_SUITE_P(
    Gates, GateGradientTest,
    ::testing::Values(std::make_tuple("topk", 2, 1, false), std::make_tuple("switch", 1, 1, false),
                      std::make_tuple("gshard", 2, 1, false), std::make_tuple("noisy", 2, 1, false),
                      std::make_tuple("swipe", 2, 2, false), std::make_tuple("topk", 2, 1, true),
                      std::make_tuple("switch", 1, 1, true), std::make_tuple("gshard", 2, 1, true),
                      std::make_tuple("noisy", 2, 1, true), std::make_tuple("swipe", 2, 2, true)),
    [](const auto& p) {
        return std::string(std::get<0>(p.param)) + (std::get<3>(p.param) ? "_bias" : "");
    });

}  // namespace
}  // namespace bagualu::moe

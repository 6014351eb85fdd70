// Whole-model tests: full gradient check by central differences, KV-cache generation against
// the full forward, overfitting two fixed batches, and determinism across thread counts.
#include "model/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "../../common/tiny_model.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "model/generate.h"

namespace bagualu::model {
namespace {

ModelConfig tiny_config() { return testing::tiny_moe_config(); }

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    return t;
}

// The objective backward differentiates: CE + aux.
double objective(GPT& gpt, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int B,
                 int T) {
    const double ce = gpt.forward(x.data(), y.data(), B, T);
    return ce + gpt.aux_loss();
}

void expect_generation_matches_forward(const ModelConfig& m, const moe::BalanceBiases& biases = {});

void expect_gradient_matches_central_differences(const ModelConfig& m) {
    const int B = 2, T = 12;
    GPT gpt(m, B);
    init_params(gpt.params(), gpt.layout(), m, 7);
    // Larger weights than the 0.02 init so every path carries a visible gradient.
    Rng rng(99);
    for (size_t i = 0; i < gpt.n_floats(); ++i)
        gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
    const auto x = random_tokens(B * T, m.vocab_size, 1);
    const auto y = random_tokens(B * T, m.vocab_size, 2);

    objective(gpt, x, y, B, T);
    gpt.zero_grad();
    gpt.backward(1.0f);
    std::vector<float> grad(gpt.grads(), gpt.grads() + gpt.n_floats());

    // Float32 forward: the loss carries ~1e-6 relative rounding noise, so with h = 1e-2 a
    // central difference is good to ~1e-4 absolute; tolerances below are set from that.
    const double h = 1e-2;
    auto fd        = [&](size_t i) {
        float* p   = gpt.params() + i;
        float orig = *p;
        *p         = orig + static_cast<float>(h);
        double lp  = objective(gpt, x, y, B, T);
        *p         = orig - static_cast<float>(h);
        double lm  = objective(gpt, x, y, B, T);
        *p         = orig;
        return (lp - lm) / (2 * h);
    };
    int checked = 0;
    for (const ParamSpec& s : gpt.layout().specs()) {
        // the three largest-gradient entries of every tensor, one by one
        std::vector<size_t> idx(s.numel);
        std::iota(idx.begin(), idx.end(), s.offset);
        const size_t k = std::min<size_t>(3, s.numel);
        std::partial_sort(
            idx.begin(), idx.begin() + static_cast<long>(k), idx.end(),
            [&](size_t a, size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
        for (size_t j = 0; j < k; ++j) {
            const double num = fd(idx[j]);
            const double ana = grad[idx[j]];
            EXPECT_NEAR(ana, num, 2e-4 + 3e-2 * std::fabs(num))
                << s.name << " element " << idx[j] - s.offset;
            ++checked;
        }
        // the directional derivative along the tensor's own gradient: |g| exactly
        double gnorm = 0;
        for (size_t i = 0; i < s.numel; ++i)
            gnorm += double(grad[s.offset + i]) * grad[s.offset + i];
        gnorm = std::sqrt(gnorm);
        if (gnorm < 1e-3) continue;
        std::vector<float> saved(gpt.params() + s.offset, gpt.params() + s.offset + s.numel);
        auto shift = [&](double t) {
            for (size_t i = 0; i < s.numel; ++i) {
                gpt.params()[s.offset + i] =
                    saved[i] + static_cast<float>(t * grad[s.offset + i] / gnorm);
            }
            return objective(gpt, x, y, B, T);
        };
        const double num = (shift(h) - shift(-h)) / (2 * h);
        std::copy(saved.begin(), saved.end(), gpt.params() + s.offset);
        EXPECT_NEAR(gnorm, num, 2e-4 + 2e-2 * gnorm) << s.name << " along its gradient";
    }
    EXPECT_GT(checked, 40);
}

TEST(GptTest, FullGradientMatchesCentralDifferences) {
    expect_gradient_matches_central_differences(tiny_config());
}

// Routed experts narrower than the dense MLP (model.expert_d_ff), with a shared expert of a third
// width: every tensor has its own width, and the gradient and generation hold.
TEST(GptTest, ExpertsOfTheirOwnWidth) {
    ModelConfig m      = tiny_config();
    m.expert_d_ff      = 10;
    m.n_shared_experts = 1;
    m.shared_d_ff      = 14;
    GPT gpt(m, 1);
    std::set<std::string> seen;
    for (const ParamSpec& s : gpt.layout().specs()) {
        const bool expert  = s.name.find(".moe.experts.") != std::string::npos;
        const bool shared  = s.name.find(".moe.shared.") != std::string::npos;
        const bool mlp     = s.name.find(".mlp.") != std::string::npos;
        const size_t width = expert ? 10 : shared ? 14 : 24;
        if (s.name.find("c_fc.weight") != std::string::npos && (expert || shared || mlp)) {
            EXPECT_EQ(s.numel, width * 16) << s.name;
            seen.insert(expert ? "expert" : shared ? "shared" : "mlp");
        }
    }
    EXPECT_EQ(seen.size(), 3u);
    expect_gradient_matches_central_differences(m);
    expect_generation_matches_forward(m);
}

TEST(GptTest, BackwardAccumulatesIntoGrads) {
    const ModelConfig m = tiny_config();
    GPT gpt(m, 1);
    init_params(gpt.params(), gpt.layout(), m, 3);
    const auto x = random_tokens(8, m.vocab_size, 5), y = random_tokens(8, m.vocab_size, 6);
    gpt.zero_grad();
    gpt.forward(x.data(), y.data(), 1, 8);
    gpt.backward(1.0f);
    std::vector<float> once(gpt.grads(), gpt.grads() + gpt.n_floats());
    gpt.forward(x.data(), y.data(), 1, 8);
    gpt.backward(1.0f);
    for (size_t i = 0; i < once.size(); ++i)
        ASSERT_NEAR(gpt.grads()[i], 2 * once[i], 1e-6 + 1e-5 * std::fabs(once[i]));
}

// Generation one token at a time gives the full forward's logits at every position, for every
// routing rule inference keeps: shared experts, sigmoid scores, node-limited routing, switch's
// full-softmax weight, and experts of another width than the dense MLP.
void expect_generation_matches_forward(const ModelConfig& m, const moe::BalanceBiases& biases) {
    GPT gpt(m, 1);
    init_params(gpt.params(), gpt.layout(), m, 11);
    if (!biases.empty()) gpt.set_balance_biases(biases);
    const int T  = m.seq_len;
    const auto x = random_tokens(T, m.vocab_size, 12), y = random_tokens(T, m.vocab_size, 13);
    gpt.forward(x.data(), y.data(), 1, T);
    Generator gen(m, gpt.params(), biases);
    for (int t = 0; t < T; ++t) {
        const float* lg = gen.step(x[static_cast<size_t>(t)]);
        for (int v = 0; v < m.vocab_size; ++v) {
            // same math, different summation order (single row vs blocked GEMM): 1e-4 is ample
            ASSERT_NEAR(lg[v], gpt.logits()[static_cast<size_t>(t) * m.vocab_size + v], 1e-4)
                << "position " << t << " token " << v;
        }
    }
}

TEST(GptTest, KvCacheGenerationMatchesFullForward) {
    expect_generation_matches_forward(tiny_config());
}

TEST(GptTest, KvCacheGenerationWithSharedExperts) {
    ModelConfig m      = tiny_config();
    m.n_shared_experts = 2;
    m.shared_d_ff      = 20;
    expect_generation_matches_forward(m);
}

TEST(GptTest, KvCacheGenerationWithSigmoidScores) {
    ModelConfig m  = tiny_config();
    m.router_score = RouterScore::sigmoid;
    expect_generation_matches_forward(m);
}

// 8 experts in 4 groups, top-3 kept to each token's 2 best groups.
ModelConfig node_limited_config() {
    ModelConfig m  = tiny_config();
    m.n_experts    = 8;
    m.top_k        = 3;
    m.route_groups = 4;
    m.route_nodes  = 2;
    return m;
}

TEST(GptTest, KvCacheGenerationWithNodeLimitedRouting) {
    expect_generation_matches_forward(node_limited_config());
}

// Everything of a fine-grained model at once: biased choice kept to the best groups, sigmoid
// weights, a shared expert.
TEST(GptTest, KvCacheGenerationWithBiasGroupsSigmoidAndSharedExpert) {
    ModelConfig m       = node_limited_config();
    m.router_score      = RouterScore::sigmoid;
    m.n_shared_experts  = 1;
    m.balance_bias_rate = 0.01;
    Rng rng(5);
    moe::BalanceBiases biases(1, std::vector<float>(8));
    for (float& b : biases[0]) b = static_cast<float>(rng.uniform() - 0.5);
    expect_generation_matches_forward(m, biases);
}

TEST(GptTest, KvCacheGenerationWithSwitchGate) {
    ModelConfig m = tiny_config();
    m.gate        = GateKind::switch_top1;
    m.top_k       = 1;
    expect_generation_matches_forward(m);
}

TEST(GptTest, OverfitsTwoFixedBatches) {
    ModelConfig m   = tiny_config();
    m.aux_loss_coef = 0.01;
    m.vocab_size    = 64;
    m.d_model       = 32;
    m.d_ff          = 64;
    const int B = 2, T = 12;
    GPT gpt(m, B);
    init_params(gpt.params(), gpt.layout(), m, 1);
    std::vector<float> am(gpt.n_floats()), av(gpt.n_floats());
    const std::vector<int32_t> xs[2] = {random_tokens(B * T, m.vocab_size, 21),
                                        random_tokens(B * T, m.vocab_size, 22)};
    const std::vector<int32_t> ys[2] = {random_tokens(B * T, m.vocab_size, 23),
                                        random_tokens(B * T, m.vocab_size, 24)};
    double loss[2]                   = {0, 0};
    for (int step = 0; step < 300; ++step) {
        const int b = step % 2;
        gpt.zero_grad();
        loss[b] = gpt.forward(xs[b].data(), ys[b].data(), B, T);
        gpt.backward(1.0f);
        kernels::adamw_update(gpt.params(), gpt.grads(), am.data(), av.data(), gpt.n_floats(),
                              1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step + 1);
    }
    EXPECT_LT(loss[0], 0.1);
    EXPECT_LT(loss[1], 0.1);
}

TEST(GptTest, ResultsDoNotDependOnThreadCount) {
    const ModelConfig m = tiny_config();
    const auto x = random_tokens(24, m.vocab_size, 31), y = random_tokens(24, m.vocab_size, 32);
    std::vector<float> grads[2];
    double losses[2];
    for (int r = 0; r < 2; ++r) {
        set_compute_threads(r + 1);
        GPT gpt(m, 2);
        init_params(gpt.params(), gpt.layout(), m, 4);
        gpt.zero_grad();
        losses[r] = gpt.forward(x.data(), y.data(), 2, 12);
        gpt.backward(1.0f);
        grads[r].assign(gpt.grads(), gpt.grads() + gpt.n_floats());
    }
    set_compute_threads(0);
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace
}  // namespace bagualu::model

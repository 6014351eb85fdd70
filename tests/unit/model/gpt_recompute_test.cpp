// GPT with train.recompute = moe / block against none: the same losses, aux losses, gradients
// and routing statistics bit for bit, for every gate (their randomness included) and under the
// bf16 policy; and the activation arena sized for what each mode keeps. The moda suite checks
// the same over whole runs, on one rank and under mpirun with EP = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "../../common/tiny_model.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace bagualu::model {
namespace {

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    return t;
}

// 4 blocks, MoE at 1 and 3: two MoE layers, so that moe mode runs one of them again (the last
// is still in the buffers); block mode runs blocks 0-2 again.
ModelConfig two_moe_config(GateKind gate) {
    ModelConfig m = testing::tiny_moe_config();
    m.n_layer     = 4;
    m.gate        = gate;
    if (gate == GateKind::switch_top1) m.top_k = 1;
    if (gate == GateKind::noisy || gate == GateKind::topk) m.jitter = 0.2;
    if (gate == GateKind::switch_top1) m.capacity_factor = 0.8;  // drops slots
    return m;
}

struct Result {
    std::vector<double> loss, aux;
    std::vector<float> grads;
    std::vector<int64_t> stats;  // per MoE layer: tokens per expert, dropped, reassigned
    int rounds = 0;              // the most rounds a MoE layer's forward took
};

// B x T tokens per micro-step; head_rows: the fused head's block (0: unfused); biases: the
// balancing biases to route with (none: zero).
Result train_two_micro_steps(const ModelConfig& m, Recompute rc, const PrecisionPolicy& prec,
                             int B = 2, int T = 12, int head_rows = 0,
                             const moe::BalanceBiases& biases = {}) {
    GPT gpt(m, B, nullptr, /*virtual_workers=*/2, prec, head_rows, rc);
    init_params(gpt.params(), gpt.layout(), m, 7);
    gpt.set_balance_biases(biases);
    gpt.zero_grad();
    Result r;
    for (int micro = 0; micro < 2; ++micro) {
        const auto x = random_tokens(B * T, m.vocab_size, 10 + static_cast<uint64_t>(micro));
        const auto y = random_tokens(B * T, m.vocab_size, 20 + static_cast<uint64_t>(micro));
        gpt.set_routing_context({99, micro, true});
        r.loss.push_back(gpt.forward(x.data(), y.data(), B, T));
        r.aux.push_back(gpt.aux_loss());
        for (const auto& layer : gpt.moe_layers()) r.rounds = std::max(r.rounds, layer->rounds());
        gpt.backward(0.5f);
        for (const auto& layer : gpt.moe_layers()) {
            const moe::RoutingStats& s = layer->routing_stats();
            r.stats.insert(r.stats.end(), s.tokens_per_expert.begin(), s.tokens_per_expert.end());
            r.stats.push_back(s.dropped);
            r.stats.push_back(s.reassigned);
        }
    }
    r.grads.assign(gpt.grads(), gpt.grads() + gpt.n_floats());
    return r;
}

PrecisionPolicy bf16_policy() {
    PrecisionSection p;  // the default levels: embedding O0, attention O1, ffn O2, head O1
    p.dtype = Dtype::bfloat16;
    return PrecisionPolicy::from_config(p);
}

void expect_bitwise_same(const ModelConfig& m, const PrecisionPolicy& prec) {
    const Result none = train_two_micro_steps(m, Recompute::none, prec);
    for (Recompute rc : {Recompute::moe, Recompute::block}) {
        SCOPED_TRACE(name_of(rc));
        const Result r = train_two_micro_steps(m, rc, prec);
        EXPECT_EQ(r.loss, none.loss);
        EXPECT_EQ(r.aux, none.aux);
        EXPECT_EQ(r.stats, none.stats);
        ASSERT_EQ(r.grads.size(), none.grads.size());
        size_t differ = 0;
        for (size_t i = 0; i < r.grads.size(); ++i) differ += r.grads[i] != none.grads[i];
        EXPECT_EQ(differ, 0u) << "of " << r.grads.size() << " gradient floats";
    }
}

class GptRecomputeGates : public ::testing::TestWithParam<GateKind> {};

TEST_P(GptRecomputeGates, BitwiseSameAsKeepingEverything) {
    expect_bitwise_same(two_moe_config(GetParam()), PrecisionPolicy{});
}

INSTANTIATE_TEST_SUITE_P(AllGates, GptRecomputeGates,
                         ::testing::Values(GateKind::topk, GateKind::switch_top1, GateKind::gshard,
                                           GateKind::noisy, GateKind::swipe),
                         [](const auto& p) { return std::string(name_of(p.param)); });

// Sigmoid scores: their backward reads the logits, which the layers share (moe::RouterKept)
// when their forward runs again.
TEST(GptRecompute, BitwiseSameWithSigmoidScores) {
    ModelConfig m   = two_moe_config(GateKind::topk);
    m.router_score  = RouterScore::sigmoid;
    m.aux_loss_coef = 0;
    expect_bitwise_same(m, PrecisionPolicy{});
}

TEST(GptRecompute, BitwiseSameUnderTheBf16Policy) {
    expect_bitwise_same(two_moe_config(GateKind::noisy), bf16_policy());
}

// Bounded MoE memory: with a row budget of half the balanced load every MoE layer runs its
// experts in rounds, and moe / block recomputation run the same rounds again; with shared
// experts, the balancing bias, the z-loss and the fused head on as well, every mode and budget
// gives the unbounded, keep-everything bits.
TEST(GptRecompute, BitwiseSameWithRoundsSharedExpertsBiasAndFusedHead) {
    ModelConfig m        = two_moe_config(GateKind::topk);
    m.seq_len            = 64;
    m.n_shared_experts   = 1;
    m.shared_d_ff        = 20;
    m.router_z_loss_coef = 0.01;
    m.balance_bias_rate  = 0.001;
    const int B = 4, T = 64;  // N K = 512 routed rows per MoE layer, budget 256: two rounds
    const moe::BalanceBiases biases = {{0.05f, -0.1f, 0.0f, 0.02f}, {-0.03f, 0.0f, 0.08f, -0.01f}};
    const Result none = train_two_micro_steps(m, Recompute::none, PrecisionPolicy{}, B, T,
                                              /*head_rows=*/0, biases);
    for (const RouteOverride ro : {RouteOverride::none, RouteOverride::one_expert}) {
        ModelConfig mr    = m;
        mr.route_override = ro;
        const Result ref =
            train_two_micro_steps(mr, Recompute::none, PrecisionPolicy{}, B, T, 0, biases);
        mr.moe_rows_budget = 0.5;
        for (Recompute rc : {Recompute::none, Recompute::moe, Recompute::block}) {
            for (const int head_rows : {0, 768}) {  // 768: the fused head's row multiple
                SCOPED_TRACE(::testing::Message() << name_of(rc) << " route " << name_of(ro)
                                                  << " head_rows " << head_rows);
                const Result r =
                    train_two_micro_steps(mr, rc, PrecisionPolicy{}, B, T, head_rows, biases);
                EXPECT_EQ(r.loss, ref.loss);
                EXPECT_EQ(r.aux, ref.aux);
                EXPECT_EQ(r.stats, ref.stats);
                EXPECT_EQ(r.grads, ref.grads);
                EXPECT_GT(r.rounds, 1);
            }
        }
        if (ro == RouteOverride::none) {
            EXPECT_EQ(ref.grads, none.grads);
        }
    }
}

TEST(GptRecompute, DenseModelBlockMode) {
    ModelConfig m      = two_moe_config(GateKind::topk);
    m.moe_every        = 0;
    const Result none  = train_two_micro_steps(m, Recompute::none, PrecisionPolicy{});
    const Result block = train_two_micro_steps(m, Recompute::block, PrecisionPolicy{});
    EXPECT_EQ(block.loss, none.loss);
    EXPECT_EQ(block.grads, none.grads);
}

// The arena keeps L + 1 block inputs and, with block, one block's working set instead of L.
TEST(GptRecompute, ArenaKeepsOneBlockWorkingSet) {
    const ModelConfig m = two_moe_config(GateKind::topk);  // blocks 0, 2 dense; 1, 3 MoE
    const int64_t mb    = 3;
    const size_t N = static_cast<size_t>(mb * m.seq_len), C = 16, F = 24, NH = 2;
    const auto slice = [](size_t n) { return (n + 15) / 16 * 16; };  // 64-byte slices
    // ln1 atty res1 ln2 (N, C); qkv (N, 3C); two means, two rstds (N); lse (N, NH)
    const size_t moe_block   = 4 * slice(N * C) + slice(N * 3 * C) + 4 * slice(N) + slice(N * NH);
    const size_t dense_block = moe_block + slice(N * F);  // fch (N, F)
    const size_t none        = activation_floats(m, mb, 0, Recompute::none);
    const size_t block       = activation_floats(m, mb, 0, Recompute::block);
    EXPECT_EQ(activation_floats(m, mb, 0, Recompute::moe), none);  // moe shares the MoE buffers
    EXPECT_EQ(none - block, dense_block + 2 * moe_block);          // 4 working sets -> 1 (dense)
    EXPECT_LT(block, none);
}

}  // namespace
}  // namespace bagualu::model

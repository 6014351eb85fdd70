// GPT with train.recompute = moe / block against none: the same losses, aux losses, gradients
// and routing statistics bit for bit, for every gate (their randomness included) and under the
// bf16 policy; and the activation arena sized for what each mode keeps. The moda suite checks
// the same over whole runs, on one rank and under mpirun with EP = 2.
#include <gtest/gtest.h>

#include <vector>

#include "../../common/tiny_model.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace bagualu::model {
namespace {

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
    Rng                  rng(seed);
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
    std::vector<double>  loss, aux;
    std::vector<float>   grads;
    std::vector<int64_t> stats;  // per MoE layer: tokens per expert, dropped, reassigned
};

Result train_two_micro_steps(const ModelConfig& m, Recompute rc, const PrecisionPolicy& prec) {
    const int B = 2, T = 12;
    GPT       gpt(m, B, nullptr, /*virtual_workers=*/2, prec, rc);
    init_params(gpt.params(), gpt.layout(), m, 7);
    gpt.zero_grad();
    Result r;
    for (int micro = 0; micro < 2; ++micro) {
        const auto x = random_tokens(B * T, m.vocab_size, 10 + static_cast<uint64_t>(micro));
        const auto y = random_tokens(B * T, m.vocab_size, 20 + static_cast<uint64_t>(micro));
        gpt.set_routing_context({99, micro, true});
        r.loss.push_back(gpt.forward(x.data(), y.data(), B, T));
        r.aux.push_back(gpt.aux_loss());
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

TEST(GptRecompute, BitwiseSameUnderTheBf16Policy) {
    expect_bitwise_same(two_moe_config(GateKind::noisy), bf16_policy());
}

TEST(GptRecompute, DenseModelBlockMode) {
    ModelConfig m = two_moe_config(GateKind::topk);
    m.moe_every   = 0;
    const Result none  = train_two_micro_steps(m, Recompute::none, PrecisionPolicy{});
    const Result block = train_two_micro_steps(m, Recompute::block, PrecisionPolicy{});
    EXPECT_EQ(block.loss, none.loss);
    EXPECT_EQ(block.grads, none.grads);
}

// The arena keeps L + 1 block inputs and, with block, one block's working set instead of L.
TEST(GptRecompute, ArenaKeepsOneBlockWorkingSet) {
    const ModelConfig m  = two_moe_config(GateKind::topk);  // blocks 0, 2 dense; 1, 3 MoE
    const int64_t     mb = 3;
    const size_t      N = static_cast<size_t>(mb * m.seq_len), C = 16, F = 24, NH = 2;
    const auto slice = [](size_t n) { return (n + 15) / 16 * 16; };  // 64-byte slices
    // ln1 atty res1 ln2 (N, C); qkv (N, 3C); two means, two rstds (N); lse (N, NH)
    const size_t moe_block =
        4 * slice(N * C) + slice(N * 3 * C) + 4 * slice(N) + slice(N * NH);
    const size_t dense_block = moe_block + 2 * slice(N * F);  // fch, fcg (N, F)
    const size_t none  = activation_floats(m, mb, Recompute::none);
    const size_t block = activation_floats(m, mb, Recompute::block);
    EXPECT_EQ(activation_floats(m, mb, Recompute::moe), none);  // moe shares the MoE buffers
    EXPECT_EQ(none - block, dense_block + 2 * moe_block);       // 4 working sets -> 1 (dense)
    EXPECT_LT(block, none);
}

}  // namespace
}  // namespace bagualu::model

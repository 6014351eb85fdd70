// The fused LM head (GPT with head_rows > 0) against the unfused one: losses and gradients on
// ragged shapes (N = 1, 7, 129 tokens; blocks that do not divide N; V = 61, no multiple of
// anything), in float32 and in the bf16 policy; a central-difference gradient check of the
// fused model; the activation arena it saves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include "../../common/tiny_model.h"
#include "core/rng.h"
#include "kernels/gemm/dispatch.h"
#include "model/gpt.h"

namespace bagualu::model {
namespace {

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    return t;
}

struct Result {
    double loss;
    std::vector<float> grads;
};

Result run(const ModelConfig& m, int B, int T, int head_rows, const PrecisionPolicy& prec) {
    GPT gpt(m, B, nullptr, 1, prec, head_rows);
    init_params(gpt.params(), gpt.layout(), m, 7);
    Rng rng(99);
    for (size_t i = 0; i < gpt.n_floats(); ++i)
        gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
    const auto x = random_tokens(B * T, m.vocab_size, 1);
    const auto y = random_tokens(B * T, m.vocab_size, 2);
    Result r;
    r.loss = gpt.forward(x.data(), y.data(), B, T);
    gpt.zero_grad();
    gpt.backward(1.0f);
    r.grads.assign(gpt.grads(), gpt.grads() + gpt.n_floats());
    return r;
}

PrecisionPolicy bf16_policy() {
    PrecisionSection p;
    p.dtype = Dtype::bfloat16;
    return PrecisionPolicy::from_config(p);
}

// Every row of the head's GEMM sums over C in the same order whatever the number of rows, and
// cross-entropy is per row, so the losses and dx (hence every gradient but the tied wte's) are
// bitwise those of the unfused head. dwte sums N products per element: unfused in one GEMM
// over all N rows, fused block after block, an other order of float32 additions. Its error
// is bounded by about N * 2^-24 * sum |terms|; the tolerance 1e-5 * (max |dwte| + |g|) covers
// N <= 129 terms of magnitude at most max |dwte| with a margin.
void expect_matches(const ModelConfig& m, int B, int T, int head_rows,
                    const PrecisionPolicy& prec) {
    SCOPED_TRACE(::testing::Message() << "N = " << B * T << ", head_rows = " << head_rows);
    const Result u = run(m, B, T, 0, prec);
    const Result f = run(m, B, T, head_rows, prec);
    EXPECT_EQ(u.loss, f.loss);
    const ParamLayout lay = make_layout(m, 1, 0);
    const ParamSpec* wte  = lay.find("wte");
    ASSERT_NE(wte, nullptr);
    double gmax = 0;
    for (size_t i = 0; i < wte->numel; ++i)
        gmax = std::max(gmax, double(std::fabs(u.grads[wte->offset + i])));
    ASSERT_GT(gmax, 0.0);
    size_t wte_differ = 0;
    for (size_t i = 0; i < u.grads.size(); ++i) {
        const bool in_wte = i >= wte->offset && i < wte->offset + wte->numel;
        if (!in_wte) {
            ASSERT_EQ(u.grads[i], f.grads[i]) << "float " << i;
        } else {
            if (u.grads[i] != f.grads[i]) ++wte_differ;
            ASSERT_NEAR(u.grads[i], f.grads[i], 1e-5 * (gmax + std::fabs(u.grads[i])))
                << "wte float " << i - wte->offset;
        }
    }
    ::testing::Test::RecordProperty("wte_floats_differ", static_cast<int>(wte_differ));
}

TEST(FusedHeadTest, MatchesUnfusedOnRaggedShapesFloat32) {
    ModelConfig m = testing::tiny_moe_config();  // V = 61
    m.seq_len     = 43;
    expect_matches(m, 1, 1, 4, PrecisionPolicy{});     // N = 1: one partial block
    expect_matches(m, 1, 7, 4, PrecisionPolicy{});     // N = 7: 4 + 3
    expect_matches(m, 3, 43, 16, PrecisionPolicy{});   // N = 129: 8 blocks of 16 + 1
    expect_matches(m, 3, 43, 129, PrecisionPolicy{});  // one block: the unfused head exactly
    expect_matches(m, 3, 43, 500, PrecisionPolicy{});  // a block larger than N
}

TEST(FusedHeadTest, MatchesUnfusedOnRaggedShapesBf16Policy) {
    ModelConfig m = testing::tiny_moe_config();
    m.seq_len     = 43;
    expect_matches(m, 1, 1, 4, bf16_policy());
    expect_matches(m, 1, 7, 4, bf16_policy());
    expect_matches(m, 3, 43, 16, bf16_policy());
}

TEST(FusedHeadTest, OneBlockIsBitwiseTheUnfusedHead) {
    ModelConfig m  = testing::tiny_moe_config();
    const Result u = run(m, 2, 12, 0, PrecisionPolicy{});
    const Result f = run(m, 2, 12, 24, PrecisionPolicy{});
    EXPECT_EQ(u.loss, f.loss);
    EXPECT_EQ(u.grads, f.grads);
}

// Blocks of fused_head_rows (a multiple of every k block of our GEMMs) over N = 1600 tokens:
// 768 + 768 + 64 rows. dwte then sums the same k blocks in the same order as the unfused GEMM:
// every bit equal, in float32 and with bf16 head products, on each of our GEMM paths the CPU has.
TEST(FusedHeadTest, BlocksOfFusedHeadRowsGiveTheUnfusedBits) {
    ModelConfig m  = testing::tiny_moe_config();
    m.seq_len      = 400;
    const int rows = 768;  // the smallest block fused_head_rows gives, all of them its multiples
    for (int V : {61, 1000, 8192, 50257, 1 << 20}) {
        m.vocab_size = V;
        EXPECT_EQ(fused_head_rows(m) % rows, 0) << V;
    }
    m.vocab_size                    = 61;
    const kernels::gemm::Path saved = kernels::gemm::active_path();
    for (kernels::gemm::Path p : {kernels::gemm::Path::generic, kernels::gemm::Path::avx2,
                                  kernels::gemm::Path::avx512, kernels::gemm::Path::amx}) {
        if (!kernels::gemm::path_supported(p)) continue;
        kernels::gemm::set_active_path(p);
        for (const PrecisionPolicy& prec : {PrecisionPolicy{}, bf16_policy()}) {
            SCOPED_TRACE(kernels::gemm::path_name(p));
            const Result u = run(m, 4, 400, 0, prec);
            const Result f = run(m, 4, 400, rows, prec);
            EXPECT_EQ(u.loss, f.loss);
            EXPECT_EQ(u.grads, f.grads);
        }
    }
    kernels::gemm::set_active_path(saved);
}

// Central differences of the fused model's loss (float32 forward: with h = 1e-2 a difference is
// good to ~1e-4 absolute, as in gpt_test.cpp) against its backward, for the head's tensors
// (wte, ln_f) and the last block's input path.
TEST(FusedHeadTest, GradientMatchesCentralDifferences) {
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 1, T = 7;
    GPT gpt(m, B, nullptr, 1, PrecisionPolicy{}, 3);
    init_params(gpt.params(), gpt.layout(), m, 7);
    Rng rng(99);
    for (size_t i = 0; i < gpt.n_floats(); ++i)
        gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
    const auto x = random_tokens(B * T, m.vocab_size, 1);
    const auto y = random_tokens(B * T, m.vocab_size, 2);
    auto obj     = [&] { return gpt.forward(x.data(), y.data(), B, T) + gpt.aux_loss(); };
    obj();
    gpt.zero_grad();
    gpt.backward(1.0f);
    const std::vector<float> grad(gpt.grads(), gpt.grads() + gpt.n_floats());
    const double h = 1e-2;
    int checked    = 0;
    for (const char* name :
         {"wte", "ln_f.weight", "ln_f.bias", "h.1.ln_1.weight", "h.0.mlp.c_fc.weight"}) {
        const ParamSpec* s = gpt.layout().find(name);
        ASSERT_NE(s, nullptr) << name;
        std::vector<size_t> idx(s->numel);
        std::iota(idx.begin(), idx.end(), s->offset);
        const size_t k = std::min<size_t>(4, s->numel);
        std::partial_sort(
            idx.begin(), idx.begin() + static_cast<long>(k), idx.end(),
            [&](size_t a, size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
        for (size_t j = 0; j < k; ++j) {
            float* p         = gpt.params() + idx[j];
            const float orig = *p;
            *p               = orig + static_cast<float>(h);
            const double lp  = obj();
            *p               = orig - static_cast<float>(h);
            const double lm  = obj();
            *p               = orig;
            const double num = (lp - lm) / (2 * h);
            EXPECT_NEAR(grad[idx[j]], num, 2e-4 + 3e-2 * std::fabs(num))
                << name << " " << idx[j] - s->offset;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 4 * 5);
}

TEST(FusedHeadTest, ArenaHoldsOneBlockOfLogits) {
    ModelConfig m  = testing::tiny_moe_config();
    const size_t B = 2, N = B * static_cast<size_t>(m.seq_len),
                 V  = static_cast<size_t>(m.vocab_size);
    const auto pad  = [](size_t n) { return (n + 15) / 16 * 16; };  // the arena's 64-byte slices
    const int64_t b = static_cast<int64_t>(B);
    EXPECT_EQ(activation_floats(m, b) - activation_floats(m, b, 5), pad(N * V) - pad(5 * V));
    EXPECT_EQ(activation_floats(m, b, static_cast<int64_t>(N) + 7), activation_floats(m, b));
    m.vocab_size = 8192;
    EXPECT_EQ(fused_head_rows(m), 768);
    m.vocab_size = 1024;
    EXPECT_EQ(fused_head_rows(m), 3840);
    m.vocab_size = 1 << 20;
    EXPECT_EQ(fused_head_rows(m), 768);
}

// The unfused head with 16-bit products forms its output gradient in forward, a block of logits
// at a time, and keeps only its 16 bits (head_gradient_in_16_bits): the losses and every
// gradient are bitwise those of the model that keeps the (N, V) float logits
// (head_gradient_16bit(false)), on each GEMM path the CPU has, in bf16 and with the FP64
// cross-entropy, over several blocks and one ragged one; whether forward was told the backward's
// scale, was told another one, or none (backward then computes the logits again).
TEST(HeadGradient16, GivesTheFloatLogitsBits) {
    ModelConfig m = testing::tiny_moe_config();
    m.vocab_size  = 8192;  // blocks of 256 rows
    m.seq_len     = 200;
    const int B = 3, T = 200, N = B * T;  // 256 + 256 + 88 rows
    ASSERT_EQ(head_block_rows(m), 256);
    const auto x = random_tokens(N, m.vocab_size, 1);
    const auto y = random_tokens(N, m.vocab_size, 2);
    // forward with fwd_scale (none: not told), then backward with bwd_scale
    const auto run = [&](bool head16, const PrecisionPolicy& prec, std::optional<float> fwd_scale,
                         float bwd_scale) {
        head_gradient_16bit(head16);
        EXPECT_EQ(head_gradient_in_16_bits(prec, 0), head16);
        GPT gpt(m, B, nullptr, 1, prec);
        head_gradient_16bit(true);
        init_params(gpt.params(), gpt.layout(), m, 7);
        Rng rng(99);
        for (size_t i = 0; i < gpt.n_floats(); ++i)
            gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
        Result r;
        r.loss = gpt.forward(x.data(), y.data(), B, T, fwd_scale);
        gpt.zero_grad();
        gpt.backward(bwd_scale);
        r.grads.assign(gpt.grads(), gpt.grads() + gpt.n_floats());
        return r;
    };
    PrecisionPolicy fp64            = bf16_policy();
    fp64.fp64_sensitive             = true;
    const kernels::gemm::Path saved = kernels::gemm::active_path();
    int paths                       = 0;
    for (kernels::gemm::Path p : {kernels::gemm::Path::generic, kernels::gemm::Path::avx2,
                                  kernels::gemm::Path::avx512, kernels::gemm::Path::amx}) {
        if (!kernels::gemm::path_supported(p)) continue;
        kernels::gemm::set_active_path(p);
        ++paths;
        for (const PrecisionPolicy& prec : {bf16_policy(), fp64}) {
            SCOPED_TRACE(::testing::Message()
                         << kernels::gemm::path_name(p) << " fp64 " << prec.fp64_sensitive);
            const Result ref = run(false, prec, std::nullopt, 0.75f);
            ASSERT_GT(ref.loss, 0.0);
            for (const std::optional<float> told :
                 {std::optional<float>(0.75f), std::optional<float>(), std::optional(2.0f)}) {
                const Result r = run(true, prec, told, 0.75f);
                EXPECT_EQ(r.loss, ref.loss);
                EXPECT_EQ(r.grads, ref.grads);
            }
        }
    }
    kernels::gemm::set_active_path(saved);
    EXPECT_GE(paths, 1);
    // float32 and FP16 heads, and the fused head, keep their logits as floats
    PrecisionSection fp16;
    fp16.dtype = Dtype::float16;
    EXPECT_FALSE(head_gradient_in_16_bits(PrecisionPolicy{}, 0));
    EXPECT_FALSE(head_gradient_in_16_bits(PrecisionPolicy::from_config(fp16), 0));
    EXPECT_FALSE(head_gradient_in_16_bits(bf16_policy(), 768));
}

// Where the head forms its gradient in forward, the arena holds one block of float logits, the
// N x V gradient's 16 bits and ln_f's output as 16 bits: about half the (N, V) floats less.
TEST(HeadGradient16, ArenaHoldsABlockOfLogitsAndTheGradientsSixteenBits) {
    ModelConfig m  = testing::tiny_moe_config();
    m.vocab_size   = 8192;
    m.seq_len      = 200;
    const size_t B = 16, N = B * 200, V = 8192, C = static_cast<size_t>(m.d_model);
    const auto pad   = [](size_t n) { return (n + 15) / 16 * 16; };  // the arena's 64-byte slices
    const auto half  = [&](size_t n) { return pad((n + 1) / 2); };
    const size_t f32 = activation_floats(m, 16, 0, Recompute::none);
    const size_t h16 = activation_floats(m, 16, 0, Recompute::none, Dtype::float32, Dtype::float32,
                                         Dtype::float32, false, true);
    EXPECT_EQ(f32 - h16, pad(N * V) + pad(N * C) - pad(256 * V) - half(N * V) - half(N * C));
    EXPECT_GT(f32 - h16, N * V * 4 / 10);  // 3,200 rows against blocks of 256
    // the fused head is not changed by it
    EXPECT_EQ(activation_floats(m, 3, 768, Recompute::none, Dtype::float32, Dtype::float32,
                                Dtype::float32, false, true),
              activation_floats(m, 3, 768));
    m.vocab_size = 61;
    EXPECT_EQ(head_block_rows(m), (1 << 21) / 61);
    m.vocab_size = 1 << 20;
    EXPECT_EQ(head_block_rows(m), 64);
}

}  // namespace
}  // namespace bagualu::model

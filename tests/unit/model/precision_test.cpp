// Tests for the mixed-precision policy (model/precision.h) and the model under it: the storage
// dtype of every tensor per layer class, the float32 policy leaving the model's results bit for
// bit unchanged, a bf16 policy actually rounding (and staying close), and the FP64 sensitive
// ops agreeing with the float32 ones.
#include "model/precision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../common/tiny_model.h"
#include "../kernels/gemm_paths.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "kernels/mixed.h"
#include "model/gpt.h"

namespace bagualu::model {
namespace {

PrecisionPolicy bagualu_policy(Dtype dtype) {
    PrecisionSection p;  // the default levels: embedding O0, attention O1, ffn O2, head O1
    p.dtype = dtype;
    return PrecisionPolicy::from_config(p);
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(PrecisionPolicy, StorageDtypePerLayerClass) {
    const ModelConfig m      = testing::tiny_moe_config();
    const PrecisionPolicy bf = bagualu_policy(Dtype::bfloat16);
    const GPT gpt(m, 1, nullptr, 1, bf);
    size_t half = 0;
    for (size_t i = 0; i < gpt.layout().specs().size(); ++i) {
        const ParamSpec& s  = gpt.layout().spec(i);
        const std::string n = s.name;
        Dtype want =
            Dtype::float32;  // embedding O0, attention O1 (float32 weights), layernorms, gate
        if ((has(n, ".mlp.") || has(n, ".moe.experts.")) && !has(n, "ln_")) want = Dtype::bfloat16;
        EXPECT_EQ(gpt.storage_dtype(i), want) << n;
        EXPECT_EQ(bf.master_mode(s), want == Dtype::float32 ? MasterMode::none : MasterMode::master)
            << n;
        // O1 attention: float32 storage, bf16 GEMM operands for its matrices only
        const bool attn_matrix = has(n, ".attn.") && s.shape.size() == 2;
        EXPECT_EQ(bf.compute_dtype(s), attn_matrix ? Dtype::bfloat16 : want) << n;
        half += want != Dtype::float32;
    }
    EXPECT_EQ(half, 4u + 4u * 4u);  // dense MLP: 2 weights 2 biases; 4 experts x 4 tensors

    // fp32 ignores the levels; uniform O3 stores everything in the half type.
    const PrecisionPolicy f32 = bagualu_policy(Dtype::float32),
                          o3  = PrecisionPolicy::uniform(Dtype::float16, Level::O3);
    for (const ParamSpec& s : gpt.layout().specs()) {
        EXPECT_EQ(f32.storage_dtype(s), Dtype::float32) << s.name;
        EXPECT_EQ(f32.compute_dtype(s), Dtype::float32) << s.name;
        // the router stays float32 whatever the levels say
        const bool gate = has(s.name, ".moe.gate.");
        EXPECT_EQ(o3.storage_dtype(s), gate ? Dtype::float32 : Dtype::float16) << s.name;
        EXPECT_EQ(o3.compute_dtype(s), gate ? Dtype::float32 : Dtype::float16) << s.name;
        EXPECT_EQ(o3.master_mode(s), gate ? MasterMode::none : MasterMode::half) << s.name;
    }
    EXPECT_EQ(bf.describe(), "bf16: embedding O0, attention O1, ffn O2, head O1");
    EXPECT_EQ(f32.describe(), "fp32");
    PrecisionSection r64;
    r64.router = RouterPrecision::fp64;
    EXPECT_EQ(PrecisionPolicy::from_config(r64).describe(), "fp32, fp64 router");
    // router = "half": the run's half type in mixed precision, float32 in an fp32 run
    PrecisionSection rh;
    rh.router = RouterPrecision::half;
    EXPECT_EQ(PrecisionPolicy::from_config(rh).router_dtype(), Dtype::float32);
    EXPECT_EQ(PrecisionPolicy::from_config(rh).describe(), "fp32");
    rh.dtype = Dtype::bfloat16;
    EXPECT_EQ(PrecisionPolicy::from_config(rh).router_dtype(), Dtype::bfloat16);
    EXPECT_EQ(PrecisionPolicy::from_config(rh).describe(),
              "bf16: embedding O0, attention O1, ffn O2, head O1, half router");
}

struct Batch {
    std::vector<int32_t> x, y;
};
Batch random_batch(int n, int V) {
    Rng rng(5);
    Batch b{std::vector<int32_t>(size_t(n)), std::vector<int32_t>(size_t(n))};
    for (auto& t : b.x) t = int32_t(rng.below(uint64_t(V)));
    for (auto& t : b.y) t = int32_t(rng.below(uint64_t(V)));
    return b;
}

// Loss and gradients of one forward/backward under `prec`, on the same weights.
std::pair<double, std::vector<float>> loss_and_grads(const PrecisionPolicy& prec) {
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 2, T = m.seq_len;
    GPT gpt(m, B, nullptr, 1, prec);
    init_params(gpt.params(), gpt.layout(), m, 11);
    Rng rng(3);  // larger weights than the init, so every path carries signal
    for (size_t i = 0; i < gpt.n_floats(); ++i) gpt.params()[i] += float(0.1 * rng.normal());
    const Batch b     = random_batch(B * T, m.vocab_size);
    const double loss = gpt.forward(b.x.data(), b.y.data(), B, T);
    gpt.zero_grad();
    gpt.backward(1.0f);
    return {loss, std::vector<float>(gpt.grads(), gpt.grads() + gpt.n_floats())};
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        n += double(b[i]) * b[i];
    }
    return std::sqrt(d / n);
}

TEST(PrecisionModel, Fp32PolicyIsThePlainModel) {
    const auto [l0, g0] = loss_and_grads(PrecisionPolicy{});
    const auto [l1, g1] = loss_and_grads(bagualu_policy(Dtype::float32));
    EXPECT_EQ(l0, l1);
    EXPECT_EQ(g0, g1);
}

TEST(PrecisionModel, HalfPoliciesRoundAndStayClose) {
    const auto [l32, g32] = loss_and_grads(PrecisionPolicy{});
    for (const Dtype d : {Dtype::bfloat16, Dtype::float16}) {
        const char* dt    = dtype_name(d);
        const auto [l, g] = loss_and_grads(bagualu_policy(d));
        EXPECT_NE(l, l32) << dt << ": nothing was rounded";
        // bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3 per value); the loss
        // averages many rounded products, so it moves far less; fp16 (11 bits) less still.
        EXPECT_NEAR(l, l32, 5e-3 * l32) << dt;
        EXPECT_LE(rel_diff(g, g32), 5e-2) << dt;
    }
    // uniform O3 rounds everything: further from float32, still the same model
    const auto [l3, g3] = loss_and_grads(PrecisionPolicy::uniform(Dtype::bfloat16, Level::O3));
    EXPECT_NE(l3, l32);
    EXPECT_NEAR(l3, l32, 2e-2 * l32);
}

// The bf16 products on 16-bit copies (dense layers and the experts' grouped products; the
// default): where gemm_bf16 only widens, bitwise the float path's loss and gradients (products on
// the rounded floats, kernels::bf16_float_operands), so every operand the copies take already
// holds bf16 values; uniform O3 puts the router's neighbours and the head in half too. Where
// the CPU has 16-bit arithmetic both runs take the 16-bit path.
TEST(PrecisionModel, SixteenBitOperandsGiveTheFloatPathsBitsWhereGemmBf16Widens) {
    for (const PrecisionPolicy& p :
         {bagualu_policy(Dtype::bfloat16), PrecisionPolicy::uniform(Dtype::bfloat16, Level::O3)}) {
        kernels::bf16_float_operands(true);
        const auto [l0, g0] = loss_and_grads(p);
        kernels::bf16_float_operands(false);
        const auto [l1, g1] = loss_and_grads(p);
        EXPECT_EQ(l0, l1) << p.describe();
        EXPECT_EQ(g0, g1) << p.describe();
    }
}

// Q, K, V and the attention's output kept only as their 16 bits (attention_in_16_bits, head
// size 64): where the bf16 attention core reads them so (on this CPU's GEMM path where it runs
// the core), and where the float core reads them widened (the avx2 and generic paths, which
// round Q, K, V to bf16 either way): bitwise the loss and gradients of the same model keeping
// them as floats, with and without block recomputation, and 4 N C floats' worth of 16-bit
// values less a block.
void check_attention_kept16(const ModelConfig& m, const PrecisionPolicy& prec, const Batch& b,
                            int B, int T, const std::string& at) {
    for (const Recompute rc : {Recompute::none, Recompute::block}) {
        const auto run = [&](bool kept) {
            attention_16bit_activations(kept);
            GPT gpt(m, B, nullptr, 1, prec, 0, rc);
            attention_16bit_activations(true);
            init_params(gpt.params(), gpt.layout(), m, 11);
            Rng rng(3);
            for (size_t i = 0; i < gpt.n_floats(); ++i)
                gpt.params()[i] += float(0.1 * rng.normal());
            const double loss = gpt.forward(b.x.data(), b.y.data(), B, T);
            gpt.zero_grad();
            gpt.backward(1.0f);
            return std::pair{loss, std::vector<float>(gpt.grads(), gpt.grads() + gpt.n_floats())};
        };
        const auto [l0, g0] = run(false);
        const auto [l1, g1] = run(true);
        EXPECT_EQ(l1, l0) << at << " recompute " << static_cast<int>(rc);
        EXPECT_EQ(g1, g0) << at << " recompute " << static_cast<int>(rc);
    }
    const Dtype ga = prec.gemm_dtype(LayerClass::attention), gf = prec.gemm_dtype(LayerClass::ffn);
    const Dtype hidden = prec.act_dtype(LayerClass::ffn);
    const size_t NC    = size_t(B) * size_t(T) * size_t(m.d_model);
    const size_t f32   = activation_floats(m, B, 0, Recompute::none, hidden, ga, gf, false);
    const size_t h16   = activation_floats(m, B, 0, Recompute::none, hidden, ga, gf, true);
    EXPECT_EQ(f32 - h16, size_t(m.n_layer) * 2 * NC);  // (3 N C + N C) / 2 floats a block
}

TEST(PrecisionModel, AttentionKeptInSixteenBitsGivesTheFloatActivationsBits) {
    ModelConfig m = testing::tiny_moe_config();
    m.d_model     = 128;
    m.n_head      = 2;
    m.seq_len     = 45;
    m.d_ff        = 64;
    const int B = 2, T = m.seq_len;
    const PrecisionPolicy prec = bagualu_policy(Dtype::bfloat16);
    const Batch b              = random_batch(B * T, m.vocab_size);
    const kernels::testing::PathGuard guard;
    for (const kernels::gemm::Path path :
         {kernels::gemm::active_path(), kernels::gemm::Path::avx2, kernels::gemm::Path::generic}) {
        if (!kernels::gemm::path_supported(path)) continue;
        kernels::gemm::set_active_path(path);
        const std::string at = kernels::gemm::path_name(path);
        ASSERT_TRUE(attention_in_16_bits(m, prec)) << at;
        check_attention_kept16(m, prec, b, B, T, at);
    }
}

// bf16's O2 masters in the parameters themselves (GPT::keep_masters_in_place with the replicated
// optimizer's masters_in_place): bitwise the losses of the model whose parameters hold the
// rounded values beside the optimizer's FP32 masters, step after step, each O2 parameter that
// master (its rounding the other model's parameter) and the rest the same; the policy's other
// dtypes (fp16) and ParO keep masters beside. A value written after the call is kept as it is
// (a checkpoint's master), and forward computes with its rounding.
TEST(PrecisionModel, MastersInPlaceGiveTheMastersBesideBits) {
    const kernels::testing::PathGuard guard;
    // the third case: the products on the rounded floats (the avx2 path with
    // kernels::bf16_float_operands), where the O2 matrices are read from rounded copies too
    const bool avx2 = kernels::gemm::path_supported(kernels::gemm::Path::avx2);
    for (const int c : {0, 1, 2}) {
        if (c == 2 && !avx2) continue;
        const bool shared = c == 1;
        if (c == 2) {
            kernels::gemm::set_active_path(kernels::gemm::Path::avx2);
            kernels::bf16_float_operands(true);
        }
        ModelConfig m = testing::tiny_moe_config();
        if (shared) m.n_shared_experts = 1;
        const int B = 2, T = m.seq_len;
        const PrecisionPolicy prec = bagualu_policy(Dtype::bfloat16);
        const TrainConfig cfg      = default_config({"precision.dtype=bf16", "train.grad_clip=1"});
        auto par                   = dist::ParallelContext::single();
        const Batch b              = random_batch(B * T, m.vocab_size);
        GPT beside(m, B, nullptr, 1, prec), inside(m, B, nullptr, 1, prec);
        init_params(beside.params(), beside.layout(), m, 11);
        init_params(inside.params(), inside.layout(), m, 11);
        EXPECT_FALSE(inside.masters_in_place());
        inside.keep_masters_in_place();
        EXPECT_TRUE(inside.masters_in_place());
        auto opt_b = dist::paro::make_optimizer(cfg, beside.layout(), *par, prec);
        auto opt_i = dist::paro::make_optimizer(cfg, inside.layout(), *par, prec, nullptr, true);
        EXPECT_LT(opt_i->footprint().optim_bytes, opt_b->footprint().optim_bytes);
        for (int step = 1; step <= 3; ++step) {
            const double lb = beside.forward(b.x.data(), b.y.data(), B, T);
            const double li = inside.forward(b.x.data(), b.y.data(), B, T);
            ASSERT_EQ(li, lb) << "step " << step << " case " << c;
            for (GPT* g : {&beside, &inside}) {
                g->zero_grad();
                g->backward(1.0f);
            }
            ASSERT_EQ(std::vector<float>(inside.grads(), inside.grads() + inside.n_floats()),
                      std::vector<float>(beside.grads(), beside.grads() + beside.n_floats()));
            opt_b->step(beside.params_rounded_update(), beside.grads(), 1e-2, step);
            opt_i->step(inside.params_rounded_update(), inside.grads(), 1e-2, step);
        }
        size_t masters = 0;
        for (size_t i = 0; i < inside.layout().specs().size(); ++i) {
            const ParamSpec& s = inside.layout().spec(i);
            const float* pi    = inside.params() + s.offset;
            const float* pb    = beside.params() + s.offset;
            const bool o2      = prec.master_mode(s) == MasterMode::master;
            masters += o2 ? s.numel : 0;
            for (size_t k = 0; k < s.numel; ++k) {
                ASSERT_EQ(o2 ? round_to(Dtype::bfloat16, pi[k]) : pi[k], pb[k]) << s.name;
            }
        }
        EXPECT_GT(masters, 0u);
        // a master written through params() after the call: kept, and computed with as its
        // rounding (the other model's parameter)
        const ParamSpec& fc        = *inside.layout().find("h.0.mlp.c_fc.weight");
        inside.params()[fc.offset] = 1.0f + 1.0f / 4096;
        beside.params()[fc.offset] = 1.0f;
        EXPECT_EQ(inside.forward(b.x.data(), b.y.data(), B, T),
                  beside.forward(b.x.data(), b.y.data(), B, T));
        EXPECT_EQ(inside.params()[fc.offset], 1.0f + 1.0f / 4096);
        EXPECT_EQ(inside.o1_copies(), c == 2);
        kernels::bf16_float_operands(false);
    }
    GPT fp16(testing::tiny_moe_config(), 2, nullptr, 1, bagualu_policy(Dtype::float16));
    EXPECT_ANY_THROW(fp16.keep_masters_in_place());
    EXPECT_FALSE(masters_in_place(bagualu_policy(Dtype::float16), false));
}

// Forward computes with the weights as the policy rounds them, without a copy of every tensor:
// half-stored (O2) tensors are rounded in place, and only the O1 attention matrices, stored in
// float32, get rounded copies. Unrounded parameters (the initial weights, values set from
// outside) give bitwise the result of rounding them first, and float32-stored tensors keep
// their values.
TEST(PrecisionModel, ComputesWithRoundedWeightsCopyingOnlyO1) {
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 2, T = m.seq_len;
    for (const Dtype d : {Dtype::bfloat16, Dtype::float16}) {
        const char* dt             = dtype_name(d);
        const PrecisionPolicy prec = bagualu_policy(d);
        GPT raw(m, B, nullptr, 1, prec), pre(m, B, nullptr, 1, prec);
        init_params(raw.params(), raw.layout(), m, 11);
        Rng rng(3);
        for (size_t i = 0; i < raw.n_floats(); ++i) raw.params()[i] += float(0.1 * rng.normal());
        const std::vector<float> before(raw.params(), raw.params() + raw.n_floats());
        std::copy(before.begin(), before.end(), pre.params());
        size_t copied = 0;
        for (size_t i = 0; i < pre.layout().specs().size(); ++i) {
            const ParamSpec& s = pre.layout().spec(i);
            if (pre.storage_dtype(i) != Dtype::float32) {
                kernels::round_inplace(pre.params() + s.offset, s.numel, d);
            } else if (prec.compute_dtype(s) != Dtype::float32) {
                copied += (s.numel + 15) / 16 * 16;  // ParamLayout pads to 16 floats
            }
        }
        const Batch b = random_batch(B * T, m.vocab_size);
        EXPECT_EQ(raw.forward(b.x.data(), b.y.data(), B, T),
                  pre.forward(b.x.data(), b.y.data(), B, T))
            << dt;
        size_t rounded = 0;
        for (size_t i = 0; i < raw.layout().specs().size(); ++i) {
            const ParamSpec& s = raw.layout().spec(i);
            const bool half    = raw.storage_dtype(i) != Dtype::float32;
            for (size_t j = s.offset; j < s.offset + s.numel; ++j) {
                ASSERT_EQ(raw.params()[j], half ? pre.params()[j] : before[j])
                    << dt << " " << s.name << " element " << j - s.offset;
                rounded += raw.params()[j] != before[j];
            }
        }
        EXPECT_GT(rounded, 0u) << dt << ": no half-stored value needed rounding";
        // the O1 attention matrices: c_attn (3C, C) and c_proj (C, C) per block
        const size_t C = static_cast<size_t>(m.d_model);
        EXPECT_EQ(copied, static_cast<size_t>(m.n_layer) * 4 * C * C) << dt;
        EXPECT_EQ(plan_compute_copies(raw.layout(), prec).floats, copied) << dt;
    }
}

// The trainer holds the compute weights over a step's micro-batches (GPT::hold_compute_weights):
// the held forwards give the loss a fresh model gives on the same parameters, skip the rounding
// and the O1 copies (where there are copies, a value written behind the hold's back is not seen
// until it is released; where the products read the weights in place, at once), and writable
// params() is refused meanwhile.
TEST(PrecisionModel, HeldComputeWeightsAreTheLastForwards) {
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 2, T = m.seq_len;
    GPT gpt(m, B, nullptr, 1, bagualu_policy(Dtype::bfloat16));
    init_params(gpt.params(), gpt.layout(), m, 11);
    Rng rng(3);
    for (size_t i = 0; i < gpt.n_floats(); ++i) gpt.params()[i] += float(0.1 * rng.normal());
    GPT fresh(m, B, nullptr, 1, bagualu_policy(Dtype::bfloat16));
    std::copy(gpt.params(), gpt.params() + gpt.n_floats(), fresh.params());
    EXPECT_THROW(gpt.hold_compute_weights(), InternalError) << "held before any forward";
    const Batch b1 = random_batch(B * T, m.vocab_size);
    Batch b2       = b1;
    std::reverse(b2.x.begin(), b2.x.end());
    float* attn = gpt.params() + gpt.layout().find("h.0.attn.c_attn.weight")->offset;
    gpt.forward(b1.x.data(), b1.y.data(), B, T);
    gpt.hold_compute_weights();
    EXPECT_THROW(gpt.params(), InternalError);
    const double held = gpt.forward(b2.x.data(), b2.y.data(), B, T);
    EXPECT_EQ(held, fresh.forward(b2.x.data(), b2.y.data(), B, T));
    // an O1 weight changed through a pointer taken before the hold: its compute copy is not
    // made again while held, and is once released
    for (int i = 0; i < 64; ++i) attn[i] += 0.5f;
    if (gpt.o1_copies()) {
        EXPECT_EQ(gpt.forward(b2.x.data(), b2.y.data(), B, T), held);
    } else {
        EXPECT_NE(gpt.forward(b2.x.data(), b2.y.data(), B, T), held) << "read in place";
    }
    gpt.release_compute_weights();
    EXPECT_NE(gpt.forward(b2.x.data(), b2.y.data(), B, T), held);
    EXPECT_NO_THROW(gpt.params());
}

// The O1 weights (float32-stored, computed in bf16) get rounded copies only where the bf16
// products take the rounded floats (here the avx2 path with kernels::bf16_float_operands): where
// they convert their operands to 16 bits themselves (kernels::half_products_convert, the
// default), they round the float32 weights as the copies would, so forward reads them in place,
// bitwise the same loss and gradients. The choice follows the path from one forward to the next,
// both ways, in a model built on either.
TEST(PrecisionModel, O1WeightsAreReadInPlaceWhereTheProductsRoundThem) {
    if (!kernels::gemm::path_supported(kernels::gemm::Path::avx2)) {
        GTEST_SKIP() << "needs the avx2 GEMM path (AVX2 and FMA)";
    }
    const kernels::testing::PathGuard guard;
    struct FloatOperands {  // the products on the rounded floats until the end of the test
        FloatOperands() { kernels::bf16_float_operands(true); }
        ~FloatOperands() { kernels::bf16_float_operands(false); }
    } const floats;
    kernels::gemm::set_active_path(kernels::gemm::Path::avx2);
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 2, T = m.seq_len;
    const Batch b  = random_batch(B * T, m.vocab_size);
    const auto run = [&](GPT& gpt) {
        const double loss = gpt.forward(b.x.data(), b.y.data(), B, T);
        gpt.zero_grad();
        gpt.backward(1.0f);
        return std::pair{loss, std::vector<float>(gpt.grads(), gpt.grads() + gpt.n_floats())};
    };
    const auto init = [&](GPT& gpt) {
        init_params(gpt.params(), gpt.layout(), m, 11);
        Rng rng(3);
        for (size_t i = 0; i < gpt.n_floats(); ++i) gpt.params()[i] += float(0.1 * rng.normal());
    };
    const PrecisionPolicy prec = bagualu_policy(Dtype::bfloat16);
    GPT copied(m, B, nullptr, 1, prec);
    init(copied);
    const auto [l0, g0] = run(copied);
    EXPECT_TRUE(copied.o1_copies());
    {
        kernels::bf16_float_operands(false);
        GPT direct(m, B, nullptr, 1, prec);
        init(direct);
        EXPECT_FALSE(direct.o1_copies());
        const auto [l1, g1] = run(direct);
        EXPECT_FALSE(direct.o1_copies());
        EXPECT_EQ(l1, l0);
        EXPECT_EQ(g1, g0);
        // the model built with copies reads in place once the products round
        const auto [l2, g2] = run(copied);
        EXPECT_FALSE(copied.o1_copies());
        EXPECT_EQ(l2, l0);
        EXPECT_EQ(g2, g0);
        kernels::bf16_float_operands(true);
        // and the model built without them makes them when the products widen again
        const auto [l3, g3] = run(direct);
        EXPECT_TRUE(direct.o1_copies());
        EXPECT_EQ(l3, l0);
        EXPECT_EQ(g3, g0);
    }
}

// Forward rounds the half-stored tensors only after a writable params(): after the optimizer's
// step (GPT::params_rounded_update) they already hold values of their dtype, so the pass would
// change nothing. Checked here for every master mode: each value the optimizer leaves in a
// half-stored tensor is its own rounding (O2 from the FP32 master, O3 the parameter itself), the
// forwards that skip the rounding give a fresh model's loss on the same parameters, and a value
// written through params() after that is rounded by the next forward.
TEST(PrecisionModel, OptimizerStepsLeaveHalfTensorsRoundedForForwardToSkip) {
    const ModelConfig m = testing::tiny_moe_config();
    const int B = 2, T = m.seq_len;
    struct Case {
        std::vector<std::string> sets;
        PrecisionPolicy prec;
    };
    const std::vector<Case> cases = {
        {{"precision.dtype=bf16"}, bagualu_policy(Dtype::bfloat16)},
        {{"precision.dtype=fp16"}, bagualu_policy(Dtype::float16)},
        {{"precision.dtype=bf16", "precision.embedding=O3", "precision.attention=O3",
          "precision.ffn=O3", "precision.head=O3"},
         PrecisionPolicy::uniform(Dtype::bfloat16, Level::O3)}};
    for (const Case& c : cases) {
        const std::string what        = c.prec.describe();
        const Dtype d                 = c.prec.dtype;
        std::vector<std::string> sets = c.sets;
        sets.push_back("train.grad_clip=0");
        const TrainConfig cfg = default_config(sets);
        GPT gpt(m, B, nullptr, 1, c.prec);
        init_params(gpt.params(), gpt.layout(), m, 11);
        auto par           = dist::ParallelContext::single();
        auto opt           = dist::paro::make_optimizer(cfg, gpt.layout(), *par, c.prec);
        const Batch b      = random_batch(B * T, m.vocab_size);
        size_t half_values = 0;
        for (int step = 1; step <= 3; ++step) {
            gpt.forward(b.x.data(), b.y.data(), B, T);
            gpt.zero_grad();
            gpt.backward(1.0f);
            opt->step(gpt.params_rounded_update(), gpt.grads(), 1e-2, step);
            ASSERT_FALSE(opt->skipped()) << what;
            for (size_t i = 0; i < gpt.layout().specs().size(); ++i) {
                if (gpt.storage_dtype(i) == Dtype::float32) continue;
                const ParamSpec& s = gpt.layout().spec(i);
                const float* p     = gpt.params() + s.offset;
                std::vector<float> r(p, p + s.numel);
                kernels::round_inplace(r.data(), r.size(), d);
                ASSERT_TRUE(std::equal(r.begin(), r.end(), p))
                    << what << " step " << step << " " << s.name << ": not of its dtype";
                half_values += s.numel;
            }
        }
        ASSERT_GT(half_values, 0u) << what;
        GPT fresh(m, B, nullptr, 1, c.prec);
        std::copy(gpt.params(), gpt.params() + gpt.n_floats(), fresh.params());
        EXPECT_EQ(gpt.forward(b.x.data(), b.y.data(), B, T),
                  fresh.forward(b.x.data(), b.y.data(), B, T))
            << what;
        // a value of no half type, written through params(): rounded by the next forward
        const ParamSpec& fc = *gpt.layout().find("h.0.mlp.c_fc.weight");
        ASSERT_NE(gpt.storage_dtype(size_t(&fc - gpt.layout().specs().data())), Dtype::float32);
        gpt.params()[fc.offset] = 1.0f + 1.0f / 4096;
        gpt.forward(b.x.data(), b.y.data(), B, T);
        EXPECT_EQ(gpt.params()[fc.offset], 1.0f) << what;
    }
}

TEST(PrecisionModel, Fp64SensitiveOpsAgreeWithFp32) {
    const auto [l32, g32] = loss_and_grads(PrecisionPolicy{});
    const auto [l64, g64] =
        loss_and_grads(PrecisionPolicy::uniform(Dtype::float32, Level::O0, true));
    // the same math with exp/tanh/sqrt in double: float32 rounding level differences only
    EXPECT_NEAR(l64, l32, 1e-5 * l32);
    EXPECT_LE(rel_diff(g64, g32), 1e-4);
}

}  // namespace
}  // namespace bagualu::model

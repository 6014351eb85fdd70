// Mixed precision in the optimizer (dist/paro/optimizer.h): O2 tensors keep FP32 masters
// (updates smaller than half a bf16 ulp add up), O3 tensors have none (they are lost); a
// gradient holding an injected inf skips the step without touching parameters or state; the
// loss scale is divided out exactly. ParO's bucket target has a floor per rank.
#include "dist/paro/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "dist/parallel.h"
#include "dist/paro/spaces.h"
#include "optim/adamw.h"

namespace bagualu::dist::paro {
namespace {

// One FFN matrix (half-stored from O2) and one layernorm weight (float32 below O3).
model::ParamLayout small_layout() {
    model::ParamLayout L;
    L.add("h.0.mlp.c_fc.weight", {4, 8}, false);
    L.add("h.0.ln_2.weight", {8}, false);
    return L;
}

struct Trajectory {
    std::vector<float> params;
    std::vector<bool> skipped;
};

// `steps` AdamW steps (lr 1e-3, no decay, no clipping) from all-ones parameters with constant
// gradient `g` (times `loss_scale`), an inf in the gradient at step `inf_at` (1-based; 0: none).
Trajectory run_steps(const std::vector<std::string>& prec, int steps, float g,
                     double loss_scale = 1, int inf_at = 0, bool masters_in_place = false,
                     const char* partition = "auto") {
    std::vector<std::string> sets = {"train.weight_decay=0", "train.grad_clip=0",
                                     std::string("optimizer.partition=") + partition};
    for (const auto& s : prec) sets.push_back("precision." + s);
    const TrainConfig cfg     = default_config(sets);
    model::ParamLayout layout = small_layout();
    auto par                  = dist::ParallelContext::single();
    auto opt = make_optimizer(cfg, layout, *par, model::PrecisionPolicy::from_config(cfg.precision),
                              nullptr, masters_in_place);
    Buffer<float> params(layout.total_floats()), grads(layout.total_floats());
    for (size_t i = 0; i < params.size(); ++i) params[i] = 1.0f;
    Trajectory r;
    for (int s = 1; s <= steps; ++s) {
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(g * loss_scale);
        if (s == inf_at) grads[3] = std::numeric_limits<float>::infinity();
        opt->set_loss_scale(loss_scale);
        opt->step(params.data(), grads.data(), 1e-3, s);
        r.skipped.push_back(opt->skipped());
    }
    r.params.assign(params.data(), params.data() + params.size());
    return r;
}

TEST(PrecisionOptimizer, O2MastersKeepSmallUpdatesO3LosesThem) {
    // Adam's first steps move each parameter by ~lr = 1e-3; below 1.0 a bf16 ulp is 2^-8 = 3.9e-3,
    // so one step rounds back to 1.0. With a master the steps add up: after 10 steps the master
    // is ~0.990 and the parameter its bf16 rounding 0.98828125 (1 - 3 ulp).
    const Trajectory o2  = run_steps({"dtype=bf16", "ffn=O2"}, 10, 0.5f);
    const Trajectory o3  = run_steps({"dtype=bf16", "ffn=O3"}, 10, 0.5f);
    const Trajectory f32 = run_steps({}, 10, 0.5f);
    EXPECT_EQ(o2.params[0], 0.98828125f);
    EXPECT_EQ(o3.params[0], 1.0f);
    EXPECT_NEAR(f32.params[0], 0.990, 1e-4);
    // the layernorm weight is float32 at O2, half at O3
    const size_t ln = small_layout().spec(1).offset;
    EXPECT_EQ(o2.params[ln], f32.params[ln]);
    EXPECT_EQ(o3.params[ln], 1.0f);
    // O2 parameters are bf16 values
    for (size_t i = 0; i < 32; ++i)
        EXPECT_EQ(round_to(Dtype::bfloat16, o2.params[i]), o2.params[i]);
}

// bf16's masters in place (model::masters_in_place): the O2 parameter is its own master, so it
// takes the float32 trajectory (the same arithmetic on the same values), whose bf16 rounding is
// what the parameter held beside a master copy; the optimizer keeps no copy. ParO refuses.
TEST(PrecisionOptimizer, MastersInPlaceAreTheMastersTrajectory) {
    const Trajectory o2  = run_steps({"dtype=bf16", "ffn=O2"}, 10, 0.5f);
    const Trajectory in  = run_steps({"dtype=bf16", "ffn=O2"}, 10, 0.5f, 1, 0, true);
    const Trajectory f32 = run_steps({}, 10, 0.5f);
    EXPECT_EQ(in.params, f32.params);
    for (size_t i = 0; i < 32; ++i)
        EXPECT_EQ(round_to(Dtype::bfloat16, in.params[i]), o2.params[i]);
    EXPECT_NE(in.params[0], o2.params[0]);
    const TrainConfig cfg           = default_config({"precision.dtype=bf16"});
    const model::PrecisionPolicy pr = model::PrecisionPolicy::from_config(cfg.precision);
    model::ParamLayout layout       = small_layout();
    auto par                        = dist::ParallelContext::single();
    const size_t beside = make_optimizer(cfg, layout, *par, pr)->footprint().optim_bytes;
    const size_t inside =
        make_optimizer(cfg, layout, *par, pr, nullptr, true)->footprint().optim_bytes;
    EXPECT_EQ(beside - inside, layout.spec(0).numel * sizeof(float));  // the master copy
    EXPECT_TRUE(model::masters_in_place(pr, false));
    EXPECT_FALSE(model::masters_in_place(pr, true));
    const TrainConfig paro = default_config({"precision.dtype=bf16", "optimizer.partition=on"});
    EXPECT_ANY_THROW(make_optimizer(paro, layout, *par, pr, nullptr, true));
}

// precision.moments = "bf16" in a bf16 run: m and v in half the bytes, replicated and ParO alike
// (and the planner's figure is the optimizer's); the float32-stored tensor takes the float32
// moments' trajectory but for their rounding (under 2^-8 of each step); the O2 parameter is
// the bf16 rounding of its master in place and beside; ParO on one rank takes the replicated
// optimizer's steps bit for bit. A float32 run keeps float32 moments whatever the key says.
TEST(PrecisionOptimizer, Bf16MomentsHalveTheirBytesAndKeepTheTrajectory) {
    const Trajectory f32m = run_steps({"dtype=bf16"}, 10, 0.5f);
    const Trajectory b16m = run_steps({"dtype=bf16", "moments=bf16"}, 10, 0.5f);
    const Trajectory in   = run_steps({"dtype=bf16", "moments=bf16"}, 10, 0.5f, 1, 0, true);
    const Trajectory paro = run_steps({"dtype=bf16", "moments=bf16"}, 10, 0.5f, 1, 0, false, "on");
    const size_t ln       = small_layout().spec(1).offset;  // the float32-stored layernorm weight
    const double off      = std::abs(double(f32m.params[ln]) - double(b16m.params[ln]));
    EXPECT_GT(off, 0.0);   // the rounded moments change the steps a little
    EXPECT_LT(off, 1e-4);  // 10 steps of lr 1e-3, each off by less than 2^-8 of itself
    for (size_t i = 0; i < 32; ++i) {
        EXPECT_EQ(round_to(Dtype::bfloat16, b16m.params[i]), b16m.params[i]) << i;
        EXPECT_EQ(round_to(Dtype::bfloat16, in.params[i]), b16m.params[i]) << i;
    }
    EXPECT_EQ(paro.params, b16m.params);
    EXPECT_EQ(run_steps({"moments=bf16"}, 10, 0.5f).params, run_steps({}, 10, 0.5f).params);

    model::ParamLayout layout = small_layout();
    auto par                  = dist::ParallelContext::single();
    for (const char* part : {"off", "on"}) {
        SCOPED_TRACE(part);
        const auto bytes = [&](const char* moments) {
            const TrainConfig cfg =
                default_config({"precision.dtype=bf16", std::string("optimizer.partition=") + part,
                                std::string("precision.moments=") + moments});
            const model::PrecisionPolicy pr = model::PrecisionPolicy::from_config(cfg.precision);
            const bool split                = part[1] == 'n';
            // as the trainer builds it: bf16's masters in place on the replicated optimizer
            const MemoryFootprint real =
                make_optimizer(cfg, layout, *par, pr, nullptr, model::masters_in_place(pr, split))
                    ->footprint();
            EXPECT_EQ(real.optim_bytes, optimizer_footprint(layout, pr, split, 1, 1).optim_bytes);
            return real.optim_bytes;
        };
        const size_t f32 = bytes("fp32"), b16 = bytes("bf16");
        EXPECT_LT(b16, f32);
        // replicated: m and v of every float, 8 bytes -> 4
        if (part[1] == 'f') {
            EXPECT_EQ(f32 - b16, 4 * layout.total_floats());
        }
    }
}

TEST(PrecisionOptimizer, InjectedInfSkipsTheStep) {
    for (const std::vector<std::string>& prec :
         {std::vector<std::string>{"dtype=fp16"}, std::vector<std::string>{}}) {
        const Trajectory clean = run_steps(prec, 3, 0.5f);
        const Trajectory inf = run_steps(prec, 4, 0.5f, 1, 2);  // step 2 skipped, then 3 more steps
        EXPECT_EQ(inf.skipped, (std::vector<bool>{false, true, false, false}));
        EXPECT_EQ(inf.params, clean.params);  // the skipped step changed nothing (nor m, v)
    }
}

TEST(PrecisionOptimizer, LossScaleIsDividedOut) {
    // a power of two: exact
    EXPECT_EQ(run_steps({"dtype=fp16"}, 3, 0.25f, 1024).params,
              run_steps({"dtype=fp16"}, 3, 0.25f).params);
}

// The optimizers update runs of tensors that continue each other (same mode and decay,
// contiguous in every array; optim::for_each_run) with one call: the bits of one call per tensor
// (optim::adamw_update on each tensor's own moments and master), replicated and ParO, for every
// master mode and both moment types. The layout mixes runs that join (experts 0-2 of a weight),
// a change of decay (the biases), a tensor whose padding breaks a run (5 floats) and a layernorm
// weight (float32 where the experts have masters).
TEST(PrecisionOptimizer, OneUpdateARunIsOneUpdateATensor) {
    model::ParamLayout layout;
    for (int e = 0; e < 3; ++e)
        layout.add(fmt::format("h.0.moe.experts.{}.c_fc.weight", e), {4, 8}, true, true);
    for (int e = 0; e < 3; ++e)
        layout.add(fmt::format("h.0.moe.experts.{}.c_fc.bias", e), {4}, false, true);
    layout.add("h.0.ln_2.weight", {5}, false);
    layout.add("h.1.ln_2.weight", {5}, false);
    for (int e = 0; e < 2; ++e)
        layout.add(fmt::format("h.1.moe.experts.{}.c_proj.weight", e), {8, 4}, true, true);
    const std::vector<std::vector<std::string>> precs = {
        {}, {"dtype=bf16"}, {"dtype=bf16", "moments=bf16"}, {"dtype=bf16", "ffn=O3"}};
    for (const std::vector<std::string>& prec : precs) {
        for (const char* part : {"off", "on"}) {
            SCOPED_TRACE(fmt::format("{} partition={}", fmt::join(prec, " "), part));
            std::vector<std::string> sets = {"train.grad_clip=0",
                                             std::string("optimizer.partition=") + part};
            for (const auto& s : prec) sets.push_back("precision." + s);
            const TrainConfig cfg           = default_config(sets);
            const model::PrecisionPolicy pr = model::PrecisionPolicy::from_config(cfg.precision);
            auto par                        = dist::ParallelContext::single();
            auto opt                        = make_optimizer(cfg, layout, *par, pr);
            const std::vector<model::MasterMode> modes = optim::master_modes(layout, pr);
            const size_t n                             = layout.total_floats();
            Buffer<float> params(n), grads(n), ref(n), g(n), masters(n);
            optim::Moments moments(n, pr.moments);
            for (size_t i = 0; i < n; ++i)
                params[i] = ref[i] = masters[i] =
                    round_to(pr.dtype, 0.5f + 0.01f * static_cast<float>(i % 37));
            const TrainSection& t = cfg.train;
            const optim::AdamWHyper hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                                          static_cast<float>(t.eps),
                                          static_cast<float>(t.weight_decay), 0};
            for (int step = 1; step <= 3; ++step) {
                for (size_t i = 0; i < n; ++i)
                    grads[i] = g[i] = 0.1f * static_cast<float>((i * 7 + step * 3) % 11) - 0.5f;
                opt->step(params.data(), grads.data(), 1e-2, step);
                for (size_t i = 0; i < layout.specs().size(); ++i) {
                    const model::ParamSpec& s = layout.spec(i);
                    optim::adamw_update(modes[i], pr.dtype, pr.fp64_sensitive,
                                        ref.data() + s.offset, masters.data() + s.offset,
                                        g.data() + s.offset, moments.ref().at(s.offset), s.numel,
                                        1e-2f, hyper, s.decay, step);
                }
            }
            for (const model::ParamSpec& s : layout.specs()) {
                for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                    ASSERT_EQ(params[i], ref[i]) << s.name << " element " << i - s.offset;
                }
            }
        }
    }
}

// ParO's bucket target: parallel.bucket_mib up to 1,024 ranks, then 4 KiB per rank.
TEST(ParoBuckets, TargetHasAFloorPerRank) {
    const TrainConfig cfg = default_config();
    EXPECT_EQ(paro_bucket_floats(cfg, 2), size_t{1} << 20);
    EXPECT_EQ(paro_bucket_floats(cfg, 1024), size_t{1} << 20);
    EXPECT_EQ(paro_bucket_floats(cfg, 96000), size_t{96000} * kMinPieceFloats);
    const TrainConfig big = default_config({"parallel.bucket_mib=4096"});
    EXPECT_EQ(paro_bucket_floats(big, 96000), size_t{4096} << 18);
}

}  // namespace
}  // namespace bagualu::dist::paro

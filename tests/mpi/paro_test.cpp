// ParO under mpirun: PartitionedAdamW gives the same parameters and gradient norm as the
// replicated all-reduce AdamW over 3 steps with clipping active, for every EP dividing P
// (including odd P), with buckets small enough that each space takes several.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../common/paro_layout.h"
#include "core/rng.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "dist/paro/partitioned_adamw.h"
#include "dist/paro/spaces.h"
#include "mpi_world.h"

namespace bagualu::dist::paro {
namespace {

TEST(Paro, MatchesReplicatedAdamW) {
    dist::Comm& w = dist::test_world();
    const int P   = w.size();
    for (int ep = 1; ep <= P; ++ep) {
        if (P % ep != 0) continue;
        dist::ParallelContext par(w, ep, false);
        const model::ParamLayout l = testing::paro_test_layout();
        const size_t n             = l.total_floats();
        const optim::AdamWHyper hyper{0.9f, 0.95f, 1e-8f, 0.1f, 1.0};
        TrainConfig cfg;
        cfg.optimizer.partition = Partition::off;
        const auto ref =
            make_optimizer(cfg, l, par, model::PrecisionPolicy::from_config(cfg.precision));
        PartitionedAdamW paro(l, par, hyper, 200);
        ASSERT_FALSE(ref->partitioned());
        // dense tensors equal everywhere, experts equal within their edp group, as after init
        std::vector<float> p_ref(n), p_paro(n);
        Rng dense_init(7, 0), expert_init(7, 1 + static_cast<uint64_t>(par.ep_rank()));
        for (const model::ParamSpec& s : l.specs()) {
            Rng& init = s.expert ? expert_init : dense_init;
            for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                p_ref[i] = static_cast<float>(init.normal());
            }
        }
        p_paro = p_ref;
        for (int step = 1; step <= 3; ++step) {
            Rng rng(100 + static_cast<uint64_t>(step), static_cast<uint64_t>(w.rank()));
            std::vector<float> g_ref(n);  // tensor padding stays 0, as after backward
            for (const model::ParamSpec& s : l.specs()) {
                for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                    g_ref[i] = static_cast<float>(rng.uniform() - 0.3);
                }
            }
            std::vector<float> g_paro = g_ref;
            const double n_ref        = ref->step(p_ref.data(), g_ref.data(), 1e-2, step);
            const double n_paro       = paro.step(p_paro.data(), g_paro.data(), 1e-2, step);
            EXPECT_NEAR(n_paro, n_ref, 1e-6 * n_ref) << "EP " << ep << " step " << step;
            EXPECT_GT(n_ref, 1.0);  // clipping is active
        }
        size_t bad = 0;
        for (const model::ParamSpec& s : l.specs()) {
            for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                bad += std::abs(p_paro[i] - p_ref[i]) > 1e-5f;
            }
        }
        EXPECT_EQ(bad, 0u) << "EP " << ep;
        // m and v hold one shard per space: 1/P of the dense floats, 1/(P/EP) of the experts,
        // up to the rounding of each bucket piece to 16 floats
        size_t state_floats = 0;
        for (const ShardState& st : paro.shards()) {
            const ShardMap& m = st.map;
            state_floats += m.shard_size();
            EXPECT_GE(m.shard_size() * static_cast<size_t>(m.ranks()), m.numel());
            EXPECT_LT(m.shard_size(),
                      m.numel() / static_cast<size_t>(m.ranks()) + 16 * m.num_buckets());
        }
        EXPECT_EQ(paro.footprint().optim_bytes, 2 * sizeof(float) * state_floats);
    }
}

// bagualu plan sizes the optimizer without building it (optimizer_footprint): on every rank
// and layout, for float32 and mixed precision, replicated and ParO, the prediction equals what
// the optimizer holds, and state_piece_floats what a checkpoint of it snapshots.
TEST(Paro, FootprintPredictedWithoutBuildingIt) {
    dist::Comm& w = dist::test_world();
    const int P   = w.size();
    model::ParamLayout l;  // names that put tensors in every precision class
    l.add("wte", {97, 13}, true);
    l.add("h.0.attn.c_attn.weight", {39, 13}, true);
    l.add("h.0.ln_2.weight", {13}, false);
    l.add("h.0.mlp.c_fc.weight", {29, 13}, true);
    l.add("h.1.moe.experts.0.c_fc.weight", {41, 13}, true, true);
    l.add("h.1.moe.experts.0.c_proj.weight", {13, 41}, true, true);
    for (int ep = 1; ep <= P; ++ep) {
        if (P % ep != 0) continue;
        dist::ParallelContext par(w, ep, false);
        for (const char* partition : {"off", "on"}) {
            for (const char* dtype : {"fp32", "bf16", "fp16", "bf16 precision.ffn=O3"}) {
                const std::string d(dtype);
                std::vector<std::string> sets = {std::string("optimizer.partition=") + partition,
                                                 "precision.dtype=" + d.substr(0, 4)};
                if (d.size() > 4) sets.push_back(d.substr(5));
                const TrainConfig cfg = default_config(sets);
                const model::PrecisionPolicy prec =
                    model::PrecisionPolicy::from_config(cfg.precision);
                // as the trainer builds it: bf16's masters in place where it is replicated
                const auto opt = make_optimizer(
                    cfg, l, par, prec, nullptr,
                    model::masters_in_place(prec, cfg.partition_optimizer(par.size())));
                const MemoryFootprint real = opt->footprint();
                const MemoryFootprint pred = optimizer_footprint(
                    l, prec, opt->partitioned(), P, par.edp_size(), kDefaultBucketFloats);
                const std::string what =
                    fmt::format("P {} EP {} partition {} {}", P, ep, partition, dtype);
                EXPECT_EQ(pred.param_bytes, real.param_bytes) << what;
                EXPECT_EQ(pred.grad_bytes, real.grad_bytes) << what;
                // a rank whose shard of a half space is all padding keeps no master for it
                if (w.rank() == 0) {
                    EXPECT_EQ(pred.optim_bytes, real.optim_bytes) << what;
                }
                EXPECT_LE(real.optim_bytes, pred.optim_bytes) << what;
                EXPECT_EQ(pred.comm_bytes, real.comm_bytes) << what;
                size_t pieces = 0;
                for (const StateSpace& sp : opt->state_spaces()) {
                    for (const ShardPiece& p : sp.map->pieces()) pieces += p.len;
                }
                // shards are equal on every rank; pieces leave out tensor padding (less than 16
                // floats per tensor) and, on the last ranks, the space's padding
                const size_t predicted =
                    state_piece_floats(l, prec, opt->partitioned(), P, par.edp_size());
                EXPECT_LE(pieces, predicted) << what;
                if (w.rank() == 0) {
                    EXPECT_LT(predicted - pieces, 16 * l.specs().size()) << what;
                }
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::dist::paro

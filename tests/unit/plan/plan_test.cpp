// The planner's exact counts: analytic layout sizes against make_layout, memory against what
// GPT really allocates (malloc statistics), FLOPs against GPT::flops_per_token, collective bytes
// against a hand count, and machine files (good, bad, round trip).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../../common/run_command.h"
#include "core/error.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "plan/estimate.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"

namespace bagualu::plan {
namespace {

TrainConfig small_config(int moe_every, int E = 4) {
    TrainConfig c;
    c.model.vocab_size       = 97;
    c.model.d_model          = 24;
    c.model.n_layer          = 3;
    c.model.n_head           = 2;
    c.model.seq_len          = 10;
    c.model.d_ff             = 40;
    c.model.n_experts        = E;
    c.model.top_k            = 2;
    c.model.moe_every        = moe_every;
    c.train.batch_size       = 8;
    c.train.micro_batch_size = 2;
    return c;
}

Layout layout_of(const TrainConfig& c, int P, int ep) {
    Layout L;
    L.ranks          = P;
    L.ranks_per_node = P;
    L.ep             = ep;
    L.micro_batch    = c.micro_batch(P);
    L.accum          = c.grad_accum_steps(P);
    return L;
}

TEST(PlanLayout, AnalyticSizesMatchMakeLayout) {
    for (int moe_every : {0, 1, 2, 3}) {
        for (int ep : {1, 2, 4}) {
            const TrainConfig       c  = small_config(moe_every);
            const model::LayoutSize s  = model::layout_size(c.model, ep);
            const model::ParamLayout L = model::make_layout(c.model, ep, ep - 1);
            EXPECT_EQ(s.rank_floats(), L.total_floats()) << moe_every << " " << ep;
            EXPECT_EQ(s.full_params, model::make_layout(c.model).num_params());
            uint64_t expert = 0;
            for (const train::Segment& g : train::make_segments(L)) {
                if (g.expert) expert += g.end - g.begin;
            }
            EXPECT_EQ(s.expert_floats, expert);
        }
    }
}

TEST(PlanFlops, MatchGpt) {
    for (int moe_every : {0, 2}) {
        const TrainConfig c = small_config(moe_every);
        const model::GPT  gpt(c.model, 2);
        const Footprint   f = footprint(c, layout_of(c, 1, 1), 0, 0);
        EXPECT_DOUBLE_EQ(f.model_flops_per_step,
                         3 * gpt.flops_per_token(c.model.seq_len) * 8 * c.model.seq_len);
    }
}

// Bytes the allocator hands out (heap + mmap'd chunks).
double allocated_bytes() {
    const struct mallinfo2 mi = mallinfo2();
    return static_cast<double>(mi.uordblks + mi.hblkhd);
}

TEST(PlanMemory, MatchesGptAllocations) {
    // fp16 with the BaGuaLu policy adds the rounded weight copies and operand buffer; its GEMMs
    // allocate no 16-bit operand copies (bf16 ones do, on first use, not in the constructor)
    for (const char* dtype : {"fp32", "fp16"}) {
        for (int moe_every : {0, 1, 2}) {
            TrainConfig c = small_config(moe_every, 8);
            c.model.d_model = 64;  // large enough that buffers dominate allocator bookkeeping
            c.model.d_ff    = 256;
            c.model.vocab_size = 1000;
            c.model.seq_len = 64;
            c.precision.dtype = dtype;
            const Footprint f  = footprint(c, layout_of(c, 1, 1), 0, 0);
            const double    before = allocated_bytes();
            double          during = 0;
            {
                model::GPT gpt(c.model, static_cast<int>(c.micro_batch(1)), nullptr, 0,
                               model::PrecisionPolicy::from_config(c.precision));
                during = allocated_bytes() - before;
            }
            const Memory& m       = f.memory;
            const double  predict = m.parameters + m.gradients + m.activations + m.comm_buffers;
            EXPECT_NEAR(during, predict, 0.01 * predict + 65536) << dtype << " moe_every " << moe_every;
        }
    }
}

TEST(PlanMemory, CategoriesSumAndScale) {
    const TrainConfig c = small_config(2);
    const Footprint   f = footprint(c, layout_of(c, 2, 2), 1000, 12345);
    const Memory&     m = f.memory;
    EXPECT_DOUBLE_EQ(m.total(), m.baseline + m.parameters + m.gradients + m.optimizer +
                                    m.activations + m.comm_buffers + m.data + m.checkpoint);
    // ParO over 2 ranks (optimizer.partition = "auto"): the optimizer's own shard maps
    const model::ParamLayout lay = model::make_layout(c.model, 2, 0);
    const model::PrecisionPolicy fp32;
    EXPECT_DOUBLE_EQ(m.optimizer, static_cast<double>(train::optimizer_footprint(lay, fp32, true, 2, 1).optim_bytes));
    EXPECT_LT(m.optimizer, 2 * m.parameters);
    EXPECT_DOUBLE_EQ(m.baseline, 12345);
    // 1000 data tokens as int32; the loader's two micro-batches of 2 windows of 11 tokens; the
    // trainer's inputs and targets (2 x 10 tokens each, 64-byte rounded)
    EXPECT_DOUBLE_EQ(m.data, 1000 * 4 + 2 * 2 * 11 * 4 + 2 * 128);
    EXPECT_EQ(m.checkpoint, 0);
    TrainConfig replicated = c;
    replicated.optimizer.partition = "off";
    replicated.checkpoint.every    = 5;
    const Memory& r = footprint(replicated, layout_of(c, 2, 2), 1000, 12345).memory;
    EXPECT_DOUBLE_EQ(r.optimizer, 2 * r.parameters);
    // the snapshot: master, m and v of rank 0's part of each space, less than a whole copy
    EXPECT_DOUBLE_EQ(r.checkpoint, 12.0 * static_cast<double>(train::state_piece_floats(lay, fp32, false, 2, 1)));
    EXPECT_LT(r.checkpoint, 3 * r.parameters);
    MachineSpec mach;
    mach.node.peak_fp32_gflops     = 100;
    mach.node.memory_gib           = 1;
    mach.node.memory_bandwidth_gbs = 10;
    const Estimate e               = estimate(f, c, mach);
    EXPECT_DOUBLE_EQ(e.node_memory_bytes, 2 * m.total());
    EXPECT_TRUE(e.fits);
    EXPECT_GT(e.t_step, 0);
}

TEST(PlanComm, BytesByHand) {
    // P = 4, EP = 2: micro-batch 2 x 10 tokens, 2 micro-batches, one MoE layer of 4 experts
    // (block 1 of 3), top-2, C = 24
    const TrainConfig c = small_config(2);
    const Footprint   f = footprint(c, layout_of(c, 4, 2), 0, 0);
    EXPECT_EQ(f.layout.micro_batch, 2);
    EXPECT_EQ(f.layout.accum, 1);
    const dist::CommTally t = per_kind(f.collectives);
    const model::LayoutSize s = model::layout_size(c.model, 2);
    const uint64_t N = 2 * 10, K = 2, C = 24, E = 4;
    // all-to-all: dispatch + combine, forward + backward, N K rows of C floats
    EXPECT_EQ(t[dist::CommKind::alltoallv].calls, 4u);
    EXPECT_EQ(t[dist::CommKind::alltoallv].bytes, 4 * N * K * C * 4);
    // per-expert counts (int64) gathered in the EP group
    EXPECT_EQ(t[dist::CommKind::allgather].calls, 1u);
    EXPECT_EQ(t[dist::CommKind::allgather].bytes, E * 8);
    // routing statistics (5E + 3) x 8 in one call, loss and checkpoint flag 16, dense gradients
    // in 2 runs, expert gradients over
    // EDP = 2 in 1 run, expert gradient norm 8
    EXPECT_EQ(t[dist::CommKind::allreduce].calls, 1u + 1 + 2 + 1 + 1);
    EXPECT_EQ(t[dist::CommKind::allreduce].bytes,
              (5 * E + 3) * 8 + 16 + s.dense_floats * 4 + s.expert_floats * 4 + 8);
    // one rank: nothing
    EXPECT_TRUE(footprint(c, layout_of(c, 1, 1), 0, 0).collectives.empty());
}

TEST(PlanTime, GemmEfficiencyInterpolates) {
    NodeSpec n;
    n.gemm_sizes      = {64, 256};
    n.gemm_efficiency = {0.2, 0.6};
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 16, 16, 16), 0.2);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 128, 128, 128), 0.4);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 4096, 4096, 4096), 0.6);
}

// ---- machine files ----

class MachineFileTest : public ::testing::Test {
   protected:
    std::string write(const std::string& text) {
        const std::string p = dir / "m.toml";
        testing::write_file(p, text);
        return p;
    }
    void expect_error(const std::string& text, std::initializer_list<std::string> needles) {
        const std::string p = write(text);
        try {
            load_machine(p);
            ADD_FAILURE() << "no error for:\n" << text;
        } catch (const InputError& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(p), std::string::npos) << msg;
            for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
        }
    }
    testing::TempDir dir;
};

TEST_F(MachineFileTest, ShippedFilesLoad) {
    const MachineSpec m = load_machine(std::string(BGL_SOURCE_DIR) + "/machines/sunway-oceanlight.toml");
    EXPECT_EQ(m.node.cores, 390);
    EXPECT_DOUBLE_EQ(m.node.peak_fp32_gflops, 14030);
    EXPECT_EQ(m.network.total_nodes, 107520);
}

TEST_F(MachineFileTest, RoundTrip) {
    MachineSpec m;
    m.node.peak_fp32_gflops     = 123.5;
    m.node.memory_gib           = 7;
    m.node.memory_bandwidth_gbs = 9;
    m.node.gemm_sizes           = {10, 20};
    m.node.gemm_efficiency      = {0.1, 0.2};
    const MachineSpec r         = load_machine(write(to_toml(m, "# comment\n")));
    EXPECT_DOUBLE_EQ(r.node.peak_fp32_gflops, 123.5);
    EXPECT_EQ(r.node.gemm_sizes, m.node.gemm_sizes);
}

TEST_F(MachineFileTest, BadFilesNameFileAndKey) {
    const std::string ok = "[node]\npeak_fp32_gflops = 10\nmemory_gib = 1\nmemory_bandwidth_gbs = 1\n";
    expect_error(ok + "bogus = 1\n", {"node.bogus", "unknown key"});
    expect_error(ok + "[nodes]\n", {"unknown section [nodes]"});
    expect_error("[node]\npeak_fp32_gflops = \"fast\"\n", {"node.peak_fp32_gflops", "expected a number"});
    expect_error("[node]\npeak_fp32_gflops = -1\nmemory_gib = 1\nmemory_bandwidth_gbs = 1\n",
                 {"node.peak_fp32_gflops", "must be > 0"});
    expect_error(ok + "gemm_sizes = [1.0, 2.0]\n", {"gemm_sizes", "same length"});
    expect_error(ok + "[network]\noversubscription = 0.5\n", {"network.oversubscription"});
    expect_error("[node\n", {"invalid TOML"});
    EXPECT_THROW(load_machine(dir / "missing.toml"), InputError);
}

}  // namespace
}  // namespace bagualu::plan

// Two-level collectives end to end: `mpirun -np 4 bagualu train` as 2 nodes of 2 ranks
// (parallel.ranks_per_node = 2), expert parallelism 2, gives bitwise the same per-step losses,
// gradient norms and final parameters with parallel.two_level = "on" (reduce inside the node,
// then across nodes) and "off" (one level over all ranks, in the same order: collectives.h,
// "over nodes"), for ParO and the replicated optimizer, fp32 and bf16. Also: the log names the
// node layout, and a ranks_per_node that does not divide the ranks is one error with status 2.
// And reduction groups (parallel.reduce_group = 2 on one node of 4 ranks): the first level of the
// same two-level reductions, so the same bits as nodes of 2, on and off.
#include <gtest/gtest.h>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

class TwoLevelTest : public TinyRunsSuite<> {
   protected:
    // Runs 2x2 with two_level on and off; both must match bit for bit.
    void expect_bitwise_same(const std::string& partition, const std::string& dtype) {
        std::string runs[2];
        for (int i = 0; i < 2; ++i) {
            const char* tl        = i == 0 ? "on" : "off";
            runs[i]               = fmt::format("{}_{}_{}", partition, dtype, tl);
            const CommandResult r = TinyRuns::run_mpi(
                4, runs_->train_args(runs[i], 4, 2, partition) +
                       fmt::format(" --set parallel.ranks_per_node=2 --set parallel.two_level={}"
                                   " --set precision.dtype={}",
                                   tl, dtype));
            ASSERT_EQ(r.status, 0) << r.output;
            EXPECT_NE(r.output.find(fmt::format("nodes: 2 of 2 rank(s); gradient reduction {}",
                                                i == 0 ? "two-level" : "one-level")),
                      std::string::npos)
                << r.output;
        }
        const StepLog a = read_steps(runs_->path(runs[0] + "/metrics.jsonl"));
        const StepLog b = read_steps(runs_->path(runs[1] + "/metrics.jsonl"));
        ASSERT_EQ(a.loss.size(), 20u);
        EXPECT_EQ(a.loss, b.loss);  // exact: the same sums in the same order
        EXPECT_EQ(a.grad_norm, b.grad_norm);
        EXPECT_EQ(read_file(runs_->path(runs[0] + "/model/model.safetensors")),
                  read_file(runs_->path(runs[1] + "/model/model.safetensors")));
    }
};

TEST_F(TwoLevelTest, ParoFp32BitwiseSame) { expect_bitwise_same("on", "fp32"); }
TEST_F(TwoLevelTest, ParoBf16BitwiseSame) { expect_bitwise_same("on", "bf16"); }
TEST_F(TwoLevelTest, ReplicatedFp32BitwiseSame) { expect_bitwise_same("off", "fp32"); }
TEST_F(TwoLevelTest, ReplicatedBf16BitwiseSame) { expect_bitwise_same("off", "bf16"); }

TEST_F(TwoLevelTest, ReduceGroupsReduceAsNodesDo) {
    auto run = [&](const std::string& name, const std::string& extra) {
        const CommandResult r = TinyRuns::run_mpi(4, runs_->train_args(name, 4, 2, "on") + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        return r.output;
    };
    run("rg_nodes", " --set parallel.ranks_per_node=2 --set parallel.hierarchical_a2a=off");
    const std::string on = run("rg_on",
                               " --set parallel.ranks_per_node=4 --set "
                               "parallel.reduce_group=2 --set parallel.two_level=on");
    EXPECT_NE(on.find("reduction groups: 2 of 2 rank(s); gradient reduction two-level"),
              std::string::npos)
        << on;
    run("rg_off",
        " --set parallel.ranks_per_node=4 --set parallel.reduce_group=2 --set "
        "parallel.two_level=off");
    const StepLog a = read_steps(runs_->path("rg_nodes/metrics.jsonl"));
    ASSERT_EQ(a.loss.size(), 20u);
    for (const char* name : {"rg_on", "rg_off"}) {
        const StepLog b = read_steps(runs_->path(std::string(name) + "/metrics.jsonl"));
        EXPECT_EQ(a.loss, b.loss) << name;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << name;
        EXPECT_EQ(read_file(runs_->path("rg_nodes/model/model.safetensors")),
                  read_file(runs_->path(std::string(name) + "/model/model.safetensors")))
            << name;
    }
    const CommandResult bad = TinyRuns::run_mpi(
        4, runs_->train_args("bad_rg", 4, 2, "auto") + " --set parallel.reduce_group=3");
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("parallel.reduce_group = 3 must be 0 (the node) or divide"),
              std::string::npos)
        << bad.output;
}

TEST_F(TwoLevelTest, RanksPerNodeMustDivideRanks) {
    const CommandResult r = TinyRuns::run_mpi(
        4, runs_->train_args("bad_rpn", 4, 2, "auto") + " --set parallel.ranks_per_node=3");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("parallel.ranks_per_node = 3"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bagualu::testing

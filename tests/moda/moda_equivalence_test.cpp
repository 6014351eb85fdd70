// MoDa end to end: `mpirun -np P bagualu train` with expert parallelism EP and the replicated
// optimizer gives the same per-step loss and final parameters as one process with the same
// global batch and seed (top-k gate, FP32, 20 steps), and the same gradient norm. Also: bad
// layouts end every rank with one message and status 2. ParO runs: paro_test.cpp.
#include <gtest/gtest.h>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

class MoDaTest : public TinyRunsSuite<> {
   protected:
    // extra: more --set options for both runs; tag: their name's suffix
    void expect_same_as_single(int P, int ep, const std::string& extra = "",
                               const std::string& tag = "") {
        const std::string ref = "ref" + tag, run = fmt::format("p{}_ep{}{}", P, ep, tag);
        const CommandResult a = bagualu(runs_->train_args(ref, 1, 1, "off") + extra);
        ASSERT_EQ(a.status, 0) << a.output;
        const CommandResult b = TinyRuns::run_mpi(P, runs_->train_args(run, P, ep, "off") + extra);
        ASSERT_EQ(b.status, 0) << b.output;
        expect_same_training(*runs_, ref, run);
    }
};

TEST_F(MoDaTest, TwoRanksExpertParallel) { expect_same_as_single(2, 2); }
TEST_F(MoDaTest, FourRanksExpertParallel) { expect_same_as_single(4, 4); }
TEST_F(MoDaTest, FourRanksTwoExpertGroups) { expect_same_as_single(4, 2); }
TEST_F(MoDaTest, TwoRanksDataParallelOnly) { expect_same_as_single(2, 1); }
// Shared experts are dense tensors beside the routed ones: replicated, gradients all-reduced.
TEST_F(MoDaTest, TwoRanksExpertParallelWithSharedExperts) {
    expect_same_as_single(2, 2, " --set model.n_shared_experts=2 --set model.shared_d_ff=48",
                          "_shared");
}

// Rank counts that do not divide the batch of 8 (config/batch_split.h): 3 ranks train 3, 3
// and 2 sequences, 6 ranks 2, 2, 1, 1, 1, 1, in one micro-step as the reference does (its
// aux loss is one number over the micro-step's tokens, so the grouping must match); every
// token weighs the same, so only the summation order differs from one rank.
TEST_F(MoDaTest, ThreeRanksUnevenShares) {
    expect_same_as_single(3, 1, " --set train.micro_batch_size=8", "_mb8");
}
TEST_F(MoDaTest, SixRanksUnevenSharesExpertParallel) {
    expect_same_as_single(6, 2, " --set train.micro_batch_size=8 --set optimizer.partition=on",
                          "_mb8_paro");
}

// model.balance_loss_scope (docs/model.md): per micro-batch, 2 ranks of 4 sequences each
// balance what one rank balances in its two micro-steps of 4; per sequence, the loss is the
// same whatever the grouping (here 2 sequences a rank a micro-step against 4 on one rank).
TEST_F(MoDaTest, TwoRanksPerMicroBatchBalancing) {
    expect_same_as_single(
        2, 2, " --set model.balance_loss_scope=micro_batch --set train.micro_batch_size=4",
        "_bal_mb");
}
TEST_F(MoDaTest, TwoRanksPerSequenceBalancing) {
    expect_same_as_single(2, 2, " --set model.balance_loss_scope=sequence", "_bal_seq");
}

TEST_F(MoDaTest, InvalidLayoutEndsEveryRankWithOneMessage) {
    const CommandResult r = TinyRuns::run_mpi(4, runs_->train_args("bad", 4, 3, "auto"));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("parallel.expert_parallel = 3"), std::string::npos) << r.output;
    const CommandResult r2 = TinyRuns::run_mpi(
        3, runs_->train_args("bad2", 1, 1, "auto") + " --set train.micro_batch_size=1");
    EXPECT_EQ(r2.status, 2) << r2.output;
    EXPECT_NE(r2.output.find("train.batch_size = 8 over 3 ranks"), std::string::npos) << r2.output;
}

}  // namespace
}  // namespace bagualu::testing

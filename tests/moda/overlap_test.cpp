// Gradient reduction overlapped with backward (parallel.overlap_grad_reduce) changes only the
// timing: `bagualu train` over P = 2 and 4 ranks with EP = 2, with the replicated optimizer and
// with ParO, gives bitwise the same per-step losses and gradient norms and the same exported
// model bytes with overlap on and off (20 steps of the tiny config; at P = 4 every step has two
// micro-steps, and only the last one's backward overlaps).
#include <gtest/gtest.h>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

// (ranks, optimizer.partition, precision.dtype)
class OverlapTest
    : public TinyRunsSuite<::testing::TestWithParam<std::tuple<int, std::string, std::string>>> {};

TEST_P(OverlapTest, OnAndOffGiveTheSameBits) {
    const auto& [P, partition, dtype] = GetParam();
    std::string runs[2];
    for (const bool on : {false, true}) {
        const std::string run =
            fmt::format("p{}_{}_{}_overlap_{}", P, partition, dtype, on ? "on" : "off");
        // fp16: ParO unscales each reduced bucket on the helper thread; a loss scale that changes
        // every other step (from 1, doubling after 2 clean steps) must be the step's own
        const CommandResult r = TinyRuns::run_mpi(
            P, runs_->train_args(run, P, 2, partition) +
                   fmt::format(" --set parallel.overlap_grad_reduce={} --set precision.dtype={}",
                               on, dtype) +
                   (dtype == "fp16"
                        ? " --set precision.loss_scale=1 --set precision.loss_scale_window=2"
                        : ""));
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_NE(r.output.find(on ? "overlapped with backward" : "reduction: after backward"),
                  std::string::npos)
            << r.output;
        runs[on] = run;
    }
    const StepLog off = read_steps(runs_->path(runs[0] + "/metrics.jsonl"));
    const StepLog on  = read_steps(runs_->path(runs[1] + "/metrics.jsonl"));
    ASSERT_EQ(off.loss.size(), 20u);
    EXPECT_EQ(on.loss, off.loss);
    EXPECT_EQ(on.grad_norm, off.grad_norm);
    EXPECT_TRUE(on.first.contains("grad_reduce_wait_s")) << on.first.dump();
    const std::string a = read_file(runs_->path(runs[0] + "/model/model.safetensors"));
    const std::string b = read_file(runs_->path(runs[1] + "/model/model.safetensors"));
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "the exported models differ";
}

const auto kOverlapName = [](const auto& p) {
    return fmt::format("P{}_partition_{}_{}", std::get<0>(p.param), std::get<1>(p.param),
                       std::get<2>(p.param));
};
INSTANTIATE_TEST_SUITE_P(RanksAndOptimizer, OverlapTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(std::string("off"),
                                                              std::string("on")),
                                            ::testing::Values(std::string("fp32"))),
                         kOverlapName);
INSTANTIATE_TEST_SUITE_P(LossScaled, OverlapTest,
                         ::testing::Combine(::testing::Values(2),
                                            ::testing::Values(std::string("off"),
                                                              std::string("on")),
                                            ::testing::Values(std::string("fp16"))),
                         kOverlapName);

}  // namespace
}  // namespace bagualu::testing

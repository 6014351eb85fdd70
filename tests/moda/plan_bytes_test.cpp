// `bagualu plan` predicts the bytes of every collective kind exactly: a 2-rank expert-parallel
// run and a 2-rank dense run of the tiny model count (summed over ranks and steps, evaluation
// left out) what plan predicts per rank and step, times ranks and steps.
#include <gtest/gtest.h>

#include "../common/plan_runs.h"

namespace bagualu::testing {
namespace {

void expect_counted_equals_predicted(const std::string& extra) {
    TempDir           dir;
    const std::string data = " --set data.train=" + (dir / "train.bin") + " --set data.val=" +
                             (dir / "val.bin") + " --set data.tokenizer=" + (dir / "tok.model");
    const CommandResult prep = bagualu("prepare --config configs/tiny.toml" + data);
    ASSERT_EQ(prep.status, 0) << prep.output;
    const int         P = 2, steps = 3;
    // The planner models the replicated optimizer; ParO's collectives are not in it yet.
    const std::string common = "--config configs/tiny.toml" + data +
                               " --set train.threads=1 --set optimizer.partition=off " + extra;
    // evaluation every 2 steps: its collectives must not show up in the step counts
    const CommandResult t = run_train(
        P, fmt::format("train {} --run-dir {} --force --set train.steps={} --set train.eval_every=2 "
                       "--set train.eval_batches=1 --set sample.n_samples=0",
                       common, dir / "run", steps));
    ASSERT_EQ(t.status, 0) << t.output;
    const CommandResult p = bagualu(fmt::format(
        "plan {} --machine machines/sunway-oceanlight.toml --nodes 1 --ranks-per-node {} --json", common, P));
    ASSERT_EQ(p.status, 0) << p.output;
    const auto      plan = nlohmann::json::parse(p.output);
    const RunReport run  = read_run(dir / "run/metrics.jsonl");
    ASSERT_TRUE(run.resources.contains("comm")) << read_file(dir / "run/metrics.jsonl");
    const auto& predicted = plan["comm_per_step_per_rank"];
    const auto& counted   = run.resources["comm"];
    EXPECT_EQ(predicted.size(), counted.size()) << predicted.dump() << "\n" << counted.dump();
    for (const auto& [kind, c] : counted.items()) {
        ASSERT_TRUE(predicted.contains(kind)) << kind;
        EXPECT_EQ(c["bytes"].get<int64_t>(), predicted[kind]["bytes"].get<int64_t>() * P * steps) << kind;
        EXPECT_EQ(c["calls"].get<int64_t>(), predicted[kind]["calls"].get<int64_t>() * P * steps) << kind;
    }
}

TEST(PlanBytes, ExpertParallelRunCountsWhatPlanPredicts) {
    expect_counted_equals_predicted("--set parallel.expert_parallel=2");
}

TEST(PlanBytes, DenseRunCountsWhatPlanPredicts) {
    expect_counted_equals_predicted("--set model.moe_every=0");
}

}  // namespace
}  // namespace bagualu::testing

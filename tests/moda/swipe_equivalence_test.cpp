// SWIPE across real and virtual workers: `mpirun -np 2 bagualu train` with expert parallelism 2
// and gate = "swipe" gives the same per-step loss as one process simulating the two workers
// (parallel.virtual_workers = 2), and every logged step of both has expert load max/mean = 1;
// with SWIPE balancing each round (model.swipe_balance = "round") and the whole step ("step").
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "../common/run_command.h"

namespace bagualu::testing {
namespace {

struct SwipeLog {
    std::vector<double> loss, reassigned;
    std::vector<std::vector<double>> load;  // [step][MoE layer] max/mean
};

SwipeLog read_log(const std::string& path) {
    SwipeLog out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("loss")) continue;
        out.loss.push_back(j["loss"]);
        out.load.push_back(j["expert_load_max_over_mean"].get<std::vector<double>>());
        out.reassigned.push_back(j["reassigned_fraction"][0]);
    }
    return out;
}

// balance: model.swipe_balance, "round" or "step".
void two_ranks_match_one_rank_with_two_virtual_workers(const std::string& balance) {
    TempDir dir;
    const std::string data =
        fmt::format(" --set data.train={} --set data.val={} --set data.tokenizer={}",
                    dir / "data/train.bin", dir / "data/val.bin", dir / "data/tok.model");
    const CommandResult prep = bagualu("prepare --config configs/tiny.toml" + data);
    ASSERT_EQ(prep.status, 0) << prep.output;
    // 20 steps, each of 2 micro-steps covering the same 4 sequences whatever the rank count
    auto args = [&](const std::string& run, int P, int ep, int vw) {
        return fmt::format(
            "train --config configs/tiny.toml{} --run-dir {} --set train.steps=20 "
            "--set train.log_every=1 --set train.eval_every=0 --set train.threads=1 "
            "--set sample.n_samples=0 --set train.micro_batch_size={} --set model.gate=swipe "
            "--set parallel.expert_parallel={} --set parallel.virtual_workers={} "
            "--set model.swipe_balance={} --force",
            data, dir / run, 4 / P, ep, vw, balance);
    };
    const CommandResult one = bagualu(args("virtual", 1, 1, 2));
    ASSERT_EQ(one.status, 0) << one.output;
    const CommandResult two = run_command(
        fmt::format("cd {} && timeout 300 {} --allow-run-as-root --oversubscribe -np 2 {} {}",
                    BGL_SOURCE_DIR, BGL_MPIEXEC, BGL_BINARY, args("real", 2, 2, 1)));
    ASSERT_EQ(two.status, 0) << two.output;
    const SwipeLog a = read_log(dir / "virtual/metrics.jsonl"),
                   b = read_log(dir / "real/metrics.jsonl");
    ASSERT_EQ(a.loss.size(), 20u);
    ASSERT_EQ(b.loss.size(), 20u);
    double moved = 0;
    for (size_t i = 0; i < a.loss.size(); ++i) {
        EXPECT_NEAR(b.loss[i], a.loss[i], 1e-5 * a.loss[i]) << "step " << i + 1;
        EXPECT_EQ(a.reassigned[i], b.reassigned[i]) << "step " << i + 1;
        for (double l : a.load[i]) EXPECT_EQ(l, 1.0) << "one rank, step " << i + 1;
        for (double l : b.load[i]) EXPECT_EQ(l, 1.0) << "two ranks, step " << i + 1;
        moved += a.reassigned[i];
    }
    EXPECT_GT(moved, 0.0);  // SWIPE had work to do
}

TEST(SwipeEquivalenceTest, TwoRanksMatchOneRankWithTwoVirtualWorkers) {
    two_ranks_match_one_rank_with_two_virtual_workers("round");
}
TEST(SwipeEquivalenceTest, TwoRanksMatchOneRankWithTwoVirtualWorkersStepBalance) {
    two_ranks_match_one_rank_with_two_virtual_workers("step");
}

}  // namespace
}  // namespace bagualu::testing

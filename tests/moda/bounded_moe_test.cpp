// Bounded MoE memory under mpirun -np 4: training with the smallest row budget (one
// weight-gradient block, 256 rows, so the experts run in several rounds) gives bitwise the same
// losses, gradient norms and exported model as with unbounded buffers, at EP = 4 and EP = 2,
// with routing forced to one expert and Zipf-skewed (model.route_override).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

class BoundedMoETest : public TinyRunsSuite<> {};

// Per step: (loss, grad_norm) exactly as logged, and the largest per-expert row count.
struct Steps {
    std::vector<std::pair<double, double>> loss_norm;
    int64_t max_expert_rows = 0;
};

Steps read(const std::string& path) {
    Steps out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("loss")) continue;
        out.loss_norm.emplace_back(j["loss"], j["grad_norm"]);
        for (const auto& layer : j["expert_tokens"]) {
            for (const auto& n : layer) {
                out.max_expert_rows = std::max<int64_t>(out.max_expert_rows, n);
            }
        }
    }
    return out;
}

// 10 steps of one micro-step of 4 sequences (256 tokens, 512 routed rows) per rank.
void run_pair(const TinyRuns& runs, int ep, const std::string& route, const std::string& extra,
              int64_t min_expert_rows) {
    auto args = [&](const std::string& run, double budget) {
        return fmt::format(
            "train --config configs/tiny.toml{} --run-dir {} --set train.steps=10 "
            "--set train.batch_size=16 --set train.micro_batch_size=4 --set train.log_every=1 "
            "--set train.eval_every=0 --set train.threads=1 --set sample.n_samples=0 "
            "--set parallel.expert_parallel={} --set model.route_override={} "
            "--set model.moe_rows_budget={}{} --force",
            runs.data_args(), runs.path(run), ep, route, budget, extra);
    };
    const std::string name = fmt::format("ep{}-{}", ep, route);
    for (auto [run, budget] :
         {std::pair{name + "-unbounded", 0.0}, std::pair{name + "-256", 1e-6}}) {
        const CommandResult r = TinyRuns::run_mpi(4, args(run, budget));
        ASSERT_EQ(r.status, 0) << r.output;
    }
    const Steps a = read(runs.path(name + "-unbounded/metrics.jsonl"));
    const Steps b = read(runs.path(name + "-256/metrics.jsonl"));
    ASSERT_EQ(a.loss_norm.size(), 10u);
    EXPECT_EQ(a.loss_norm, b.loss_norm) << name << ": losses and gradient norms bitwise";
    // a rank held more rows than the budget of 256: the budgeted run took several rounds
    EXPECT_GE(a.max_expert_rows, min_expert_rows) << name;
    EXPECT_EQ(read_file(runs.path(name + "-unbounded/model/model.safetensors")),
              read_file(runs.path(name + "-256/model/model.safetensors")))
        << name << ": exported models bitwise";
}

TEST_F(BoundedMoETest, EP4ZipfSameBitsForAnyBudget) {
    // Zipf: expert 0 is among the two choices of most tokens; EP = 4 puts it alone on rank 0
    run_pair(*runs_, 4, "zipf", "", 600);
}

TEST_F(BoundedMoETest, EP2OneExpertSameBitsForAnyBudget) {
    // every token on experts 0 and 1: each EP group's rank 0 receives all 1024 of its rows
    run_pair(*runs_, 2, "one_expert", "", 4 * 256);
}

TEST_F(BoundedMoETest, EP4ZipfBf16SameBitsForAnyBudget) {
    run_pair(*runs_, 4, "zipf", " --set precision.dtype=bf16", 600);
}

}  // namespace
}  // namespace bagualu::testing

// The planner against real runs on this machine: calibrate it, then train ten configs and
// layouts (tiny and default, dense and MoE, fp32 and bf16, replicated and ParO, P = 1, 2, 4
// oversubscribed, one thread per rank) and
// compare with `bagualu plan`: peak resident memory per rank (within 10%), bytes of every
// collective kind (exactly), step time (median of the steps after the first). Prints the ratios.
// Step times need a quiet machine: they are checked (within 25%) only with BGL_PLAN_TIMING=1,
// and only for the default model's runs (steps of 0.1 s and more).
#include <gtest/gtest.h>

#include <cstdlib>

#include "../common/plan_runs.h"

namespace bagualu::testing {
namespace {

struct Case {
    const char* name;
    const char* config;
    int P, ep, steps;
    const char* extra;
};

TEST(PlanValidation, MemoryBytesAndTimeAgainstRuns) {
    TempDir dir;
    const std::string machine = dir / "local.toml";
    ASSERT_EQ(bagualu("calibrate --seconds 1 --out " + machine).status, 0);
    ASSERT_EQ(run_train(4, "calibrate --out " + machine).status, 0);
    const std::string data = " --set data.train=" + (dir / "train.bin") +
                             " --set data.val=" + (dir / "val.bin") +
                             " --set data.tokenizer=" + (dir / "tok.model");
    ASSERT_EQ(bagualu("prepare --config configs/tiny.toml" + data).status, 0);
    // the default model trains on the tiny corpus: its ids are valid for any larger vocabulary
    const std::string no_tok = " --set data.tokenizer=" + (dir / "none.model");

    const Case cases[] = {
        {"tiny MoE P=1", "configs/tiny.toml", 1, 1, 20, ""},
        {"tiny dense P=2", "configs/tiny.toml", 2, 1, 20, "--set model.moe_every=0"},
        {"tiny MoE P=2 EP=2 repl", "configs/tiny.toml", 2, 2, 20, "--set optimizer.partition=off"},
        {"tiny MoE P=4 EP=4", "configs/tiny.toml", 4, 4, 20, "--set train.micro_batch_size=2"},
        // configs/default.toml trains in bf16 with the BaGuaLu policy; ParO from P = 2 on
        {"default MoE P=1 fp32", "configs/default.toml", 1, 1, 6, "--set precision.dtype=fp32"},
        {"default MoE P=1 bf16", "configs/default.toml", 1, 1, 6, ""},
        {"default dense P=2 fp32", "configs/default.toml", 2, 1, 6,
         "--set precision.dtype=fp32 --set model.moe_every=0 --set train.micro_batch_size=8"},
        {"default MoE P=2 EP=2 bf16", "configs/default.toml", 2, 2, 6,
         "--set train.micro_batch_size=8"},
        {"default dense P=4 bf16", "configs/default.toml", 4, 1, 6,
         "--set model.moe_every=0 --set train.micro_batch_size=4"},
        // the planner's bytes are those of one round of the MoE experts at the balanced load;
        // the untrained model's top-k routing sends some rank more than the default budget of
        // twice that on some micro-batches, whose second round re-dispatches the tokens in
        // backward (docs/parallelism.md, "Bounded MoE memory"): a budget of EP x the balanced
        // load keeps one round here
        {"default MoE P=4 EP=4 fp32", "configs/default.toml", 4, 4, 6,
         "--set precision.dtype=fp32 --set train.micro_batch_size=4 "
         "--set model.moe_rows_budget=4"},
    };
    const bool check_time = std::getenv("BGL_PLAN_TIMING") != nullptr;
    std::printf("%-26s %10s %10s %7s %10s %10s %7s  bytes\n", "run", "mem pred", "mem meas",
                "ratio", "step pred", "step meas", "ratio");
    int index = 0;
    for (const Case& c : cases) {
        const std::string common = fmt::format(
            "--config {}{}{} --set parallel.expert_parallel={} --set train.threads=1 {}", c.config,
            data, std::string(c.config).find("default") != std::string::npos ? no_tok : "", c.ep,
            c.extra);
        const std::string run = dir / fmt::format("run{}", index++);
        const CommandResult t =
            run_train(c.P, fmt::format("train {} --run-dir {} --force --set train.steps={} "
                                       "--set train.log_every=1 --set train.eval_every=0 "
                                       "--set train.eval_batches=1 --set sample.n_samples=0",
                                       common, run, c.steps));
        ASSERT_EQ(t.status, 0) << c.name << "\n" << t.output;
        const CommandResult p = bagualu(fmt::format(
            "plan {} --machine {} --nodes 1 --ranks-per-node {} --json", common, machine, c.P));
        ASSERT_EQ(p.status, 0) << p.output;
        const auto plan   = nlohmann::json::parse(p.output);
        const RunReport r = read_run(run + "/metrics.jsonl");
        double mem        = 0;
        for (const auto& b : r.resources["peak_rss_bytes"]) mem = std::max(mem, b.get<double>());
        std::vector<double> dts;
        for (size_t i = 1; i < r.tokens_per_s.size(); ++i)
            dts.push_back(plan["tokens_per_step"].get<double>() / r.tokens_per_s[i]);
        const double step = median(dts), pstep = plan["time"]["step_s"].get<double>();
        const double pmem = plan["memory_bytes_per_rank"]["total"].get<double>();
        bool bytes_equal  = true;
        for (const auto& [kind, cnt] : r.resources["comm"].items()) {
            const auto& pk = plan["comm_per_step_per_rank"];
            const int64_t predicted =
                pk.contains(kind) ? pk[kind]["bytes"].get<int64_t>() * c.P * c.steps : -1;
            EXPECT_EQ(cnt["bytes"].get<int64_t>(), predicted) << c.name << " " << kind;
            bytes_equal = bytes_equal && cnt["bytes"].get<int64_t>() == predicted;
        }
        EXPECT_EQ(r.resources["comm"].size(), plan["comm_per_step_per_rank"].size()) << c.name;
        std::printf("%-26s %8.1fMi %8.1fMi %7.3f %8.1fms %8.1fms %7.3f  %s\n", c.name,
                    pmem / 1048576, mem / 1048576, pmem / mem, pstep * 1e3, step * 1e3,
                    pstep / step, bytes_equal ? "equal" : "DIFFER");
        std::fflush(stdout);
        EXPECT_NEAR(pmem / mem, 1.0, 0.10) << c.name;
        // the GEMMs' packing buffers: what the ranks kept, within the planner's bound
        const double ppack = plan["memory_bytes_per_rank"]["gemm_packing"].get<double>();
        std::printf("%-26s GEMM packing buffers: kept %.1f KiB, counted %.1f KiB\n", "",
                    r.gemm_packing / 1024, ppack / 1024);
        EXPECT_GT(r.gemm_packing, 0) << c.name;
        EXPECT_LE(r.gemm_packing, ppack) << c.name;
        // Steps of ~10 ms (the tiny model) are dominated by fixed per-call costs the per-FLOP
        // model leaves out (thread-pool dispatch, products below the calibrated 32^3): their
        // ratio is printed, and the step time is checked where the model's terms are the step.
        if (check_time && pstep >= 0.1) {
            EXPECT_NEAR(pstep / step, 1.0, 0.25) << c.name;
        }
    }
}

}  // namespace
}  // namespace bagualu::testing

// train.recompute = moe / block against none over whole tiny runs, on one process and under
// mpirun with EP = 2 (the recomputed forward runs the all-to-all again on every rank): the
// logged lines (loss, grad norm, aux loss, expert counts, dropped / reassigned fractions, router
// entropy) and the exported model must be the very same bytes. Three MoE blocks with the noisy
// gate and jitter, so that the routing draws random numbers that must repeat, and one with
// SWIPE, whose reassignment statistics must not be counted twice; and the noisy gate under the
// bf16 policy, whose all-to-all carries 16-bit rows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

// metrics.jsonl without what recompute changes by design: timing (tokens_per_s, mfu,
// elapsed_s, waits, the all-to-alls' seconds), peak RSS and the resources line (its collective
// counts include the recomputed forward's).
std::string metrics_without_timing(const std::string& path) {
    std::istringstream in(read_file(path));
    std::string out;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line);
        for (const char* k : {"tokens_per_s", "mfu", "elapsed_s", "grad_reduce_wait_s",
                              "peak_rss_bytes", "resources", "a2a_raw_s", "a2a_exposed_s"}) {
            j.erase(k);
        }
        out += j.dump() + "\n";
    }
    return out;
}

class RecomputeTest : public TinyRunsSuite<::testing::TestWithParam<int>> {};

void expect_same_as_none(const TinyRuns& runs, int P, const std::string& model) {
    const int ep = P;
    for (const char* rc : {"none", "moe", "block"}) {
        const std::string run = fmt::format("{}-p{}-{}", model, P, rc);
        const std::string args =
            runs.train_args(run, P, ep, "auto") +
            fmt::format(
                " --set model.n_layer=3 --set model.moe_every=1 --set train.recompute={} {}", rc,
                model == "noisy"  ? "--set model.gate=noisy --set model.jitter=0.1"
                : model == "bf16" ? "--set model.gate=noisy --set precision.dtype=bf16"
                                  : "--set model.gate=swipe");
        const CommandResult r = TinyRuns::run(P, args);
        ASSERT_EQ(r.status, 0) << r.output;
    }
    const std::string ref     = runs.path(fmt::format("{}-p{}-none", model, P));
    const std::string metrics = metrics_without_timing(ref + "/metrics.jsonl");
    const std::string weights = read_file(ref + "/model/model.safetensors");
    ASSERT_NE(metrics.find("\"aux_loss\""), std::string::npos);
    for (const char* rc : {"moe", "block"}) {
        const std::string run = runs.path(fmt::format("{}-p{}-{}", model, P, rc));
        EXPECT_EQ(metrics_without_timing(run + "/metrics.jsonl"), metrics) << rc;
        EXPECT_TRUE(read_file(run + "/model/model.safetensors") == weights)
            << rc << ": exported model differs";
    }
}

TEST_P(RecomputeTest, NoisyGateBitwiseSameAsNone) {
    expect_same_as_none(*runs_, GetParam(), "noisy");
}
TEST_P(RecomputeTest, SwipeBitwiseSameAsNone) { expect_same_as_none(*runs_, GetParam(), "swipe"); }
// bf16 with the BaGuaLu policy: the all-to-all carries 16-bit rows (moe_layer.h)
TEST_P(RecomputeTest, Bf16BitwiseSameAsNone) { expect_same_as_none(*runs_, GetParam(), "bf16"); }

INSTANTIATE_TEST_SUITE_P(Ranks, RecomputeTest, ::testing::Values(1, 2),
                         [](const auto& p) { return fmt::format("np{}", p.param); });

}  // namespace
}  // namespace bagualu::testing

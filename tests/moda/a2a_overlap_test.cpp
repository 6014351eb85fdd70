// The expert all-to-all cut into pieces and overlapped with the experts (parallel.a2a_chunks,
// moe_layer.h) under mpirun -np 4: bitwise the same losses, gradient norms and exported model
// as one exchange per move, at EP = 4 and EP = 2, in FP32 and bf16 (half payloads) and with the
// MoE forward run again in backward; the run reports that pieces were exchanged. And the shared
// experts computed while the routed tokens travel (parallel.overlap_shared) against computed
// before: bitwise the same, with one shared expert (forward and backward overlapped) and two
// (forward only). And the expert exchange in two phases over a grid (parallel.a2a_grid) against
// the direct one, flat and between the leaders of 4 one-rank nodes: bitwise the same.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

class A2aOverlapTest : public TinyRunsSuite<> {};

struct Run {
    std::vector<std::pair<double, double>> loss_norm;  // per step, exactly as logged
    int64_t pieces = 0;                                // a2a_pieces of the final record
    int64_t beside = 0;                                // a2a_beside_shared
    int64_t a2av   = 0;  // alltoallv calls in the steps, all ranks (the resources record)
};

Run read(const std::string& path) {
    Run out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) out.loss_norm.emplace_back(j["loss"], j["grad_norm"]);
        if (j.contains("a2a_pieces")) out.pieces = j["a2a_pieces"];
        if (j.contains("a2a_beside_shared")) out.beside = j["a2a_beside_shared"];
        if (j.contains("resources")) out.a2av = j["resources"]["comm"]["alltoallv"]["calls"];
    }
    return out;
}

// 10 steps of one micro-step of 4 sequences per rank at EP = ep, once with each of two
// settings (`extra` + off, `extra` + on); both must give the same losses, gradient norms and
// exported model. Returns the two runs (off, on).
std::pair<Run, Run> run_pair(const TinyRuns& runs, int ep, const std::string& extra,
                             const std::string& off, const std::string& on,
                             const std::string& name) {
    auto args = [&](const std::string& run, const std::string& setting) {
        return fmt::format(
            "train --config configs/tiny.toml{} --run-dir {} --set train.steps=10 "
            "--set train.batch_size=16 --set train.micro_batch_size=4 --set train.log_every=1 "
            "--set train.eval_every=0 --set train.threads=1 --set sample.n_samples=0 "
            "--set parallel.expert_parallel={}{} {} --force",
            runs.data_args(), runs.path(run), ep, extra, setting);
    };
    const CommandResult r0 = TinyRuns::run_mpi(4, args(name + "-off", off));
    EXPECT_EQ(r0.status, 0) << r0.output;
    const CommandResult r1 = TinyRuns::run_mpi(4, args(name + "-on", on));
    EXPECT_EQ(r1.status, 0) << r1.output;
    const Run a = read(runs.path(name + "-off/metrics.jsonl"));
    const Run b = read(runs.path(name + "-on/metrics.jsonl"));
    EXPECT_EQ(a.loss_norm.size(), 10u) << name;
    EXPECT_EQ(a.loss_norm, b.loss_norm) << name << ": losses and gradient norms bitwise";
    EXPECT_EQ(read_file(runs.path(name + "-off/model/model.safetensors")),
              read_file(runs.path(name + "-on/model/model.safetensors")))
        << name << ": exported models bitwise";
    return {a, b};
}

// Zipf-skewed routing, 1 and 4 pieces.
void expect_same_bits(const TinyRuns& runs, int ep, const std::string& extra,
                      const std::string& name) {
    const auto [a, b] =
        run_pair(runs, ep, " --set model.route_override=zipf" + extra,
                 "--set parallel.a2a_chunks=1", "--set parallel.a2a_chunks=4", name);
    EXPECT_EQ(a.pieces, 0) << name;
    EXPECT_GT(b.pieces, 0) << name << ": the exchanges went in pieces";
}

TEST_F(A2aOverlapTest, EP4Fp32SameBits) { expect_same_bits(*runs_, 4, "", "ep4-fp32"); }

TEST_F(A2aOverlapTest, EP2Bf16SameBits) {
    expect_same_bits(*runs_, 2, " --set precision.dtype=bf16", "ep2-bf16");
}

TEST_F(A2aOverlapTest, EP4RecomputeMoeSameBits) {
    expect_same_bits(*runs_, 4, " --set train.recompute=moe", "ep4-recompute");
}

// Shared experts, overlap_shared off and on.
void expect_shared_same_bits(const TinyRuns& runs, int ep, int shared, const std::string& extra,
                             const std::string& name) {
    const auto [a, b] =
        run_pair(runs, ep, fmt::format(" --set model.n_shared_experts={}{}", shared, extra),
                 "--set parallel.overlap_shared=false", "--set parallel.overlap_shared=true", name);
    EXPECT_EQ(a.beside, 0) << name;
    EXPECT_GT(b.beside, 0) << name << ": dispatches ran beside the shared experts";
}

TEST_F(A2aOverlapTest, SharedExpertBesideDispatchSameBitsEP4) {
    expect_shared_same_bits(*runs_, 4, 1, "", "shared1-ep4");
}

TEST_F(A2aOverlapTest, TwoSharedExpertsBesideDispatchSameBitsEP2Bf16) {
    expect_shared_same_bits(*runs_, 2, 2, " --set precision.dtype=bf16", "shared2-ep2");
}

// parallel.a2a_grid = 2 against 0 with Zipf-skewed routing: each exchange of the grid run is
// three alltoallv calls (sizes, rows, columns) instead of one.
void expect_grid_same_bits(const TinyRuns& runs, const std::string& extra,
                           const std::string& name) {
    const auto [a, b] = run_pair(runs, 4, " --set model.route_override=zipf" + extra,
                                 "--set parallel.a2a_grid=0", "--set parallel.a2a_grid=2", name);
    EXPECT_GT(b.a2av, a.a2av) << name << ": the grid's exchanges ran";
}

TEST_F(A2aOverlapTest, GridExchangeSameBitsFlat) {
    expect_grid_same_bits(*runs_, " --set parallel.hierarchical_a2a=off", "grid-flat");
}

TEST_F(A2aOverlapTest, GridExchangeSameBitsBetweenLeadersBf16) {
    expect_grid_same_bits(*runs_, " --set parallel.ranks_per_node=1 --set precision.dtype=bf16",
                          "grid-leaders");
}

}  // namespace
}  // namespace bagualu::testing

// ParO end to end: `bagualu train` with optimizer.partition=on over P = 1, 2, 4 ranks, EP = 1
// and EP = P, gives the per-step loss, gradient norm and final parameters of one process with
// the replicated optimizer (20 steps, tiny config), and the reported optimizer-state bytes per
// rank are 8 N / P (m and v of N parameters; the FP32 parameters are the master weights). Also
// with recursive halving/doubling over 3 ranks.
#include <gtest/gtest.h>

#include "config/config.h"
#include "moda_runs.h"
#include "model/gpt.h"

namespace bagualu::testing {
namespace {

struct ParamCounts {
    double dense = 0, expert = 0;  // parameters of the whole model
};

ParamCounts tiny_counts() {
    const TrainConfig cfg = load_config(std::string(BGL_SOURCE_DIR) + "/configs/tiny.toml");
    const model::ParamLayout layout = model::make_layout(cfg.model);
    ParamCounts c;
    for (const model::ParamSpec& s : layout.specs()) {
        (s.expert ? c.expert : c.dense) += static_cast<double>(s.numel);
    }
    return c;
}

class ParoTest : public TinyRunsSuite<> {
   protected:
    // ep_of(P): the expert parallelism of the run over P ranks.
    void expect_same_as_replicated(const std::vector<int>& ranks, int (*ep_of)(int)) {
        const CommandResult a = bagualu(runs_->train_args("ref", 1, 1, "off"));
        ASSERT_EQ(a.status, 0) << a.output;
        const ParamCounts n = tiny_counts();
        const double all    = n.dense + n.expert;
        const StepLog ref   = read_steps(runs_->path("ref/metrics.jsonl"));
        EXPECT_NEAR(ref.first["optim_bytes"].get<double>(), 8 * all, 0.02 * 8 * all);
        for (const int P : ranks) {
            const int ep          = ep_of(P);
            const std::string run = fmt::format("paro_p{}_ep{}", P, ep);
            const CommandResult b = TinyRuns::run(P, runs_->train_args(run, P, ep, "on"));
            ASSERT_EQ(b.status, 0) << b.output;
            EXPECT_NE(b.output.find(fmt::format("ParO over {} rank(s)", P)), std::string::npos)
                << b.output;
            expect_same_training(*runs_, "ref", run);
            const StepLog l       = read_steps(runs_->path(run + "/metrics.jsonl"));
            const double optim    = l.first["optim_bytes"].get<double>();
            const double expected = 8 * all / P;
            EXPECT_NEAR(optim, expected, 0.02 * expected) << run;
            const double params = 4 * (n.dense + n.expert / ep);
            EXPECT_NEAR(l.first["param_bytes"].get<double>(), params, 0.02 * params) << run;
            std::printf("%s: optimizer state %.0f bytes per rank (8 N / P = %.0f)\n", run.c_str(),
                        optim, expected);
        }
    }
};

TEST_F(ParoTest, DataParallelMatchesReplicated) {
    expect_same_as_replicated({1, 2, 4}, [](int) { return 1; });
}
TEST_F(ParoTest, ExpertParallelMatchesReplicated) {
    expect_same_as_replicated({2, 4}, [](int P) { return P; });
}

// parallel.collectives = "halving": recursive halving/doubling over 3 ranks (a pair and a single
// rank, collectives.h) in ParO's reduce-scatters and all-gathers, and in the replicated
// optimizer's mean over 3 one-rank "nodes", trains as the ring does (the same math in another
// summation order). Both against the ring rather than one process: 8 sequences split 3 + 3 + 2
// already differ from one process beyond expect_same_training's tolerance, ring or not.
TEST_F(ParoTest, HalvingOverThreeRanksTrainsAsTheRing) {
    for (const char* partition : {"on", "off"}) {
        std::string run[2];
        for (int i = 0; i < 2; ++i) {
            const char* algo      = i == 0 ? "ring" : "halving";
            run[i]                = fmt::format("p3_{}_{}", partition, algo);
            const CommandResult b = TinyRuns::run(
                3, runs_->train_args(run[i], 3, 1, partition) +
                       fmt::format(" --set parallel.collectives={} --set parallel.ranks_per_node=1"
                                   " --set train.micro_batch_size=2",  // 8 = 3 + 3 + 2
                                   algo));
            ASSERT_EQ(b.status, 0) << b.output;
            EXPECT_NE(b.output.find(i == 0 ? "(ring)" : "(halving/doubling)"), std::string::npos)
                << b.output;
        }
        expect_same_training(*runs_, run[0], run[1]);
    }
}

}  // namespace
}  // namespace bagualu::testing

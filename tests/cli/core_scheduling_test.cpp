// Ranks that a launcher gave one CPU mask split it (dist/node_cpus.h) instead of each pinning its
// compute threads to the same first CPUs: under `mpirun --bind-to none -np 2` on this machine
// each rank runs one thread per CPU of its own part; the results are those of one thread.
#include <gtest/gtest.h>

#include <string>

#include "../common/run_command.h"
#include "../common/token_shards.h"
#include "core/thread_pool.h"
#include "dist/node_cpus.h"

namespace bagualu::testing {
namespace {

TEST(CoreScheduling, RanksGivenOneMaskSplitItsCpus) {
    const int cpus = static_cast<int>(launcher_cpus().size());
    if (cpus < 2) GTEST_SKIP() << "needs 2 CPUs in the affinity mask, has " << cpus;
    TempDir dir;
    write_small_shards(dir);
    const std::string args =
        "train --config configs/tiny.toml --set model.vocab_size=128 --set data.train=" +
        (dir / "train.bin") + " --set data.val=" + (dir / "val.bin") +
        " --set data.tokenizer=" + (dir / "none.model") +
        " --set train.steps=2 --set sample.n_samples=0 --run-dir " + (dir / "run");
    const CommandResult r =
        run_command(std::string("cd ") + BGL_SOURCE_DIR + " && timeout 120 " + BGL_MPIEXEC +
                    " --allow-run-as-root --bind-to none -np 2 " + BGL_BINARY + " " + args);
    ASSERT_EQ(r.status, 0) << r.output;
    // rank 0 takes the first half of the mask, and says so
    const std::string want = "compute: " + std::to_string(cpus / 2) +
                             " threads per rank (rank 0 on CPUs " +
                             cpu_list_text(dist::cpu_part(launcher_cpus(), 0, 2)) +
                             ", its part of " + cpu_list_text(launcher_cpus()) + " shared";
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
    // an explicit thread count beyond the part is warned of
    const CommandResult over =
        run_command(std::string("cd ") + BGL_SOURCE_DIR + " && timeout 120 " + BGL_MPIEXEC +
                    " --allow-run-as-root --bind-to none -np 2 " + BGL_BINARY + " " + args +
                    " --force" + " --set train.threads=" + std::to_string(cpus));
    EXPECT_EQ(over.status, 0) << over.output;
    EXPECT_NE(over.output.find("warning: train.threads = " + std::to_string(cpus)),
              std::string::npos)
        << over.output;
}

}  // namespace
}  // namespace bagualu::testing

// Failure scenarios end the whole job quickly: each test runs this binary under
// `timeout 60 mpirun -np N` with BGL_MPI_TEST_MODE set (see mpi_main.cpp), then checks the exit
// status, the time taken and that the error line appears exactly once. These tests launch mpirun
// themselves, so they only run when the binary was not started by a launcher.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "dist/comm/comm.h"

namespace bagualu::dist {
namespace {

struct Launch {
    int status     = -1;  // exit status of `timeout mpirun ...` (124: it hung)
    double seconds = 0;
    std::string output;  // stdout and stderr of every rank and of mpirun
};

Launch launch(const std::string& mode, int np) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string cmd  = "BGL_MPI_TEST_MODE=" + mode +
                            " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
                            " timeout 60 " BGL_MPIEXEC
                            " --oversubscribe -x BGL_MPI_TEST_MODE"
                            " -np " +
                            std::to_string(np) + " " + self + " 2>&1";
    Launch out;
    const auto t0 = std::chrono::steady_clock::now();
    FILE* pipe    = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return out;
    char buf[4096];
    while (size_t got = fread(buf, 1, sizeof(buf), pipe)) out.output.append(buf, got);
    const int raw = pclose(pipe);
    out.seconds   = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.status    = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    return out;
}

size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
    return n;
}

class MpiLaunch : public testing::Test {
   protected:
    void SetUp() override {
        if (launched_by_mpi()) GTEST_SKIP() << "launches mpirun itself; run without mpirun";
    }
};

TEST_F(MpiLaunch, ConfigHashMismatchEndsEveryRankWithStatus2) {
    const Launch l = launch("hash_mismatch", 4);
    EXPECT_EQ(l.status, 2) << l.output;
    EXPECT_EQ(count(l.output, "error: config hash differs across ranks"), 1u) << l.output;
    EXPECT_EQ(count(l.output, "ranks 1, 3 have 0000000000000bad"), 1u) << l.output;
    EXPECT_LT(l.seconds, 30);
}

TEST_F(MpiLaunch, InputErrorOnSomeRanksIsPrintedOnceByTheLowest) {
    const Launch l = launch("input_error", 4);
    EXPECT_EQ(l.status, 2) << l.output;
    EXPECT_EQ(count(l.output, "error: bad config on rank 2 (rank 2)"), 1u) << l.output;
    EXPECT_EQ(count(l.output, "bad config on rank 3"), 0u) << l.output;
    EXPECT_LT(l.seconds, 30);
}

TEST_F(MpiLaunch, RankExitingEarlyEndsTheJob) {
    const Launch l = launch("exit_early", 2);
    EXPECT_NE(l.status, 0) << l.output;
    EXPECT_NE(l.status, 124) << "hung:\n" << l.output;
    EXPECT_LT(l.seconds, 30);
}

TEST_F(MpiLaunch, RankAbortingEndsTheJob) {
    const Launch l = launch("abort", 2);
    EXPECT_NE(l.status, 0) << l.output;
    EXPECT_NE(l.status, 124) << "hung:\n" << l.output;
    EXPECT_EQ(count(l.output, "rank 1 gives up"), 1u) << l.output;
    EXPECT_LT(l.seconds, 30);
}

TEST_F(MpiLaunch, RankKilledEndsTheJob) {
    const Launch l = launch("killed", 2);
    EXPECT_NE(l.status, 0) << l.output;
    EXPECT_NE(l.status, 124) << "hung:\n" << l.output;
    EXPECT_LT(l.seconds, 30);
}

}  // namespace
}  // namespace bagualu::dist

// main() of mpi_tests: creates the world before gtest (MPI_Init must come first) and finalizes it
// after. With BGL_MPI_TEST_MODE set it instead plays one failure scenario (a config mismatch, an
// input error, a rank dying) for MpiLaunch.* in launch_test.cpp, which runs it under mpirun.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "dist/comm/checks.h"
#include "mpi_world.h"

namespace bagualu::dist {

namespace {
std::unique_ptr<Comm> g_world;

int play_failure(const std::string& mode, Comm& w) {
    const int r = w.rank();
    if (mode == "hash_mismatch") {
        check_same_everywhere(w, r == 1 || r == 3 ? 0xbadull : 0x600dull, "config hash");
    } else if (mode == "input_error") {
        check_all_ok(w, r < 2, "bad config on rank " + std::to_string(r));
    } else if (mode == "exit_early") {
        if (r == 1) std::exit(3);
    } else if (mode == "abort") {
        if (r == 1) w.abort(5, "rank 1 gives up");
    } else if (mode == "killed") {
        if (r == 1) std::raise(SIGKILL);
    } else {
        w.abort(1, "unknown BGL_MPI_TEST_MODE " + mode);
    }
    w.barrier();  // ranks that did not fail wait here until the launcher ends the job
    return 0;
}
}  // namespace

Comm& test_world() { return *g_world; }

}  // namespace bagualu::dist

int main(int argc, char** argv) {
    using namespace bagualu::dist;
    g_world = init_world(&argc, &argv);
    int rc  = 0;
    if (const char* mode = std::getenv("BGL_MPI_TEST_MODE")) {
        rc = play_failure(mode, *g_world);
    } else {
        testing::InitGoogleTest(&argc, argv);
        rc = RUN_ALL_TESTS();
    }
    g_world.reset();
    finalize_world();
    return rc;
}

// Multi-rank failure modes of `mpirun bagualu train`: a config that differs between ranks, bad
// input on one rank only, and the hierarchical all-to-all option. Each failing job must end
// every rank with one clear message and status 2 — never hang (every launch runs under
// `timeout`, so a hang fails the test instead of blocking it).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "../common/run_command.h"
#include "data/token_file.h"

namespace bagualu::testing {
namespace {

class MoDaFailureTest : public ::testing::Test {
   protected:
    void SetUp() override {
        std::vector<int32_t> tokens(4000);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 13) % 101);
        data::write_token_file(dir / "train.bin", tokens, 128);
        data::write_token_file(dir / "val.bin", tokens, 128);
    }
    std::string args(const std::string& run, const std::string& extra = "") const {
        return fmt::format(
            "{} train --config configs/tiny.toml --run-dir {} --set model.vocab_size=128 "
            "--set data.train={} --set data.val={} --set data.tokenizer={} --set train.steps=3 "
            "--set train.threads=1 --set train.micro_batch_size=2 --set sample.n_samples=0 {}",
            BGL_BINARY, dir / run, dir / "train.bin", dir / "val.bin", dir / "none.model", extra);
    }
    static CommandResult mpirun(const std::string& apps) {
        return run_command(
            fmt::format("cd {} && timeout 120 {} --allow-run-as-root --oversubscribe {}",
                        BGL_SOURCE_DIR, BGL_MPIEXEC, apps));
    }
    static size_t count(const std::string& s, const std::string& needle) {
        size_t n = 0;
        for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
        return n;
    }
    TempDir dir;
};

TEST_F(MoDaFailureTest, ConfigThatDiffersBetweenRanksEndsTheJob) {
    const CommandResult r =
        mpirun(fmt::format("-np 1 {} : -np 1 {}", args("a", "--set train.lr=0.001"),
                           args("a", "--set train.lr=0.002")));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "resolved config differs across ranks"), 1u) << r.output;
}

TEST_F(MoDaFailureTest, BadInputOnOneRankEndsEveryRank) {
    const CommandResult r = mpirun(fmt::format(
        "-np 1 {} : -np 1 {}", args("b"), args("b", "--set data.val=" + (dir / "missing.bin"))));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "missing.bin"), 1u) << r.output;
}

TEST_F(MoDaFailureTest, HierarchicalAllToAllTrains) {
    const CommandResult flat = mpirun(fmt::format(
        "-np 4 {}",
        args("flat", "--set train.micro_batch_size=1 --set parallel.expert_parallel=4")));
    ASSERT_EQ(flat.status, 0) << flat.output;
    const CommandResult hier = mpirun(fmt::format(
        "-np 4 {}", args("hier",
                         "--set train.micro_batch_size=1 --set parallel.expert_parallel=4 "
                         "--set parallel.hierarchical_a2a=on")));
    ASSERT_EQ(hier.status, 0) << hier.output;
    // the same rows arrive in the same order: bit-identical training
    EXPECT_EQ(read_file(dir / "flat/model/model.safetensors"),
              read_file(dir / "hier/model/model.safetensors"));
}

TEST_F(MoDaFailureTest, RankKilledMidRunEndsTheJobWithinSeconds) {
    // Start a long run, wait for its first steps, kill -9 one rank, time how long mpirun takes.
    const std::string script = fmt::format(
        "cd {src} && (timeout 120 {mpi} --allow-run-as-root --oversubscribe -np 2 {args} > {log} "
        "2>&1; "
        "echo $? > {rc}) & "
        "for i in $(seq 1 300); do grep -q 'step ' {log} 2>/dev/null && break; sleep 0.1; done; "
        "pid=$(pgrep -f '^{bin} train.*{run}' | tail -n 1); kill -9 $pid; t0=$(date +%s); "
        "for i in $(seq 1 600); do [ -s {rc} ] && break; sleep 0.1; done; "
        "echo rc=$(cat {rc}) seconds=$(( $(date +%s) - t0 ))",
        fmt::arg("src", BGL_SOURCE_DIR), fmt::arg("mpi", BGL_MPIEXEC),
        fmt::arg("args", args("kill", "--set train.steps=100000 --set train.log_every=1")),
        fmt::arg("log", dir / "kill.log"), fmt::arg("rc", dir / "kill.rc"),
        fmt::arg("bin", BGL_BINARY), fmt::arg("run", dir / "kill"));
    const CommandResult r = run_command(script);
    int rc = -1, seconds = -1;
    ASSERT_EQ(std::sscanf(r.output.c_str(), "rc=%d seconds=%d", &rc, &seconds), 2) << r.output;
    std::printf("rank killed: mpirun exited with %d after %d s\n", rc, seconds);
    EXPECT_NE(rc, 0) << read_file(dir / "kill.log");
    EXPECT_NE(rc, 124) << "the job hung until timeout";
    EXPECT_LE(seconds, 15) << read_file(dir / "kill.log");
}

TEST_F(MoDaFailureTest, ShardChangedUnderTheJobEndsEveryRankWithinSeconds) {
    // Overwritten in place with an id >= vocab (every rank reads: data.readers = 0), and
    // truncated (rank 0 reads for both: data.readers = 1). Every rank must end within 5 s of
    // the change, with one message and status 2, never a signal.
    for (const int readers : {0, 1}) {
        const std::string run   = fmt::format("changed{}", readers);
        const std::string extra = fmt::format(
            "--set train.steps=100000 --set train.log_every=1 --set train.eval_every=0 "
            "--set data.readers={}",
            readers);

        auto job =
            std::async(std::launch::async, [&] { return mpirun("-np 2 " + args(run, extra)); });
        bool started = false;
        for (int i = 0; i < 600 && !started; ++i) {
            started =
                read_file(dir / (run + "/metrics.jsonl")).find("\"loss\"") != std::string::npos;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        ASSERT_TRUE(started) << job.get().output;
        if (readers == 0) {
            std::fstream f(dir / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(data::kTokenFileHeaderBytes);
            const std::vector<uint16_t> body(4000, 300);
            f.write(reinterpret_cast<const char*>(body.data()),
                    static_cast<std::streamsize>(body.size() * 2));
        } else {
            std::filesystem::resize_file(dir / "train.bin", data::kTokenFileHeaderBytes + 10);
        }
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(job.wait_for(std::chrono::seconds(60)), std::future_status::ready);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const CommandResult r = job.get();
        std::printf("data.readers = %d: the job ended %.2f s after the change\n", readers, s);
        EXPECT_LT(s, 5.0) << r.output;
        EXPECT_EQ(r.status, 2) << r.output;
        const std::string needle = readers == 0 ? "vocab_size 128" : "was truncated";
        EXPECT_EQ(count(r.output, needle), 1u) << r.output;
        EXPECT_EQ(count(r.output, "bagualu: error:"), 1u) << r.output;
        SetUp();  // a fresh train.bin for the next case
    }
}

}  // namespace
}  // namespace bagualu::testing

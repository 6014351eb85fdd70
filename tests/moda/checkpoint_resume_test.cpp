// Checkpoints end to end with `bagualu train`: a run killed with SIGKILL in the middle of step 25
// resumes from its last complete checkpoint and reproduces the uninterrupted run bit for bit
// (P = 1 and P = 2); checkpoints load in other layouts (P, EP) and continue with the loss the
// writing layout computes; corrupted, truncated and incomplete checkpoints are reported and
// skipped; export --checkpoint and inspect read any of them.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

// step -> loss of every logged step in a run's metrics.jsonl
std::map<int64_t, double> losses_by_step(const std::string& path) {
    std::map<int64_t, double> out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) {
            EXPECT_FALSE(out.contains(j["step"].get<int64_t>())) << "step logged twice: " << line;
            out[j["step"].get<int64_t>()] = j["loss"].get<double>();
        }
    }
    return out;
}

std::string checkpoint_of(const std::string& root, int step) {
    return fmt::format("{}/step_{:08d}", root, step);
}

class CheckpointTest : public TinyRunsSuite<> {
   protected:
    // `steps` steps of the tiny config at (P, EP); extra: more --set flags or --resume.
    static std::string args(const std::string& run, int P, int ep, int steps,
                            const std::string& extra) {
        return fmt::format("{} --set train.steps={} {}", runs_->train_args(run, P, ep, "auto"),
                           steps, extra);
    }
    // The same run killed (SIGKILL) on `rank` after the backward pass of step `kill_step`.
    static CommandResult run_killed(int P, int kill_step, int rank, const std::string& a) {
        const std::string env = fmt::format(
            "BAGUALU_FAULT_KILL_AT_STEP={} BAGUALU_FAULT_KILL_RANK={}", kill_step, rank);
        if (P == 1)
            return run_command(
                fmt::format("cd {} && {} {} {}", BGL_SOURCE_DIR, env, BGL_BINARY, a));
        return run_command(
            fmt::format("cd {} && {} timeout 300 {} --allow-run-as-root --oversubscribe -x "
                        "BAGUALU_FAULT_KILL_AT_STEP "
                        "-x BAGUALU_FAULT_KILL_RANK -np {} {} {}",
                        BGL_SOURCE_DIR, env, BGL_MPIEXEC, P, BGL_BINARY, a));
    }

    // extra: settings of both runs (e.g. mixed precision); name: tells the runs apart.
    void bit_exact_resume(int P, const std::string& extra = "", const std::string& name = "") {
        const int ep            = P;
        const std::string ref   = fmt::format("ref40_p{}{}", P, name),
                          crash = fmt::format("crash_p{}{}", P, name);
        const CommandResult a   = TinyRuns::run(P, args(ref, P, ep, 40, extra));
        ASSERT_EQ(a.status, 0) << a.output;

        const std::string ck       = " --set checkpoint.every=10 " + extra;
        const CommandResult killed = run_killed(P, 25, P - 1, args(crash, P, ep, 40, ck));
        ASSERT_NE(killed.status, 0) << "the injected SIGKILL did not end the run\n"
                                    << killed.output;
        EXPECT_FALSE(fs::exists(runs_->path(crash + "/model")));
        EXPECT_TRUE(fs::exists(checkpoint_of(runs_->path(crash + "/checkpoints"), 10)));

        const CommandResult resumed = TinyRuns::run(P, args(crash, P, ep, 40, ck + " --resume"));
        ASSERT_EQ(resumed.status, 0) << resumed.output;
        // step 20's checkpoint is complete unless the kill came before its files were written
        const bool from20 = resumed.output.find("step_00000020 (step 20)") != std::string::npos;
        EXPECT_TRUE(from20 || resumed.output.find("step_00000010 (step 10)") != std::string::npos)
            << resumed.output;
        std::printf("P = %d: resumed from step %d\n", P, from20 ? 20 : 10);

        const auto la = losses_by_step(runs_->path(ref + "/metrics.jsonl"));
        const auto lb = losses_by_step(runs_->path(crash + "/metrics.jsonl"));
        ASSERT_EQ(la.size(), 40u);
        ASSERT_EQ(lb.size(), 40u) << "the resumed run's metrics.jsonl must hold each step once";
        for (int64_t s = 21; s <= 40; ++s) {
            EXPECT_EQ(la.at(s), lb.at(s)) << "loss of step " << s << " is not bitwise the same";
        }
        expect_same_model_bits(runs_->path(ref + "/model/model.safetensors"),
                               runs_->path(crash + "/model/model.safetensors"));
    }
};

TEST_F(CheckpointTest, KilledRunResumesBitExactOneRank) { bit_exact_resume(1); }
TEST_F(CheckpointTest, KilledRunResumesBitExactTwoRanks) { bit_exact_resume(2); }
// Mixed precision: the checkpoint holds the FP32 masters of the half-stored tensors (ParO shards
// at P = 2, the replicated optimizer at P = 1) and fp16's loss scale and skipped-step count.
TEST_F(CheckpointTest, KilledBf16RunResumesBitExactTwoRanks) {
    bit_exact_resume(2, "--set precision.dtype=bf16", "_bf16");
}
// One rank: the replicated optimizer, whose bf16 masters are the parameters themselves
// (model::masters_in_place): the checkpoint's "param/" are those parameters, and the resumed run
// keeps them as they are.
TEST_F(CheckpointTest, KilledBf16RunResumesBitExactOneRank) {
    bit_exact_resume(1, "--set precision.dtype=bf16", "_bf16");
}
// The balancing bias is trainer state (manifest), restored on resume: the bias and everything
// it routes continue bit for bit.
TEST_F(CheckpointTest, KilledRunWithBalanceBiasResumesBitExactTwoRanks) {
    bit_exact_resume(2, "--set model.balance_bias_rate=0.01", "_bias");
}
// AdamW's moments in bf16 (precision.moments): the checkpoint holds them widened to float32, and
// the resumed run rounds them back to the same bits: ParO's shards at P = 2, the replicated
// optimizer at P = 1.
TEST_F(CheckpointTest, KilledRunWithBf16MomentsResumesBitExactTwoRanks) {
    bit_exact_resume(2, "--set precision.dtype=bf16 --set precision.moments=bf16", "_bf16m");
}
TEST_F(CheckpointTest, KilledRunWithBf16MomentsResumesBitExactOneRank) {
    bit_exact_resume(1, "--set precision.dtype=bf16 --set precision.moments=bf16", "_bf16m");
}
TEST_F(CheckpointTest, KilledFp16RunResumesBitExactOneRank) {
    bit_exact_resume(1, "--set precision.dtype=fp16 --set precision.loss_scale_window=7", "_fp16");
}

// A signal asks the run to stop (core/stop_signal.h): SIGUSR1, which mpirun forwards to every
// rank, raised here on rank 1 alone during step 13 of a run with no periodic checkpoints. Both
// ranks stop after step 13 with a checkpoint of it, the exit status is 128 + SIGUSR1's number,
// and --resume continues to step 40 bit for bit as the run that was never stopped.
TEST_F(CheckpointTest, SignalledRunStopsWithACheckpointAndResumesBitExact) {
    const int P           = 2;
    const CommandResult a = TinyRuns::run(P, args("ref40_sig", P, P, 40, ""));
    ASSERT_EQ(a.status, 0) << a.output;
    const CommandResult stopped = run_command(fmt::format(
        "cd {} && BAGUALU_FAULT_SIGNAL_AT_STEP=13 BAGUALU_FAULT_SIGNAL_RANK=1 "
        "BAGUALU_FAULT_SIGNAL={} timeout 300 {} --allow-run-as-root --oversubscribe -x "
        "BAGUALU_FAULT_SIGNAL_AT_STEP -x BAGUALU_FAULT_SIGNAL_RANK -x BAGUALU_FAULT_SIGNAL -np {} "
        "{} {}",
        BGL_SOURCE_DIR, SIGUSR1, BGL_MPIEXEC, P, BGL_BINARY, args("sig", P, P, 40, "")));
    EXPECT_EQ(stopped.status, 128 + SIGUSR1) << stopped.output;
    EXPECT_NE(stopped.output.find("stopped by SIGUSR1 after step 13 of 40: checkpoint "),
              std::string::npos)
        << stopped.output;
    EXPECT_FALSE(fs::exists(runs_->path("sig/model")));  // no export of an unfinished run
    ASSERT_TRUE(fs::exists(checkpoint_of(runs_->path("sig/checkpoints"), 13) + "/manifest.json"));
    EXPECT_EQ(losses_by_step(runs_->path("sig/metrics.jsonl")).rbegin()->first, 13);

    const CommandResult resumed = TinyRuns::run(P, args("sig", P, P, 40, "--resume"));
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("step_00000013 (step 13)"), std::string::npos) << resumed.output;
    const auto la = losses_by_step(runs_->path("ref40_sig/metrics.jsonl"));
    const auto lb = losses_by_step(runs_->path("sig/metrics.jsonl"));
    ASSERT_EQ(lb.size(), 40u);
    for (int64_t s = 1; s <= 40; ++s) EXPECT_EQ(la.at(s), lb.at(s)) << "step " << s;
    expect_same_model_bits(runs_->path("ref40_sig/model/model.safetensors"),
                           runs_->path("sig/model/model.safetensors"));
}

// The same from outside, as a scheduler does it: SIGTERM to a one-process run at whatever step
// it has reached; it ends with status 128 + 15, a complete checkpoint of the step it stopped
// after, and the metrics' last line saying so.
TEST_F(CheckpointTest, SigtermFromOutsideStopsAfterAStepWithACheckpoint) {
    const std::string run = runs_->path("term");
    const CommandResult r = run_command(fmt::format(
        "cd {} && ({} {} & p=$!; for i in $(seq 600); do [ -s {}/metrics.jsonl ] && break; "
        "sleep 0.1; done; kill -TERM $p; wait $p; echo \"exit status $?\")",
        BGL_SOURCE_DIR, BGL_BINARY, args("term", 1, 1, 100000, ""), run));
    EXPECT_NE(r.output.find("exit status 143"), std::string::npos) << r.output;
    const auto at = r.output.find("stopped by SIGTERM after step ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const int step = std::atoi(r.output.c_str() + at + 30);
    ASSERT_GT(step, 0) << r.output;
    EXPECT_TRUE(fs::exists(checkpoint_of(run + "/checkpoints", step) + "/manifest.json"));
    std::istringstream lines(read_file(run + "/metrics.jsonl"));
    std::string line, last;
    while (std::getline(lines, line)) last = line.empty() ? last : line;
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j.value("stopped_by", ""), "SIGTERM") << last;
    EXPECT_EQ(j.value("step", int64_t{0}), step) << last;
    const CommandResult ins = bagualu("inspect " + checkpoint_of(run + "/checkpoints", step));
    EXPECT_EQ(ins.status, 0) << ins.output;
}

// Checkpoints of step 10 written at (4, 4) and at (2, 2) load at other layouts; the loss of the
// step after loading matches the writing layout's own step 11 within 1e-5 relative (the layouts
// sum in different orders; float rounding stays far below that, see moda_runs.h).
// bf16: from ParO's shards of the masters (2 ranks) to the replicated optimizer's masters in
// place (1 rank), and back; within 1e-4 (the runs reduce the gradients in other orders, and a
// bf16 rounding of a master that moves by 1e-7 can flip).
TEST_F(CheckpointTest, ReshardsToOtherLayouts) {
    struct Case {
        int from_p, from_ep;
        std::vector<std::pair<int, int>> to;
        std::string extra    = "";
        double tol           = 1e-5;
        std::string to_extra = "";  // the resumed run's settings where they differ from extra
        std::string name     = "";
    };
    const std::string bf = " --set precision.dtype=bf16";
    // bf16 AdamW moments (precision.moments) written as BF16 tensors and read by a run that keeps
    // float32 moments, and float32 moments rounded into a run that keeps bf16 ones
    const std::string m16 = bf + " --set precision.moments=bf16",
                      m32 = bf + " --set precision.moments=fp32";
    for (const Case& c : {Case{4, 4, {{2, 2}, {2, 1}, {1, 1}}}, Case{2, 2, {{4, 4}}},
                          Case{2, 2, {{1, 1}}, bf, 1e-4}, Case{1, 1, {{2, 2}}, bf, 1e-4},
                          Case{2, 2, {{1, 1}}, m16, 1e-4, m32, "_m16"},
                          Case{1, 1, {{2, 2}}, m32, 1e-4, m16, "_m32"}}) {
        const std::string src = fmt::format("src_p{}_ep{}{}", c.from_p, c.from_ep,
                                            !c.name.empty()   ? c.name
                                            : c.extra.empty() ? ""
                                                              : "_bf16");
        const CommandResult a = TinyRuns::run(
            c.from_p, args(src, c.from_p, c.from_ep, 12, "--set checkpoint.every=10" + c.extra));
        ASSERT_EQ(a.status, 0) << a.output;
        const auto ref = losses_by_step(runs_->path(src + "/metrics.jsonl"));
        for (const auto& [P, ep] : c.to) {
            const std::string dst = fmt::format("{}_to_p{}_ep{}", src, P, ep);
            fs::create_directories(runs_->path(dst + "/checkpoints"));
            fs::copy(checkpoint_of(runs_->path(src + "/checkpoints"), 10),
                     checkpoint_of(runs_->path(dst + "/checkpoints"), 10),
                     fs::copy_options::recursive);
            const CommandResult b = TinyRuns::run(
                P, args(dst, P, ep, 12, "--resume" + (c.to_extra.empty() ? c.extra : c.to_extra)));
            ASSERT_EQ(b.status, 0) << b.output;
            EXPECT_NE(b.output.find("(step 10)"), std::string::npos) << b.output;
            const auto got = losses_by_step(runs_->path(dst + "/metrics.jsonl"));
            for (const int64_t s : {11, 12}) {
                ASSERT_TRUE(got.contains(s)) << dst;
                EXPECT_NEAR(got.at(s), ref.at(s), c.tol * ref.at(s)) << dst << " step " << s;
            }
            std::printf("(%d, %d) -> (%d, %d): step 11 loss %.9f vs %.9f\n", c.from_p, c.from_ep, P,
                        ep, got.at(11), ref.at(11));
        }
    }
}

// A flipped byte (step 20), a truncated shard (step 15) and a missing manifest (step 10) are each
// reported and skipped: --resume continues from step 5, and nothing of the damaged checkpoints
// is deleted or overwritten.
TEST_F(CheckpointTest, DamagedCheckpointsAreReportedAndSkipped) {
    const std::string run  = "damaged";
    const std::string root = runs_->path(run + "/checkpoints");
    const std::string ck   = " --set checkpoint.every=5 --set checkpoint.keep=0";
    const CommandResult a  = TinyRuns::run(2, args(run, 2, 2, 20, ck));
    ASSERT_EQ(a.status, 0) << a.output;
    for (const int s : {5, 10, 15, 20})
        ASSERT_TRUE(fs::exists(checkpoint_of(root, s) + "/manifest.json")) << s;

    const std::string f20 = checkpoint_of(root, 20) + "/rank_00001.safetensors";
    {
        std::fstream f(f20, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-100, std::ios::end);
        char c = 0;
        f.read(&c, 1);
        c ^= 0x5a;
        f.seekp(-100, std::ios::end);
        f.write(&c, 1);
    }
    const std::string f15 = checkpoint_of(root, 15) + "/rank_00000.safetensors";
    fs::resize_file(f15, fs::file_size(f15) - 8);
    fs::remove(checkpoint_of(root, 10) + "/manifest.json");

    const CommandResult i20 = bagualu("inspect " + checkpoint_of(root, 20));
    EXPECT_EQ(i20.status, 1) << i20.output;
    EXPECT_NE(i20.output.find("CHECKSUM MISMATCH"), std::string::npos) << i20.output;
    const CommandResult i15 = bagualu("inspect " + checkpoint_of(root, 15));
    EXPECT_EQ(i15.status, 1) << i15.output;
    EXPECT_NE(i15.output.find("TRUNCATED"), std::string::npos) << i15.output;
    const CommandResult i10 = bagualu("inspect " + checkpoint_of(root, 10));
    EXPECT_EQ(i10.status, 2) << i10.output;
    EXPECT_NE(i10.output.find("manifest.json"), std::string::npos) << i10.output;

    const CommandResult b = TinyRuns::run(2, args(run, 2, 2, 22, ck + " --resume"));
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("checksum mismatch"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("truncated"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("step_00000010: no manifest.json"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("step_00000005 (step 5)"), std::string::npos) << b.output;
    // the damaged step_00000010/15/20 were replaced by the resumed run's own: the old ones moved
    // aside
    int aside = 0;
    for (const auto& e : fs::directory_iterator(root))
        aside += e.path().filename().string().find(".replaced-") != std::string::npos;
    EXPECT_EQ(aside, 3) << b.output;

    // every checkpoint left unusable: a one-line error, no training from scratch
    const std::string bad = "all_bad";
    ASSERT_EQ(TinyRuns::run(1, args(bad, 1, 1, 5, " --set checkpoint.every=5")).status, 0);
    fs::resize_file(checkpoint_of(runs_->path(bad + "/checkpoints"), 5) + "/rank_00000.safetensors",
                    10);
    const CommandResult c =
        TinyRuns::run(1, args(bad, 1, 1, 8, " --set checkpoint.every=5 --resume"));
    EXPECT_EQ(c.status, 2) << c.output;
    EXPECT_NE(c.output.find("no usable checkpoint"), std::string::npos) << c.output;
}

// A checkpoint of another model is refused with the key and both values named (from the config
// the checkpoint holds), before any tensor is read.
TEST_F(CheckpointTest, CheckpointOfAnotherModelIsRefused) {
    const std::string run = "other_model";
    ASSERT_EQ(TinyRuns::run(1, args(run, 1, 1, 5, "--set checkpoint.every=5")).status, 0);
    const CommandResult b = TinyRuns::run(
        1, args(run, 1, 1, 8, "--set checkpoint.every=5 --set model.d_ff=96 --resume"));
    EXPECT_EQ(b.status, 2) << b.output;
    EXPECT_NE(b.output.find("model.d_ff = 96 here, 128 in the checkpoint"), std::string::npos)
        << b.output;
}

// A fresh run refuses a run directory holding checkpoints unless resuming or forced.
TEST_F(CheckpointTest, FreshRunDoesNotMixWithOldCheckpoints) {
    const std::string run = "fresh";
    ASSERT_EQ(TinyRuns::run(1, args(run, 1, 1, 5, "--set checkpoint.every=5")).status, 0);
    fs::remove(runs_->path(run + "/metrics.jsonl"));
    // train_args passes --force; without it the old checkpoints stop the run
    std::string a = args(run, 1, 1, 5, "--set checkpoint.every=5");
    a.erase(a.find(" --force"), 8);
    const CommandResult b = TinyRuns::run(1, a);
    EXPECT_EQ(b.status, 2) << b.output;
    EXPECT_NE(b.output.find("checkpoint(s) of an earlier run"), std::string::npos) << b.output;
}

// export --checkpoint consolidates a (2, 2) checkpoint into the model the run exported itself.
// Also in mixed precision: the run's model holds the FP32 masters, as the checkpoint does (bf16
// on 2 ranks: ParO's master shards; fp16 on 1 rank: the replicated optimizer's master copy).
TEST_F(CheckpointTest, ExportFromCheckpointEqualsTheRunsModel) {
    struct Case {
        int P;
        std::string extra, name;
    };
    for (const Case& c : {Case{2, "", ""}, Case{2, " --set precision.dtype=bf16", "_bf16"},
                          Case{1, " --set precision.dtype=fp16", "_fp16"}}) {
        const std::string run = "export_src" + c.name;
        const CommandResult a =
            TinyRuns::run(c.P, args(run, c.P, c.P, 10, "--set checkpoint.every=10" + c.extra));
        ASSERT_EQ(a.status, 0) << a.output;
        const std::string ck  = checkpoint_of(runs_->path(run + "/checkpoints"), 10);
        const CommandResult i = bagualu("inspect " + runs_->path(run + "/checkpoints"));
        EXPECT_EQ(i.status, 0) << i.output;
        EXPECT_NE(i.output.find("all files pass"), std::string::npos) << i.output;
        const std::string out = "exported" + c.name;
        const CommandResult e = bagualu("export --checkpoint " + ck + " --out " + runs_->path(out));
        ASSERT_EQ(e.status, 0) << e.output;
        expect_same_model_bits(runs_->path(run + "/model/model.safetensors"),
                               runs_->path(out + "/model.safetensors"));
    }
}

}  // namespace
}  // namespace bagualu::testing

// Faults a careless or hostile user can cause, on one process: data that changes under a
// running job, run outputs that a second run or a stray link could destroy, writes that fail,
// and paths or manifests that are not what they claim. Each must end the run with one line and
// exit status 2 within seconds (never a signal, never a hang) and leave what was in the run and
// checkpoint directories before as it was. Multi-rank versions: tests/moda/moda_failures_test.cpp.
// Every launch runs under `timeout`, so a hang fails the test instead of blocking it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "../common/run_command.h"
#include "../common/token_shards.h"
#include "data/token_file.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;
using Clock  = std::chrono::steady_clock;

// The promise: a fault ends the run within this many seconds of happening.
constexpr int kEndsWithinS = 5;

class FaultTest : public ::testing::Test {
   protected:
    void SetUp() override { write_small_shards(dir); }
    // `train` on the tiny model over dir's shards into dir/run (or `run`).
    std::string train(const std::string& extra, const std::string& run = "run") const {
        return fmt::format(
            "train --config configs/tiny.toml --run-dir {} --set model.vocab_size=128 "
            "--set data.train={} --set data.val={} --set data.tokenizer={} --set train.steps=2 "
            "--set train.threads=1 --set train.eval_every=0 --set sample.n_samples=0 {}",
            dir / run, dir / "train.bin", dir / "val.bin", dir / "none.model", extra);
    }
    // A run of many steps, each logged: long enough to be interfered with.
    std::string long_train(const std::string& extra = "", const std::string& run = "run") const {
        return train("--set train.steps=100000 --set train.log_every=1 " + extra, run);
    }
    static CommandResult run(const std::string& args) {
        return run_command(
            fmt::format("cd {} && timeout 60 {} {}", BGL_SOURCE_DIR, BGL_BINARY, args));
    }
    static std::future<CommandResult> start(const std::string& args) {
        return std::async(std::launch::async, [args] { return run(args); });
    }
    // Waits (up to 30 s) until the run writing `metrics` has logged a step.
    static bool wait_for_step(const std::string& metrics) {
        for (int i = 0; i < 600; ++i) {
            if (read_file(metrics).find("\"loss\"") != std::string::npos) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    }
    // Status 2; exactly one error line, the last one, holding every needle.
    static void expect_one_error(const CommandResult& r,
                                 std::initializer_list<std::string> needles) {
        EXPECT_EQ(r.status, 2) << r.output;
        std::string out = r.output;
        while (!out.empty() && out.back() == '\n') out.pop_back();
        const std::string last =
            out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
        EXPECT_EQ(last.rfind("bagualu: error: ", 0), 0u) << "last line is not the error:\n"
                                                         << r.output;
        EXPECT_EQ(out.find("error"), out.rfind("error")) << "more than one error line:\n"
                                                         << r.output;
        for (const auto& n : needles)
            EXPECT_NE(last.find(n), std::string::npos) << "'" << n << "' not in: " << last;
    }
    // Starts a long run, changes train.bin with `change` once it has logged a step, and expects
    // the run to end within kEndsWithinS with one error line holding every needle.
    void expect_change_ends_run(const std::function<void()>& change,
                                std::initializer_list<std::string> needles) {
        auto job = start(long_train());
        ASSERT_TRUE(wait_for_step(dir / "run/metrics.jsonl")) << job.get().output;
        change();
        const auto t0 = Clock::now();
        ASSERT_EQ(job.wait_for(std::chrono::seconds(kEndsWithinS + 30)), std::future_status::ready);
        const double s        = std::chrono::duration<double>(Clock::now() - t0).count();
        const CommandResult r = job.get();
        EXPECT_LT(s, kEndsWithinS) << r.output;
        expect_one_error(r, needles);
        std::printf("changed shard: the run ended %.2f s after the change\n", s);
    }
    // Overwrites every token of train.bin in place (same inode, same size) with `id`.
    void overwrite_tokens(uint16_t id) const {
        std::fstream f(dir / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(data::kTokenFileHeaderBytes);
        const std::vector<uint16_t> body(2000, id);
        f.write(reinterpret_cast<const char*>(body.data()),
                static_cast<std::streamsize>(body.size() * 2));
    }
    TempDir dir;
};

// ---- 1. data that changes under a running job ----

TEST_F(FaultTest, ShardOverwrittenWithIdAboveVocabEndsTheRun) {
    expect_change_ends_run([&] { overwrite_tokens(200); },
                           {"train.bin", "token 200", "vocab_size 128", "changed"});
}

TEST_F(FaultTest, ShardOverwrittenWithIdFFFFEndsTheRun) {
    expect_change_ends_run([&] { overwrite_tokens(0xFFFF); },
                           {"train.bin", "token 65535", "changed"});
}

TEST_F(FaultTest, ShardTruncatedUnderTheRunEndsItWithoutASignal) {
    expect_change_ends_run(
        [&] { fs::resize_file(dir / "train.bin", data::kTokenFileHeaderBytes + 10); },
        {"train.bin", "truncated"});
}

TEST_F(FaultTest, ShardThatIsAFifoIsRefusedWithoutBlocking) {
    ASSERT_EQ(::mkfifo((dir / "fifo.bin").c_str(), 0600), 0);
    expect_one_error(run(train("--set data.train=" + (dir / "fifo.bin"))), {"fifo.bin", "FIFO"});
    ASSERT_EQ(::mkfifo((dir / "tok.model").c_str(), 0600), 0);
    expect_one_error(run(train("--set data.tokenizer=" + (dir / "tok.model"))),
                     {"tok.model", "regular"});
    ASSERT_EQ(::mkfifo((dir / "cfg.toml").c_str(), 0600), 0);
    const CommandResult r = run("train --config " + (dir / "cfg.toml"));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("regular file"), std::string::npos) << r.output;
}

TEST_F(FaultTest, ModelFilesThatAreFifosAreRefusedWithoutBlocking) {
    ASSERT_EQ(run(train("")).status, 0);
    for (const char* name : {"config.json", "model.safetensors"}) {
        const std::string path = dir / ("run/model/" + std::string(name));
        fs::rename(path, path + ".keep");
        ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
        expect_one_error(
            run("eval --model " + (dir / "run") +
                " --config configs/tiny.toml --set model.vocab_size=128 --set data.val=" +
                (dir / "val.bin")),
            {name, "not a regular file"});
        fs::remove(path);
        fs::rename(path + ".keep", path);
    }
}

TEST_F(FaultTest, MetricsThatAreAFifoAreRefusedWithoutBlocking) {
    ASSERT_EQ(run(train("")).status, 0);
    const std::string path = dir / "run/metrics.jsonl";
    fs::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    expect_one_error(run("report " + (dir / "run")), {"metrics.jsonl", "not a regular file"});
}

// ---- 2. run outputs that can be destroyed ----

TEST_F(FaultTest, SecondRunIntoALockedDirectoryFailsAtOnceNamingTheHolder) {
    // Separate checkpoint directory: both it and the run directory are locked.
    auto first =
        start(long_train("--set checkpoint.every=1000 --set checkpoint.dir=" + (dir / "ck")));
    ASSERT_TRUE(wait_for_step(dir / "run/metrics.jsonl")) << first.get().output;
    const std::string metrics = read_file(dir / "run/metrics.jsonl");

    const auto t0             = Clock::now();
    const CommandResult again = run(train("--force"));  // --force does not override a live run
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), kEndsWithinS);
    expect_one_error(again, {dir / "run", "in use by another bagualu run", "pid "});
    const CommandResult other =
        run(train("--force --set checkpoint.every=1 --set checkpoint.dir=" + (dir / "ck"), "run2"));
    expect_one_error(other, {dir / "ck", "checkpoint directory", "in use", "pid "});

    // The first run still owns its files; stop it by the pid the error named.
    const std::string after = read_file(dir / "run/metrics.jsonl");
    EXPECT_EQ(after.substr(0, metrics.size()), metrics);
    const size_t at = again.output.find("pid ");
    const int pid   = std::atoi(again.output.c_str() + at + 4);
    ASSERT_GT(pid, 1) << again.output;
    EXPECT_EQ(::kill(pid, SIGTERM), 0) << "the named holder is not running: " << pid;
    first.get();
    // The lock went with its holder: the directory can be taken over now.
    EXPECT_EQ(run(train("--force")).status, 0);
}

TEST_F(FaultTest, ResumeWithoutACheckpointKeepsTheEarlierRun) {
    ASSERT_EQ(run(train("")).status, 0);
    const std::string metrics = read_file(dir / "run/metrics.jsonl");
    const std::string model   = read_file(dir / "run/model/model.safetensors");
    ASSERT_FALSE(model.empty());
    expect_one_error(run(train("--resume")), {dir / "run", "no checkpoint", "--force"});
    EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), metrics);
    EXPECT_EQ(read_file(dir / "run/model/model.safetensors"), model);
    EXPECT_EQ(run(train("--resume --force")).status, 0);  // --force says so
    // A fresh directory with --resume (checkpoint.resume = "auto") still trains from the start.
    EXPECT_EQ(run(train("--resume", "fresh")).status, 0);
}

TEST_F(FaultTest, PruningNeverFollowsALinkOutOfTheCheckpointDirectory) {
    // A complete-looking checkpoint outside, linked in under the oldest step name.
    fs::create_directories(dir / "outside/step_00000000");
    write_file(dir / "outside/step_00000000/manifest.json", "{}");
    write_file(dir / "outside/step_00000000/rank_00000.safetensors", "precious");
    fs::create_directories(dir / "run/checkpoints");
    fs::create_directory_symlink(dir / "outside/step_00000000",
                                 dir / "run/checkpoints/step_00000000");
    const CommandResult r =
        run(train("--set train.steps=3 --set checkpoint.every=1 --set checkpoint.keep=1"));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(read_file(dir / "outside/step_00000000/manifest.json"), "{}");
    EXPECT_EQ(read_file(dir / "outside/step_00000000/rank_00000.safetensors"), "precious");
    EXPECT_TRUE(fs::is_symlink(dir / "run/checkpoints/step_00000000"));
    EXPECT_TRUE(fs::exists(dir / "run/checkpoints/step_00000003/manifest.json"));
    EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step_00000002"));  // pruned, keep = 1
}

// ---- 3. writes that are never checked ----

TEST_F(FaultTest, FullDiskUnderMetricsEndsTheRunNamingTheFile) {
    fs::create_directories(dir / "run");
    fs::create_symlink("/dev/full", dir / "run/metrics.jsonl");  // every write: ENOSPC
    const CommandResult r = run(train("--force --set train.log_every=1"));
    expect_one_error(r, {"metrics.jsonl", "No space left on device"});
    EXPECT_FALSE(fs::exists(dir / "run/model")) << "training went on after metrics failed";
}

TEST_F(FaultTest, FullDiskUnderConfigEndsTheRunNamingTheFile) {
    fs::create_directories(dir / "run");
    fs::create_symlink("/dev/full", dir / "run/config.toml.tmp");
    expect_one_error(run(train("")), {"config.toml", "No space left on device"});
    EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl"));
}

// A real full disk: a 2 MiB tmpfs holds the first checkpoint of the tiny model (1.5 MB) but not
// the second. Needs mount (root); skipped where the sandbox has none.
TEST_F(FaultTest, FullDiskUnderCheckpointsEndsTheRunAndKeepsTheLastOne) {
    fs::create_directories(dir / "small");
    if (run_command("mount -t tmpfs -o size=2m tmpfs " + (dir / "small")).status != 0) {
        GTEST_SKIP() << "cannot mount a tmpfs here";
    }
    const CommandResult r  = run(train(
         "--set train.steps=4 --set checkpoint.every=1 --set checkpoint.dir=" + (dir / "small")));
    const std::string kept = read_file(dir / "small/step_00000001/manifest.json");
    run_command("umount " + (dir / "small"));
    expect_one_error(r, {"checkpoint of step 2", "No space left on device"});
    EXPECT_FALSE(kept.empty()) << "the checkpoint before the full disk is gone";
    EXPECT_FALSE(fs::exists(dir / "run/model")) << "training went on after the failed checkpoint";
}

TEST_F(FaultTest, UnwritableCheckpointDirectoryFailsAtStartUp) {
    // /proc/self/fdinfo exists but no file can be created in it, not even by root.
    expect_one_error(
        run(train(
            "--set train.steps=4 --set checkpoint.every=2 --set checkpoint.dir=/proc/self/fdinfo")),
        {"/proc/self/fdinfo", "not writable"});
    EXPECT_EQ(read_file(dir / "run/metrics.jsonl").find("\"loss\""), std::string::npos)
        << "the run trained before finding out";
}

// ---- 4. errors that escaped the one-line, exit-2 path ----

class CheckpointFaultTest : public FaultTest {
   protected:
    void SetUp() override {
        FaultTest::SetUp();
        const CommandResult r = run(train("--set checkpoint.every=2"));
        ASSERT_EQ(r.status, 0) << r.output;
        ckpt = dir / "run/checkpoints/step_00000002";
        ASSERT_TRUE(fs::exists(ckpt + "/manifest.json"));
    }
    void edit_manifest(const std::function<void(nlohmann::json&)>& edit) const {
        nlohmann::json j = nlohmann::json::parse(read_file(ckpt + "/manifest.json"));
        edit(j);
        write_file(ckpt + "/manifest.json", j.dump(1));
    }
    std::string ckpt;
};

TEST_F(CheckpointFaultTest, OddStepDirectoryNamesAreIgnored) {
    for (const char* name : {"step_abcdefgh", "step_99999999999999999999", "step_-0000001"}) {
        fs::create_directories(dir / ("run/checkpoints/" + std::string(name)));
        write_file(dir / ("run/checkpoints/" + std::string(name) + "/manifest.json"), "{}");
    }
    const CommandResult r = run(train("--resume --set train.steps=4"));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("step_00000002 (step 2)"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(dir / "run/checkpoints/step_abcdefgh/manifest.json"), "{}");
    EXPECT_EQ(run("inspect " + (dir / "run/checkpoints")).status, 0);
}

TEST_F(CheckpointFaultTest, ManifestThatIsNotARegularFile) {
    fs::rename(ckpt + "/manifest.json", ckpt + "/manifest.keep");
    ASSERT_EQ(::mkfifo((ckpt + "/manifest.json").c_str(), 0600), 0);
    expect_one_error(run("inspect " + ckpt), {"manifest.json", "not a regular file"});
    fs::remove(ckpt + "/manifest.json");
    fs::create_directory(ckpt + "/manifest.json");
    expect_one_error(run("inspect " + ckpt), {"manifest.json", "not a regular file"});
}

TEST_F(CheckpointFaultTest, MistypedStateIsOneLine) {
    const std::string metrics = read_file(dir / "run/metrics.jsonl");
    const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
        {[](nlohmann::json& j) { j["state"]["sampler"]["epoch"] = "zero"; }, "state.sampler.epoch"},
        {[](nlohmann::json& j) { j["state"]["sampler"]["position"] = -3; },
         "state.sampler.position = -3"},
        {[](nlohmann::json& j) { j["state"]["sampler"] = 7; }, "state.sampler.epoch is missing"},
        {[](nlohmann::json& j) { j["state"].erase("sampler"); }, "state.sampler is missing"},
        {[](nlohmann::json& j) {
             j["state"]["sampler"] = {{"blend", 3}};
         },
         "state.sampler.blend must be a non-empty array"},
        {[](nlohmann::json& j) {
             j["state"]["sampler"] = {{"blend", {{{"epoch", 0}}}}};
         },
         "state.sampler.blend[].data is missing"},
        {[](nlohmann::json& j) {
             j["state"]["sampler"] = {{"blend",
                                       {{{"data", "x"},
                                         {"epoch", 0},
                                         {"position", 0},
                                         {"windows", 4},
                                         {"deficit", "half"}}}}};
         },
         "state.sampler.blend[].deficit = \"half\" must be a number"},
        {[](nlohmann::json& j) { j["state"]["loss_scale"]["scale"] = nullptr; },
         "state.loss_scale.scale"},
        {[](nlohmann::json& j) { j["state"]["steps_skipped"] = 1.5; }, "state.steps_skipped"},
        {[](nlohmann::json& j) { j["state"]["steps_skipped"] = 3; },
         "state.steps_skipped = 3 exceeds the 2 steps"},
        {[](nlohmann::json& j) { j["config"] = "this is [[[ not toml"; }, "manifest.json (config)"},
    };
    const std::string original = read_file(ckpt + "/manifest.json");
    for (const auto& [edit, needle] : cases) {
        write_file(ckpt + "/manifest.json", original);
        edit_manifest(edit);
        expect_one_error(run(train("--resume --set train.steps=4")), {"manifest.json", needle});
        EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), metrics) << needle;
    }
}

// The checkpoint records how many windows data.train held. Resumed on other data (here the
// same shard twice), the old epoch's position means nothing in the new order: the run says so
// and starts the next epoch. A manifest without the count (an older one) resumes at its cursor.
TEST_F(CheckpointFaultTest, ResumeOnDataOfAnotherSizeStartsTheNextEpoch) {
    const nlohmann::json manifest = nlohmann::json::parse(read_file(ckpt + "/manifest.json"));
    const nlohmann::json& sampler = manifest["state"]["sampler"];
    ASSERT_TRUE(sampler.contains("windows")) << sampler.dump();
    const int64_t windows = sampler["windows"].get<int64_t>();
    EXPECT_GT(windows, 0);
    EXPECT_EQ(sampler["order"], "exact");
    fs::create_directories(dir / "twice");
    fs::copy_file(dir / "train.bin", dir / "twice/a.bin");
    fs::copy_file(dir / "train.bin", dir / "twice/b.bin");
    CommandResult r =
        run(train("--resume --set train.steps=3 --set data.train=" + (dir / "twice")));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("resume: data.train holds {} windows, the run of {} read "
                                        "{}: its order starts over them at epoch 1",
                                        2 * windows, ckpt, windows)),
              std::string::npos)
        << r.output;
    fs::remove_all(dir / "run/checkpoints/step_00000003");  // resume from step 2 again
    edit_manifest([](nlohmann::json& j) { j["state"]["sampler"].erase("windows"); });
    r = run(train("--resume --set train.steps=3 --set data.train=" + (dir / "twice")));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("(step 2)"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("its order starts over"), std::string::npos) << r.output;
}

// data.blend: a blend of one split trains bitwise as that split does as data.train (its order
// is the split's own); a blend's checkpoint records each split by name with its cursor and
// deficit; a resumed run may change the weights, keeps the splits it finds by name, starts a new
// one at epoch 0, and says so, as it does when it reads data.train after a blend.
TEST_F(CheckpointFaultTest, BlendsResumeTheirSplitsByName) {
    const auto losses = [&](const std::string& run) {
        std::vector<std::string> out;
        const std::string m = read_file(dir / (run + "/metrics.jsonl"));
        for (size_t at = m.find("\"loss\":"); at != std::string::npos;
             at        = m.find("\"loss\":", at + 1)) {
            out.push_back(m.substr(at, m.find_first_of(",}", at) - at));
        }
        return out;
    };
    const std::string one = fmt::format(
        " --set 'data.blend=[\"{}\"]' --set 'data.blend_weights=[1]'", dir / "train.bin");
    ASSERT_EQ(run(train("--set train.steps=3 --set train.log_every=1", "plain")).status, 0);
    CommandResult r = run(train("--set train.steps=3 --set train.log_every=1" + one, "one"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("data: blend 100.0% of the windows from"), std::string::npos)
        << r.output;
    EXPECT_EQ(losses("plain").size(), 3u);
    EXPECT_EQ(losses("one"), losses("plain"));

    fs::create_directories(dir / "twice");
    fs::copy_file(dir / "train.bin", dir / "twice/a.bin");
    fs::copy_file(dir / "train.bin", dir / "twice/b.bin");
    const std::string two =
        fmt::format(" --set 'data.blend=[\"{}\", \"{}\"]'", dir / "train.bin", dir / "twice");
    r = run(train("--set checkpoint.every=2" + two + " --set 'data.blend_weights=[1, 3]'", "mix"));
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string mix = dir / "mix/checkpoints/step_00000002";
    // passes over the data: one number a split
    const std::string metrics = read_file(dir / "mix/metrics.jsonl");
    EXPECT_NE(metrics.find("\"data_epochs\":["), std::string::npos) << metrics;
    EXPECT_NE(read_file(dir / "plain/metrics.jsonl").find("\"data_epochs\":0."), std::string::npos);
    const nlohmann::json sampler =
        nlohmann::json::parse(read_file(mix + "/manifest.json"))["state"]["sampler"];
    ASSERT_EQ(sampler["blend"].size(), 2u) << sampler.dump();
    EXPECT_EQ(sampler["blend"][1]["data"], dir / "twice");
    EXPECT_TRUE(sampler["blend"][1]["deficit"].is_number());
    EXPECT_EQ(sampler["blend"][0]["position"].get<int64_t>() +
                  sampler["blend"][1]["position"].get<int64_t>(),
              2 * 8)  // two steps of configs/tiny.toml's batch of 8
        << sampler.dump();
    // new weights: resumes where it was
    r = run(
        train("--resume --set train.steps=3" + two + " --set 'data.blend_weights=[1, 1]'", "mix"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output.find("starts at epoch 0"), std::string::npos) << r.output;
    fs::remove_all(dir / "mix/checkpoints/step_00000003");
    // a split the checkpoint does not have starts at epoch 0
    fs::copy_file(dir / "train.bin", dir / "other.bin");
    r = run(train(fmt::format("--resume --set train.steps=3 --set 'data.blend=[\"{}\", \"{}\"]' "
                              "--set 'data.blend_weights=[1, 1]'",
                              dir / "train.bin", dir / "other.bin"),
                  "mix"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("resume: data.blend[1] = \"{}\" is not in the blend of {}: "
                                        "it starts at epoch 0",
                                        dir / "other.bin", mix)),
              std::string::npos)
        << r.output;
    fs::remove_all(dir / "mix/checkpoints/step_00000003");
    r = run(train("--resume --set train.steps=3", "mix"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("read a blend of 2 splits, this one data.train: its order starts at "
                            "epoch 0"),
              std::string::npos)
        << r.output;
}

// Tensors of the same shapes can belong to another model (top_k, the head count, the gate):
// resuming compares the checkpoint's config, and keeps the run as it was.
TEST_F(CheckpointFaultTest, ResumeWithAnotherModelIsRefusedNamingTheKey) {
    const std::string metrics = read_file(dir / "run/metrics.jsonl");
    expect_one_error(run(train("--resume --set train.steps=4 --set model.top_k=1")),
                     {"step_00000002", "model.top_k = 1 here, 2 in the checkpoint"});
    expect_one_error(
        run(train("--resume --set train.steps=4 --set model.n_head=2 --set model.top_k=1")),
        {"model.n_head = 2 here, 4 in the checkpoint", "and 1 more key"});
    EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), metrics);
    EXPECT_TRUE(fs::exists(ckpt + "/manifest.json"));
    // the rows budget (memory, the same steps) and the initialisation's scale may change
    const CommandResult r =
        run(train("--resume --set train.steps=3 --set model.moe_rows_budget=0.6 --set "
                  "model.init_std=0.05"));
    EXPECT_EQ(r.status, 0) << r.output;
}

// The balancing and router loss settings are training settings, like train.lr: a resumed run
// may change them, and says so; the bias's rate only where both runs keep a bias (the
// checkpoint holds it and it routes), so turning it on or off is refused.
TEST_F(CheckpointFaultTest, BalancingSettingsMayChangeOnResume) {
    expect_one_error(run(train("--resume --set train.steps=4 --set model.balance_bias_rate=0.1")),
                     {"model.balance_bias_rate = 0.1 here, 0.0 in the checkpoint",
                      "cannot be turned on or off"});
    CommandResult r = run(train(
        "--resume --set train.steps=3 --set model.aux_loss_coef=0.02 --set model.jitter=0.01"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("resume: model.aux_loss_coef = 0.02 from here on, 0.01 in"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("resume: model.jitter = 0.01 from here on, 0.0 in"), std::string::npos)
        << r.output;

    const std::string bias = "--set checkpoint.every=2 --set model.balance_bias_rate=0.1";
    ASSERT_EQ(run(train(bias, "biased")).status, 0);
    r =
        run(train("--resume --set train.steps=3 --set model.balance_bias_rate=0.01 --set "
                  "model.balance_bias_update=proportional",
                  "biased"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("resume: model.balance_bias_rate = 0.01 from here on, 0.1"),
              std::string::npos)
        << r.output;
    expect_one_error(
        run(train("--resume --set train.steps=4 --set model.balance_bias_rate=0", "biased")),
        {"model.balance_bias_rate = 0.0 here, 0.1", "cannot be turned on or off"});
}

// A float32 run's checkpoint holds loss scale 1: an fp16 run resumed from it starts from its
// configured scale instead (a scale of 1 would let small fp16 gradients underflow).
TEST_F(CheckpointFaultTest, Fp16ResumedFromAnUnscaledRunStartsFromItsOwnScale) {
    const CommandResult r =
        run(train("--resume --set train.steps=3 --set precision.dtype=fp16 "
                  "--set precision.loss_scale=1024"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("written without loss scaling: the loss scale starts from 1024"),
              std::string::npos)
        << r.output;
    const std::string metrics = read_file(dir / "run/metrics.jsonl");
    EXPECT_NE(metrics.find("\"loss_scale\":1024"), std::string::npos) << metrics;
}

// inspect reads every tensor the config implies as a resume would: a manifest edited so that
// a slice names no tensor of its file, or a tensor has no slice, fails it though every file
// passes its hash.
TEST_F(CheckpointFaultTest, InspectFailsACheckpointWhoseTensorsDoNotRead) {
    const CommandResult ok = run("inspect " + ckpt);
    EXPECT_EQ(ok.status, 0) << ok.output;
    EXPECT_NE(ok.output.find("every tensor its config implies reads whole"), std::string::npos)
        << ok.output;
    const std::string original = read_file(ckpt + "/manifest.json");
    edit_manifest([](nlohmann::json& j) { j["files"][0]["slices"][0]["key"] = "param/none"; });
    CommandResult r = run("inspect " + ckpt);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("no tensor named \"param/none\""), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("1 tensor(s) FAIL to read"), std::string::npos) << r.output;
    write_file(ckpt + "/manifest.json", original);
    edit_manifest([](nlohmann::json& j) { j["files"][0]["slices"].erase(5); });
    r = run("inspect " + ckpt);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("no tensor adam_v/"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the manifest's config disagrees with its tensors"), std::string::npos)
        << r.output;
}

TEST_F(CheckpointFaultTest, ManifestMustAgreeWithWhereItSits) {
    fs::rename(ckpt, dir / "run/checkpoints/step_00000001");
    expect_one_error(run("inspect " + (dir / "run/checkpoints/step_00000001")),
                     {"step = 2", "named for step 1"});
    fs::rename(dir / "run/checkpoints/step_00000001", ckpt);
    edit_manifest([](nlohmann::json& j) { j["layout"]["ranks"] = 2; });
    expect_one_error(run("inspect " + ckpt), {"layout ranks = 2", "1 shard file"});
}

TEST_F(FaultTest, OutOfMemoryIsOneLine) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "a sanitizer reserves terabytes of shadow address space: no ulimit -v fits";
#endif
    // A model of several GiB under a 3 GB address-space limit: the allocation fails.
    const CommandResult r = run_command(fmt::format(
        "cd {} && ulimit -v 3000000 && timeout 60 {} {}", BGL_SOURCE_DIR, BGL_BINARY,
        train("--set model.d_model=4096 --set model.n_head=32 --set model.d_ff=16384")));
    expect_one_error(r, {"out of memory"});
}

}  // namespace
}  // namespace bagualu::testing

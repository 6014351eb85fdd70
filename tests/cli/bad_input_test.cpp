// Bad input of every kind gives one line naming the file, key or value and what is expected,
// and exit status 2: configs, command lines, token shards and vocabularies.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "../common/expect_error.h"
#include "../common/run_command.h"
#include "../common/token_shards.h"
#include "data/token_file.h"

namespace bagualu::testing {
namespace {

// A tiny valid setup: token shards written directly (no tokenizer) and a config pointing at them.
class BadInputTest : public ::testing::Test {
   protected:
    void SetUp() override {
        write_small_shards(dir);
        base = "train --config configs/tiny.toml --run-dir " + (dir / "run") +
               " --set model.vocab_size=128 --set data.train=" + (dir / "train.bin") +
               " --set data.val=" + (dir / "val.bin") +
               " --set data.tokenizer=" + (dir / "none.model") + " --set train.steps=2";
    }
    // Runs and checks: status 2, a single line of output, containing every `needle`.
    void expect_error(const std::string& args, std::initializer_list<std::string> needles) {
        expect_one_line_error(args, needles);
    }
    TempDir dir;
    std::string base;
};

TEST_F(BadInputTest, ValidSetupTrains) {
    const CommandResult r = bagualu(base);
    EXPECT_EQ(r.status, 0) << r.output;
}

TEST_F(BadInputTest, MissingConfigFile) {
    expect_error("train --config " + (dir / "nope.toml"), {"nope.toml"});
}

TEST_F(BadInputTest, MalformedToml) {
    write_file(dir / "bad.toml", "[model]\nd_model = = 3\n");
    expect_error("train --config " + (dir / "bad.toml"), {"bad.toml", "invalid TOML"});
}

TEST_F(BadInputTest, UnknownKeyInFile) {
    write_file(dir / "u.toml", "[model]\nd_modle = 64\n");
    expect_error("train --config " + (dir / "u.toml"),
                 {"u.toml", "unknown key model.d_modle (did you mean model.d_model?)"});
}

TEST_F(BadInputTest, UnknownSection) {
    write_file(dir / "s.toml", "[modle]\nd_model = 64\n");
    expect_error("train --config " + (dir / "s.toml"),
                 {"s.toml", "unknown section [modle] (did you mean [model]?)"});
}

TEST_F(BadInputTest, UnknownKeyInOverride) {
    expect_error(base + " --set train.stepz=3",
                 {"unknown key train.stepz (did you mean train.steps?)"});
    // a key of another section: that section's key; nothing near: the section's keys
    expect_error(
        base + " --set train.dtype=bf16",
        {"--set train.dtype=bf16", "unknown key train.dtype (did you mean precision.dtype?)"});
    expect_error(base + " --set parallel.ep=2",
                 {"unknown key parallel.ep ([parallel] has: ", "expert_parallel", "two_level"});
    // an unknown section from --set blames the item, not the file
    expect_error(
        base + " --set modle.d_model=64",
        {"with --set modle.d_model=64", "unknown section [modle] (did you mean [model]?)"});
}

TEST_F(BadInputTest, WrongType) {
    expect_error(base + " --set model.d_model=\\\"wide\\\"",
                 {"model.d_model", "expected an integer"});
    write_file(dir / "t.toml", "[train]\nlr = \"fast\"\n");
    expect_error("train --config " + (dir / "t.toml"), {"t.toml", "train.lr", "expected a number"});
}

TEST_F(BadInputTest, MalformedOverride) {
    expect_error(base + " --set steps", {"--set steps", "section.key=value"});
}

// A value that only a --set item made wrong is put on that item, not on the file (which holds
// another value of the key, or none); a key set twice is blamed on the item in effect (the last).
TEST_F(BadInputTest, ValuesFromSetAreBlamedOnTheSet) {
    // base's config file, copied: the messages name its path
    write_file(dir / "ok.toml", read_file(std::string(BGL_SOURCE_DIR) + "/configs/tiny.toml"));
    std::string cfg = base;
    cfg.replace(cfg.find("configs/tiny.toml"), std::string("configs/tiny.toml").size(),
                dir / "ok.toml");
    expect_error(cfg + " --set model.n_head=-3", {"ok.toml with --set model.n_head=-3: ", "> 0"});
    expect_error(cfg + " --set model.n_head=1 --set model.n_head=3",
                 {"ok.toml with --set model.n_head=3: ", "model.n_head = 3"});
    expect_error(cfg + " --set train.lr=fast", {"with --set train.lr=fast: train.lr"});
    // checked with the number of ranks, after the file was read
    expect_error(cfg + " --set train.threads=100000", {"with --set train.threads=100000: "});
    // a key of the file that no item set keeps the file alone
    std::string text = read_file(std::string(BGL_SOURCE_DIR) + "/configs/tiny.toml");
    text.replace(text.find("n_head        = 4"), 17, "n_head        = 3");
    write_file(dir / "bad.toml", text);
    cfg = base;
    cfg.replace(cfg.find("configs/tiny.toml"), std::string("configs/tiny.toml").size(),
                dir / "bad.toml");
    expect_error(cfg + " --set train.lr=0.01", {"bad.toml: model.d_model = 64"});
}

// Keys whose feature another key has off train as configured, with a warning naming each: a
// feature is turned off over a config by its switch alone (docs/results.md's commands do).
TEST_F(BadInputTest, SettingsWithNoEffectAreWarnedOf) {
    const CommandResult r =
        bagualu(base + " --set model.balance_bias_update=proportional --set model.route_groups=2" +
                " --set model.capacity_factor=2 --set model.swipe_balance=round" +
                " --set train.decay_steps=3 --set train.upcycle=true");
    EXPECT_EQ(r.status, 0) << r.output;
    for (const char* w :
         {"warning: configs/tiny.toml: model.balance_bias_update = \"proportional\" has no effect",
          "warning: configs/tiny.toml: model.route_groups = 2 has no effect",
          "warning: configs/tiny.toml: model.capacity_factor = 2 has no effect",
          "warning: configs/tiny.toml: model.swipe_balance = \"round\" has no effect",
          "warning: configs/tiny.toml: train.decay_steps = 3 has no effect: train.lr_schedule = "
          "\"cosine\"",
          "warning: configs/tiny.toml: train.upcycle = true has no effect: train.init_from is "
          "empty"}) {
        EXPECT_NE(r.output.find(w), std::string::npos) << w << "\n" << r.output;
    }
    // with their features on, none
    const CommandResult on =
        bagualu(base + " --force --set model.balance_bias_update=proportional" +
                " --set model.balance_bias_rate=0.01" +
                " --set model.route_groups=2 --set model.route_nodes=1 --set model.gate=gshard" +
                " --set model.capacity_factor=2 --set train.lr_schedule=wsd" +
                " --set train.decay_steps=3");
    EXPECT_EQ(on.status, 0) << on.output;
    EXPECT_EQ(on.output.find("warning"), std::string::npos) << on.output;
}

// A train or val shard holding an id >= model.vocab_size: rank 0 alone reads the ids at start-up,
// and every rank ends with its one line, whatever the readers (every rank reading, or one).
TEST_F(BadInputTest, BadTokenIdEndsEveryRankWithOneLine) {
    std::vector<int32_t> tokens(2000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 97);
    tokens[1500] = 1000;
    data::write_token_file(dir / "bad.bin", tokens, 65536);
    const std::string bad = base + " --set data.train=" + (dir / "bad.bin");
    expect_error(bad, {"bad.bin", "token 1000 at position 1500", "vocab_size 128"});
    const std::string bad_val = base + " --set data.val=" + (dir / "bad.bin");
    expect_error(bad_val, {"bad.bin", "token 1000 at position 1500", "vocab_size 128"});
    for (const std::string& args :
         {bad + " --set data.readers=0", bad + " --set data.readers=1", bad_val}) {
        const CommandResult two =
            run_command(std::string("cd ") + BGL_SOURCE_DIR + " && timeout 60 " + BGL_MPIEXEC +
                        " --allow-run-as-root --oversubscribe -np 2 " + BGL_BINARY + " " + args);
        EXPECT_EQ(two.status, 2) << two.output;
        size_t n = 0;
        for (size_t at = two.output.find("token 1000 at position 1500"); at != std::string::npos;
             at        = two.output.find("token 1000 at position 1500", at + 1))
            ++n;
        EXPECT_EQ(n, 1u) << args << ":\n" << two.output;
    }
    EXPECT_FALSE(std::filesystem::exists(dir / "run/metrics.jsonl"));
}

// A run whose planned memory per rank cannot fit in what this machine's ranks may allocate is
// refused before the model is built, naming the figures and the way out; the test hook stands for
// a small machine (or a tight cgroup limit). With train.check_memory = false, or room enough, it
// trains.
TEST_F(BadInputTest, RunThatCannotFitInMemoryIsRefusedAtStartUp) {
    struct Env {
        Env() { setenv("BAGUALU_FAULT_MEMORY_LEFT", "1000000", 1); }
        ~Env() { unsetenv("BAGUALU_FAULT_MEMORY_LEFT"); }
    } env;
    expect_error(
        base, {"configs/tiny.toml: the run needs about", "MiB per rank",
               "may allocate 0.95 MiB (BAGUALU_FAULT_MEMORY_LEFT)", "train.check_memory = false"});
    EXPECT_FALSE(std::filesystem::exists(dir / "run"));  // nothing written
    // under mpirun: every rank ends, with one message
    const CommandResult two =
        run_command(std::string("cd ") + BGL_SOURCE_DIR + " && timeout 60 " + BGL_MPIEXEC +
                    " --allow-run-as-root --oversubscribe " + "-np 2 " + BGL_BINARY + " " + base);
    EXPECT_EQ(two.status, 2) << two.output;
    size_t n = 0;
    for (size_t at = two.output.find("the run needs about"); at != std::string::npos;
         at        = two.output.find("the run needs about", at + 1))
        ++n;
    EXPECT_EQ(n, 1u) << two.output;
    EXPECT_NE(two.output.find("for the 2 rank(s) on this machine"), std::string::npos)
        << two.output;
    const CommandResult off = bagualu(base + " --set train.check_memory=false");
    EXPECT_EQ(off.status, 0) << off.output;
    setenv("BAGUALU_FAULT_MEMORY_LEFT", "100000000000", 1);
    const CommandResult room = bagualu(base + " --force");
    EXPECT_EQ(room.status, 0) << room.output;
}

// Checkpoints that cannot fit in the free space of their file system: a run whose one
// checkpoint cannot is refused at start-up naming the directory and both sizes (instead of
// failing at its first checkpoint); one whose kept checkpoints may not gets a warning and trains.
// The test hook stands for the free space.
TEST_F(BadInputTest, CheckpointsBeyondTheFreeDiskSpaceAreCaughtAtStartUp) {
    struct Env {
        Env() { setenv("BAGUALU_FAULT_DISK_FREE", "1000", 1); }
        ~Env() { unsetenv("BAGUALU_FAULT_DISK_FREE"); }
    } env;
    const std::string every = base + " --set checkpoint.every=1";
    const CommandResult r   = bagualu(every);
    expect_one_line_error(
        r, every,
        {"checkpoint.dir " + (dir / "run/checkpoints"), "one checkpoint of this run takes about",
         "has 0.00 MiB free", "checkpoint.every = 0"});
    EXPECT_FALSE(std::filesystem::exists(dir / "run"));
    // the size it names, in MiB: room for one and a half, not for the 2 of steps 1 and 2
    const std::string key = "takes about ";
    const size_t at       = r.output.find(key);
    ASSERT_NE(at, std::string::npos) << r.output;
    const double one_mib = std::stod(r.output.substr(at + key.size()));
    ASSERT_GT(one_mib, 0.0);
    setenv("BAGUALU_FAULT_DISK_FREE", std::to_string(uint64_t(1.5 * one_mib * 1048576)).c_str(), 1);
    const CommandResult warned = bagualu(every);
    EXPECT_EQ(warned.status, 0) << warned.output;
    EXPECT_NE(warned.output.find("warning: checkpoint.dir"), std::string::npos) << warned.output;
    EXPECT_NE(warned.output.find("2 checkpoint(s) of about"), std::string::npos) << warned.output;
    setenv("BAGUALU_FAULT_DISK_FREE", "100000000000", 1);
    const CommandResult room = bagualu(every + " --force");
    EXPECT_EQ(room.status, 0) << room.output;
    EXPECT_EQ(room.output.find("warning"), std::string::npos) << room.output;
    // the size named is what a checkpoint takes, less its manifest and headers (the message's
    // two decimals of MiB, and at most 64 KiB of those)
    double bytes = 0;
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(dir / "run/checkpoints/step_00000002")) {
        if (e.is_regular_file()) bytes += double(e.file_size());
    }
    EXPECT_NEAR(bytes, one_mib * 1048576, 0.005 * 1048576 + 65536);
}

TEST_F(BadInputTest, DModelNotDivisibleByHeads) {
    expect_error(base + " --set model.n_head=3", {"model.d_model = 64", "model.n_head = 3"});
}

TEST_F(BadInputTest, TopKAboveExperts) {
    expect_error(base + " --set model.top_k=5", {"model.top_k = 5", "model.n_experts = 4"});
}

TEST_F(BadInputTest, ZeroAndNegativeSizes) {
    expect_error(base + " --set model.d_model=0", {"model.d_model = 0", "> 0"});
    expect_error(base + " --set model.n_layer=-1", {"model.n_layer = -1", "> 0"});
    expect_error(base + " --set train.batch_size=0", {"train.batch_size = 0"});
    expect_error(base + " --set model.seq_len=-5", {"model.seq_len = -5"});
    expect_error(base + " --set model.expert_d_ff=-1", {"model.expert_d_ff = -1", ">= 0"});
    expect_error(base + " --set model.expert_d_ff=8388608",
                 {"model.expert_d_ff = 8388608", "must be <="});
}

TEST_F(BadInputTest, UnknownOptimizerPartition) {
    expect_error(base + " --set optimizer.partition=maybe",
                 {"optimizer.partition = \"maybe\"", "\"auto\", \"on\" or \"off\""});
    expect_error(base + " --set optimizer.partition=true",
                 {"optimizer.partition", "expected a string"});
}

TEST_F(BadInputTest, CheckpointSettings) {
    expect_error(base + " --set checkpoint.resume=yes",
                 {"checkpoint.resume = \"yes\"", "\"never\" or \"auto\""});
    expect_error(base + " --set checkpoint.every=-1", {"checkpoint.every = -1"});
    expect_error(base + " --set checkpoint.keep=-2", {"checkpoint.keep = -2"});
}

TEST_F(BadInputTest, BadCheckpointCommands) {
    expect_error("inspect " + (dir / "nowhere"), {"nowhere", "manifest.json"});
    expect_error("export --checkpoint " + (dir / "nowhere") + " --out " + (dir / "o"),
                 {"nowhere/manifest.json", "missing"});
    expect_error("export --out " + (dir / "o"), {"--from", "--checkpoint"});
}

TEST_F(BadInputTest, GateSettings) {
    expect_error(base + " --set model.gate=bogus",
                 {"model.gate = \"bogus\"", "topk, switch, gshard, noisy or swipe"});
    expect_error(base + " --set model.gate=switch", {"model.gate = \"switch\"", "model.top_k = 1"});
    expect_error(base + " --set model.gate=gshard --set model.top_k=1",
                 {"model.gate = \"gshard\"", "model.top_k = 2"});
    expect_error(base + " --set model.capacity_factor=0", {"model.capacity_factor = 0", "> 0"});
    expect_error(base + " --set model.balance_loss_scope=batch",
                 {"model.balance_loss_scope", "\"global\", \"micro_batch\" or \"sequence\""});
    expect_error(base + " --set model.gate=noisy --set model.balance_loss_scope=sequence",
                 {"model.balance_loss_scope = \"sequence\"", "noisy gate"});
    expect_error(base + " --set parallel.a2a_chunks=0", {"parallel.a2a_chunks = 0", ">= 1"});
    expect_error(base + " --set parallel.a2a_grid=-2", {"parallel.a2a_grid = -2", ">= 0"});
    expect_error(base + " --set model.product_keys=3",
                 {"model.product_keys = 3", "must divide model.n_experts"});
    expect_error(base + " --set model.product_keys=2 --set model.gate=noisy",
                 {"model.product_keys", "noise weight"});
    expect_error(base + " --set precision.router=fp16",
                 {"precision.router", "\"fp32\", \"fp64\" or \"half\""});
    expect_error(base + " --set model.jitter=1.5", {"model.jitter = 1.5", "[0, 1)"});
    expect_error(base + " --set model.moe_rows_budget=-1", {"model.moe_rows_budget = -1", ">= 0"});
    expect_error(base + " --set model.route_nodes=1",
                 {"model.route_groups = 0", "divisor of model.n_experts"});
    expect_error(base + " --set model.route_nodes=3 --set model.route_groups=2",
                 {"model.route_nodes = 3", "<= model.route_groups = 2"});
    expect_error(base + " --set model.route_nodes=1 --set model.route_groups=4 --set model.top_k=3",
                 {"model.top_k = 3", "1 group(s) of 1"});
    expect_error(
        base + " --set model.route_nodes=1 --set model.route_groups=2 --set model.gate=swipe",
        {"model.route_nodes", "model.gate = \"swipe\""});
    expect_error(base + " --set model.balance_bias_update=linear",
                 {"model.balance_bias_update = \"linear\"", "\"sign\" or \"proportional\""});
    expect_error(base + " --set parallel.node_dedup=maybe", {"parallel.node_dedup", "\"auto\""});
    expect_error(base + " --set model.route_override=diagonal",
                 {"model.route_override = \"diagonal\"", "one_expert"});
}

TEST_F(BadInputTest, PrecisionSettings) {
    expect_error(base + " --set precision.dtype=fp8",
                 {"precision.dtype = \"fp8\"", "\"fp32\", \"bf16\" or \"fp16\""});
    expect_error(base + " --set precision.ffn=O4",
                 {"precision.ffn = \"O4\"", "\"O0\", \"O1\", \"O2\" or \"O3\""});
    expect_error(base + " --set precision.loss_scale=0.5", {"precision.loss_scale = 0.5", ">= 1"});
    expect_error(base + " --set precision.loss_scale_backoff=1",
                 {"precision.loss_scale_backoff = 1", "(0, 1)"});
    expect_error(base + " --set precision.loss_scale_window=0",
                 {"precision.loss_scale_window = 0", "> 0"});
    expect_error(base + " --set precision.fp64_sensitive=1",
                 {"precision.fp64_sensitive", "expected a boolean"});
}

TEST_F(BadInputTest, MissingShard) {
    expect_error(base + " --set data.train=" + (dir / "missing.bin"), {"missing.bin"});
}

TEST_F(BadInputTest, TruncatedShard) {
    std::string bytes = read_file(dir / "train.bin");
    write_file(dir / "trunc.bin", bytes.substr(0, bytes.size() - 100));
    expect_error(base + " --set data.train=" + (dir / "trunc.bin"), {"trunc.bin", "truncated"});
}

TEST_F(BadInputTest, WrongMagic) {
    std::string bytes = read_file(dir / "train.bin");
    bytes[0]          = 'X';
    write_file(dir / "magic.bin", bytes);
    expect_error(base + " --set data.train=" + (dir / "magic.bin"), {"magic.bin", "magic"});
}

TEST_F(BadInputTest, TokenIdAboveVocab) {
    std::vector<int32_t> tokens(500, 3);
    tokens[321] = 200;
    data::write_token_file(dir / "big.bin", tokens, 256);
    expect_error(base + " --set data.val=" + (dir / "big.bin"), {"big.bin", "200", "321", "128"});
}

TEST_F(BadInputTest, ShardTooShortForOneWindow) {
    data::write_token_file(dir / "short.bin", std::vector<int32_t>(10, 1), 128);
    expect_error(base + " --set data.val=" + (dir / "short.bin"), {"short.bin", "seq_len"});
}

TEST_F(BadInputTest, ShardPatternsAndReaders) {
    expect_error(base + " --set data.train=" + (dir / "nope_*.bin"),
                 {"data.train", "nope_*.bin", "matches no file"});
    expect_error(base + " --set data.readers=2", {"data.readers = 2", "number of ranks 1"});
    expect_error(base + " --set data.readers=-1", {"data.readers = -1", ">= 0"});
}

// prepare's corpus: a JSON line without the field, a broken gzip, bad settings; one line each,
// and nothing written.
TEST_F(BadInputTest, PrepareCorpusErrors) {
    const std::string out = " --set data.train=" + (dir / "p/train.bin") +
                            " --set data.val=" + (dir / "p/val.bin") +
                            " --set data.tokenizer=" + (dir / "p/tok.model");
    auto prepare = [&](const std::string& corpus) {
        return "prepare --config configs/tiny.toml --set 'data.corpus=[\"" + corpus + "\"]'" + out;
    };
    write_file(dir / "a.jsonl", "{\"text\": \"one\"}\n{\"body\": \"two\", \"id\": 2}\n");
    expect_error(prepare(dir / "a.jsonl"),
                 {dir / "a.jsonl" + ":2", "no field \"text\"", "data.text_key", "body, id"});
    write_file(dir / "b.jsonl.gz", std::string("\x1f\x8b\x08\x00garbage", 12));
    expect_error(prepare(dir / "b.jsonl.gz"), {dir / "b.jsonl.gz", "not valid gzip"});
    write_file(dir / "c.txt", std::string("\xff\xfe", 2));
    expect_error(prepare(dir / "c.txt"), {dir / "c.txt", "not UTF-8 text", "*.jsonl"});
    expect_error(prepare(dir / "a.jsonl") + " --set data.text_key=", {"data.text_key", "empty"});
    expect_error(prepare(dir / "a.jsonl") + " --set data.tokenizer_entries=-3",
                 {"data.tokenizer_entries = -3", ">= 0"});
    expect_error(prepare(dir / "a.jsonl") + " --set data.shard_tokens=0",
                 {"data.shard_tokens = 0", "[1, 1000000000]"});
    expect_error(prepare(dir / "a.jsonl") + " --set 'data.train=" + (dir / "p/*.bin") + "'",
                 {"data.val", "matches the shard pattern data.train"});
    EXPECT_FALSE(std::filesystem::exists(dir / "p"));
}

TEST_F(BadInputTest, UnknownCommandLineOption) {
    expect_error("train --frobnicate", {"frobnicate"});
}

TEST_F(BadInputTest, RunDirectoryIsNotOverwritten) {
    ASSERT_EQ(bagualu(base).status, 0);
    const std::string before = read_file(dir / "run/metrics.jsonl");
    expect_error(base, {"already holds a run", "--force"});
    EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), before);
}

// 64-bit values are not narrowed: a batch of 2^32 + 4 sequences is refused, not trained as 4.
TEST_F(BadInputTest, IntegersBeyondInt32) {
    expect_error(base + " --set train.batch_size=4294967300",
                 {"train.batch_size = 4294967300", "must be <= 2147483647"});
    expect_error(base + " --set train.micro_batch_size=4294967300",
                 {"train.micro_batch_size = 4294967300"});
    expect_error(base + " --set model.d_model=4294967360", {"model.d_model", "out of range"});
    expect_error(base + " --set train.threads=100000000", {"train.threads = 100000000", "<= 4096"});
}

// Seeds take every uint64: 2^63 and up were refused in a config (and saturated on the command
// line); an integer TOML cannot hold says to quote it.
TEST_F(BadInputTest, SeedsTakeEveryUint64) {
    const CommandResult r = bagualu(
        base + " --set train.seed=18446744073709551615 --set sample.seed=9223372036854775808");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string toml = read_file(dir / "run/config.toml");
    EXPECT_NE(toml.find("seed = '18446744073709551615'"), std::string::npos) << toml;
    expect_error(base + " --set train.seed=-1",
                 {"train.seed: expected an integer from 0 to 18446744073709551615", "got -1"});
    expect_error(base + " --set sample.seed=18446744073709551616",
                 {"sample.seed: expected an integer", "got '18446744073709551616'"});
    write_file(dir / "seed.toml", "[train]\nseed = 18446744073709551615\n");
    expect_error("train --config " + (dir / "seed.toml"),
                 {"seed.toml:2:", "not representable in 64 bits", "written in quotes"});
}

// inf and nan are valid TOML floats; no key accepts them, and absurd values fail up front.
TEST_F(BadInputTest, NonFiniteAndAbsurdNumbers) {
    expect_error(base + " --set train.lr=inf", {"train.lr", "expected a finite number"});
    expect_error(base + " --set train.lr=nan", {"train.lr", "expected a finite number"});
    expect_error(base + " --set model.init_std=-inf", {"model.init_std", "finite"});
    expect_error(base + " --set train.lr=1e30", {"train.lr = 1e+30", "must be <= 10"});
    expect_error(base + " --set sample.temperature=1e300", {"sample.temperature"});
}

// Values that are each in range but cannot run as meant: no block an MoE layer while the MoE
// keys are set, more compute threads than CPUs (each waits by spinning), a batch larger than
// the data (it ran for ever), an empty run directory (it fell back to runs/<name> here).
TEST_F(BadInputTest, ValuesThatCannotRunAsMeant) {
    expect_error(base + " --set model.moe_every=3",
                 {"model.moe_every = 3 > model.n_layer = 2", "moe_every = 0"});
    expect_error(base + " --set train.threads=4096",
                 {"train.threads = 4096 exceeds the", "CPU(s) this process may run on"});
    expect_error(base + " --set train.batch_size=100000 --set train.micro_batch_size=1",
                 {"train.batch_size = 100000", "windows", "data.train"});
    expect_error("train --config configs/tiny.toml --run-dir ''", {"--run-dir", "empty path"});
    expect_error(base + " --set train.lr_schedule=wsd",
                 {"train.decay_steps = 0", "\"wsd\"", "\"constant\""});
    expect_error(base + " --set train.lr_schedule=step",
                 {"train.lr_schedule", "\"cosine\", \"linear\", \"constant\" or \"wsd\""});
}

// Numeric options say what they expect, NaN included (the option library printed its bounds as
// 300-digit numbers and let NaN through a range).
TEST_F(BadInputTest, NumericOptionsSayWhatTheyExpect) {
    expect_error("bench train --config configs/tiny.toml --steps 0",
                 {"--steps: expected a positive number, got 0"});
    expect_error(
        "bench train --config configs/tiny.toml --compare model.top_k=1 --compare "
        "model.top_k=2 --repeats -1",
        {"--repeats: expected a positive number, got -1"});
    const std::string plan =
        "plan --config configs/tiny.toml --machine machines/sunway-oceanlight.toml";
    expect_error(plan + " --overlap nan", {"--overlap: expected a fraction in [0, 1], got nan"});
    expect_error(plan + " --nodes 0", {"--nodes: expected a positive number, got 0"});
    expect_error(plan + " --sweep --nodes 64 --ranks-per-node 6",
                 {"plan --sweep: no valid layout of 384 ranks", "train.batch_size = 8"});
    // the most experts a config may have, all on one rank: refused at once (it ran for minutes)
    expect_error(plan + " --set model.n_experts=16777216",
                 {"puts 16777216 expert FFNs on each rank", "at most 262144"});
    // weights past what 64-bit counts hold (it printed wrapped, plausible parameter counts)
    expect_error(plan +
                     " --set model.d_model=1048576 --set model.n_head=1 --set model.n_layer=4096 "
                     "--set model.d_ff=4194304 --set model.moe_every=1 --set model.n_experts=1024",
                 {"3.69e+19 weights", "more than the 1e17"});
    expect_error("calibrate --seconds inf --out " + (dir / "m.toml"),
                 {"--seconds: expected a time in seconds, at most 600, got inf"});
}

// One micro-batch whose activations exceed the kernels' int32 indexing is refused before any
// allocation (here 2^25 sequences of 64 tokens: 2^31 tokens).
TEST_F(BadInputTest, MicroBatchTooLargeForTheModel) {
    expect_error(base + " --set train.batch_size=33554432 --set train.micro_batch_size=0",
                 {"train.micro_batch_size = 33554432", "too many", "lower train.micro_batch_size"});
}

// A crafted config.json cannot narrow a dimension or make the reader list more tensors than
// model.safetensors holds.
TEST_F(BadInputTest, CraftedModelConfigJson) {
    ASSERT_EQ(bagualu(base).status, 0);
    const std::string model = dir / "run/model";
    const std::string json  = read_file(model + "/config.json");
    auto with               = [&](const std::string& key, const std::string& value) {
        const size_t at  = json.find("\"" + key + "\"");
        const size_t end = json.find_first_of(",}", at);
        std::string j    = json.substr(0, json.find(':', at) + 1) + " " + value + json.substr(end);
        write_file(model + "/config.json", j);
    };
    // the model is the exported one: a --set model.* would be ignored
    expect_error("eval --model " + model + " --set model.d_model=128",
                 {"--set model.d_model=128", "config.json has model.d_model = 64"});
    with("d_model", "4294967360");
    expect_error("eval --model " + model, {"config.json", "d_model = 4294967360", "out of range"});
    with("n_experts", "16777216");
    expect_error("eval --model " + model, {"model.safetensors", "tensors", "config.json implies"});
    // what the config states of the model's fixed math must be what this code computes
    with("activation", "\"relu\"");
    expect_error("eval --model " + model, {"config.json", "activation = \"relu\"", "gelu_tanh"});
    with("format_version", "7");
    expect_error("eval --model " + model, {"config.json", "format_version = 7"});
    write_file(model + "/config.json", json);
    // a NaN in the weights (the file's last float) is a damaged model, not a loss of nan
    std::string st         = read_file(model + "/model.safetensors");
    const char nan_bits[4] = {0x00, 0x00, static_cast<char>(0xc0), 0x7f};
    st.replace(st.size() - 4, 4, nan_bits, 4);
    write_file(model + "/model.safetensors", st);
    expect_error("eval --model " + model, {"model.safetensors", "nan", "expected finite weights"});
}

}  // namespace
}  // namespace bagualu::testing

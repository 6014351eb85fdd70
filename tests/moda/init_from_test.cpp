// train.init_from: a run that starts from an exported model's weights. With train.lr = 0 the
// weights stay what they were, so the model it exports is the one it started from, bit for bit,
// on one process and on two ranks (experts split, ParO or not): every rank read its tensors and
// the half-stored ones' FP32 masters kept every bit. A run that resumes from a checkpoint reads
// the checkpoint, not the model. A dense model upcycled (train.upcycle) puts its MLPs into every
// expert and computes what it did. Another corpus prepared with the model's tokenizer (`prepare
// --tokenizer`) trains from it; with a tokenizer of its own it is refused. A model that does not
// fit the config, a checkpoint given for a model, a model inside the run directory that would
// replace it, another tokenizer and a non-finite weight are each one line and status 2, with the
// model left as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../common/expect_error.h"
#include "moda_runs.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

class InitFromTest : public TinyRunsSuite<> {
   protected:
    // mixed precision (bf16 masters) and the balancing bias: what a start from a model keeps
    static constexpr const char* kModel =
        " --set precision.dtype=bf16 --set model.balance_bias_rate=0.001";
    // A fresh run of `steps` steps into `run` (the tiny config on the prepared data).
    static std::string args(const std::string& run, int steps, const std::string& extra, int P = 1,
                            int ep = 1) {
        return fmt::format(
            "train --config configs/tiny.toml{} --run-dir {} --set train.steps={} "
            "--set train.log_every=1 --set train.eval_every=0 --set train.threads=1 "
            "--set sample.n_samples=0 --set train.micro_batch_size={} "
            "--set parallel.expert_parallel={} --force {}",
            runs_->data_args(), runs_->path(run), steps, 4 / P, ep, extra);
    }
    // The model every test starts from, trained once.
    static const std::string& base() {
        static const std::string dir = [] {
            const CommandResult r = bagualu(args("base", 12, kModel));
            EXPECT_EQ(r.status, 0) << r.output;
            return runs_->path("base");
        }();
        return dir;
    }
};

TEST_F(InitFromTest, AFrozenStartExportsTheModelItStartedFromOnEveryLayout) {
    // lr 0 leaves every weight as it starts; a bias rate of 1e-12 moves no bias of this size
    const std::string frozen = fmt::format(
        "{} --set train.init_from={} --set train.lr=0 --set train.min_lr=0 "
        "--set model.balance_bias_rate=1e-12",
        " --set precision.dtype=bf16", base());
    struct Layout {
        int P, ep;
        const char* partition;
    };
    for (const Layout l : {Layout{1, 1, "auto"}, Layout{2, 2, "on"}, Layout{2, 1, "off"}}) {
        const std::string run = fmt::format("frozen_p{}_ep{}_{}", l.P, l.ep, l.partition);
        const CommandResult r = TinyRuns::run(
            l.P, args(run, 2, frozen + " --set optimizer.partition=" + l.partition, l.P, l.ep));
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_NE(r.output.find("weights from " + base() + "/model"), std::string::npos)
            << r.output;
        SCOPED_TRACE(run);
        expect_same_model_bits(base() + "/model/model.safetensors",
                               runs_->path(run) + "/model/model.safetensors");
    }
}

TEST_F(InitFromTest, TrainingGoesOnFromTheModel) {
    const CommandResult fresh = bagualu(args("fresh", 2, kModel));
    ASSERT_EQ(fresh.status, 0) << fresh.output;
    const CommandResult go_on =
        bagualu(args("go_on", 2, std::string(kModel) + " --set train.init_from=" + base()));
    ASSERT_EQ(go_on.status, 0) << go_on.output;
    const StepLog a = read_steps(runs_->path("base/metrics.jsonl"));
    const StepLog f = read_steps(runs_->path("fresh/metrics.jsonl"));
    const StepLog g = read_steps(runs_->path("go_on/metrics.jsonl"));
    ASSERT_EQ(a.loss.size(), 12u);
    ASSERT_EQ(g.loss.size(), 2u);
    // the first step's loss is that of the trained model (within the batches' spread: another
    // batch than the base run's last), not that of a fresh one, which starts near ln(512) = 6.24
    EXPECT_LT(g.loss[0], a.loss.back() + 0.3);
    EXPECT_LT(g.loss[0], f.loss[0] - 0.5);
}

// Training further on another corpus: `prepare --tokenizer MODEL` encodes it with the model's
// tokenizer (a tokenizer of its own would give the ids other pieces), and the run starts.
TEST_F(InitFromTest, AnotherCorpusPreparedWithTheModelsTokenizer) {
    const std::string data = fmt::format(
        " --set 'data.corpus=[\"/usr/share/games/fortunes/science\"]' --set data.train={} "
        "--set data.val={} --set data.tokenizer={}",
        runs_->path("science/train.bin"), runs_->path("science/val.bin"),
        runs_->path("science/tok.model"));
    const CommandResult own = bagualu("prepare --config configs/tiny.toml" + data);
    ASSERT_EQ(own.status, 0) << own.output;
    const std::string on_science = fmt::format(
        "train --config configs/tiny.toml{} --run-dir {} --set train.steps=2 "
        "--set train.eval_every=0 --set sample.n_samples=0 --set train.init_from={}",
        data, runs_->path("on_science"), base());
    expect_one_line_error(on_science, {"tokenizer.model differs from data.tokenizer"});

    const CommandResult with =
        bagualu("prepare --config configs/tiny.toml" + data + " --tokenizer " + base());
    ASSERT_EQ(with.status, 0) << with.output;
    EXPECT_NE(with.output.find("encoding"), std::string::npos) << with.output;
    EXPECT_EQ(read_file(runs_->path("science/tok.model")),
              read_file(base() + "/model/tokenizer.model"));
    // up to date now, and not with the tokenizer of its own any more
    EXPECT_NE(bagualu("prepare --config configs/tiny.toml" + data + " --tokenizer " + base())
                  .output.find("up to date"),
              std::string::npos);
    const CommandResult r = bagualu(on_science);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("weights from"), std::string::npos) << r.output;
}

// Sparse upcycling: a dense model's MLPs go into every expert of the MoE blocks, whose top-k
// weights sum to 1, so the upcycled model computes what the dense one did (to float rounding
// of p1 y + p2 y against y: the val losses agree to 1e-4); the experts hold the MLP's bits on
// one process and with the experts split over two ranks, every other tensor the dense model's.
TEST_F(InitFromTest, UpcyclingADenseModelKeepsWhatItComputes) {
    const CommandResult dense = bagualu(args("dense", 12, " --set model.moe_every=0"));
    ASSERT_EQ(dense.status, 0) << dense.output;
    const std::string from = " --set train.init_from=" + runs_->path("dense") +
                             " --set train.lr=0 --set train.min_lr=0 --set train.upcycle=true";
    for (const auto& [P, run] : {std::pair{1, "up1"}, std::pair{2, "up2"}}) {
        const CommandResult r = TinyRuns::run(P, args(run, 1, from, P, P));
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_NE(r.output.find("upcycled: block(s) 1 from the dense MLP into each of 4 experts"),
                  std::string::npos)
            << r.output;
    }
    const io::SafetensorsFile d(runs_->path("dense/model/model.safetensors"));
    for (const char* run : {"up1", "up2"}) {
        SCOPED_TRACE(run);
        const io::SafetensorsFile u(runs_->path(run) + "/model/model.safetensors");
        int experts = 0;
        for (const std::string& name : u.names()) {
            std::string src = name;
            if (name.rfind("h.1.moe.experts.", 0) == 0) {
                src = "h.1.mlp" + name.substr(name.find('.', 16));
                ++experts;
            } else if (name.rfind("h.1.moe.", 0) == 0) {
                continue;  // the router: its initial weights
            }
            ASSERT_TRUE(d.contains(src)) << src;
            const auto x = d.bytes(src), y = u.bytes(name);
            ASSERT_EQ(x.size(), y.size()) << name;
            EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << name << " differs";
        }
        EXPECT_EQ(experts, 4 * 4);  // c_fc and c_proj, weight and bias, of 4 experts
    }
    const auto val_loss = [&](const std::string& run) {
        const CommandResult r = bagualu("eval --model " + runs_->path(run) + runs_->data_args());
        EXPECT_EQ(r.status, 0) << r.output;
        return std::stod(r.output.substr(r.output.find("val_loss ") + 9));
    };
    EXPECT_NEAR(val_loss("up1"), val_loss("dense"), 1e-4);

    // without train.upcycle the dense model does not fit, and the error says what would
    expect_one_line_error(
        args("e", 1, " --set train.init_from=" + runs_->path("dense")),
        {"no tensor h.1.moe.gate.weight", "model.moe_every = 2 here, 0 there", "train.upcycle"});
    // experts of another width than the MLP
    expect_one_line_error(args("e", 1,
                               " --set model.expert_d_ff=64 --set train.upcycle=true "
                               "--set train.init_from=" +
                                   runs_->path("dense")),
                          {"tensor h.1.mlp.c_fc.weight has shape [128, 64]",
                           "(its h.1.moe.experts.0.c_fc.weight) [64, 64]"});
    expect_one_line_error(args("e", 1,
                               " --set model.n_shared_experts=1 --set train.upcycle=true "
                               "--set train.init_from=" +
                                   runs_->path("dense")),
                          {"train.upcycle", "model.n_shared_experts = 1"});
}

TEST_F(InitFromTest, AResumedRunReadsItsCheckpointNotTheModel) {
    // a copy of the model, removed once the run has a checkpoint
    const std::string copy = runs_->path("base_copy");
    fs::create_directories(copy);
    fs::copy(base() + "/model", copy + "/model", fs::copy_options::recursive);
    const std::string a = args("resumed", 4,
                               std::string(kModel) +
                                   " --set checkpoint.every=2 "
                                   "--set train.init_from=" +
                                   copy);
    ASSERT_EQ(bagualu(a).status, 0);
    fs::remove_all(copy);
    const CommandResult r = bagualu(a + " --set train.steps=6 --resume");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output.find("weights from"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
}

TEST_F(InitFromTest, AModelThatDoesNotFitIsOneLineAndTouchesNothing) {
    const std::string model   = base() + "/model/model.safetensors";
    const std::string before  = read_file(model);
    const std::string from    = " --set train.init_from=" + base();
    const std::string ckpt    = runs_->path("with_ckpt");
    const CommandResult saved = bagualu(args("with_ckpt", 2, " --set checkpoint.every=2"));
    ASSERT_EQ(saved.status, 0) << saved.output;
    // another tokenizer beside an exported copy of the model
    const std::string other = runs_->path("other_tok");
    fs::create_directories(other);
    fs::copy(base() + "/model", other, fs::copy_options::recursive);
    std::ofstream(other + "/tokenizer.model", std::ios::binary | std::ios::trunc) << "another";
    // a NaN in the first element of wte
    const std::string nan = runs_->path("nan_weight");
    fs::create_directories(nan);
    fs::copy(base() + "/model", nan, fs::copy_options::recursive);
    {
        std::string bytes     = read_file(nan + "/model.safetensors");
        const auto header     = io::SafetensorsFile(nan + "/model.safetensors").info("wte");
        uint64_t header_bytes = 0;
        std::memcpy(&header_bytes, bytes.data(), 8);
        const size_t at = 8 + header_bytes + header.begin;
        if (header.dtype == io::DType::F32) {
            const uint32_t q = 0x7fc00000u;
            std::memcpy(bytes.data() + at, &q, 4);
        } else {
            const uint16_t q = 0x7fc0u;
            std::memcpy(bytes.data() + at, &q, 2);
        }
        std::ofstream(nan + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
    }

    expect_one_line_error(args("e", 2, from + " --set model.d_model=128"),
                          {"train.init_from", "tensor wte has shape [512, 64]", "[512, 128]",
                           "model.d_model = 128 here, 64 there"});
    expect_one_line_error(args("e", 2, from + " --set model.n_layer=4"),
                          {"train.init_from", "no tensor h.2.", "model.n_layer = 4 here, 2 there"});
    expect_one_line_error(args("e", 2, from + " --set model.n_layer=1 --set model.moe_every=1"),
                          {"train.init_from", "model.n_layer = 1 here, 2 there"});
    expect_one_line_error(
        args("e", 2, " --set train.init_from=" + ckpt + "/checkpoints/step_00000002"),
        {"train.init_from", "a checkpoint, not an exported model", "bagualu export --checkpoint"});
    expect_one_line_error(args("e", 2, " --set train.init_from=" + runs_->path("nowhere")),
                          {"train.init_from", "neither an exported model"});
    expect_one_line_error(args("base", 2, from),
                          {"train.init_from", "inside train.run_dir", "replaces"});
    expect_one_line_error(args("base/", 2, " --set train.init_from=" + base() + "/./model/"),
                          {"train.init_from", "inside train.run_dir", "replaces"});
    expect_one_line_error(args("e", 2, " --set train.init_from=" + other),
                          {"train.init_from", "tokenizer.model differs from data.tokenizer"});
    expect_one_line_error(args("e", 2, " --set train.init_from=" + nan),
                          {"train.init_from", "tensor wte holds nan at element 0"});
    expect_one_line_error(args("e", 2, " --set train.lr=-0.001"), {"train.lr", "must be >= 0"});
    EXPECT_EQ(read_file(model), before) << "the model started from was changed";
    EXPECT_TRUE(fs::exists(base() + "/metrics.jsonl"));
}

}  // namespace
}  // namespace bagualu::testing

// `bagualu sample` and the samples `bagualu train` prints at the end: a prompt that leaves no
// room in the model's context is a one-line error (exit 2) naming the prompt, its tokens and
// seq_len before anything is generated or trained; more new tokens than the context leaves are
// generated up to it, with one note saying so. The model is untrained (its initial weights),
// with a tokenizer trained here on a small corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../common/expect_error.h"
#include "../common/run_command.h"
#include "../unit/data/small_corpus.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/model_io.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 400, kSeqLen = 16;

class SampleTest : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir();
        data::train_tokenizer(data::testing::small_corpus(400), *dir_ / "tok", kVocab, 7);
        ModelConfig m;
        m.vocab_size = kVocab;
        m.d_model    = 32;
        m.n_layer    = 2;
        m.n_head     = 2;
        m.seq_len    = kSeqLen;
        m.d_ff       = 64;
        m.n_experts  = 4;
        m.top_k      = 2;
        m.moe_every  = 2;
        std::vector<float> params(model::make_layout(m).num_params());
        model::init_params(params.data(), model::make_layout(m), m, 1);
        model::save_model(*dir_ / "model", m, params.data(), false, *dir_ / "tok.model");
        // shards in the tokenizer's vocabulary, for `train`
        std::vector<int32_t> tokens(2000);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + i % 97);
        data::write_token_file(*dir_ / "train.bin", tokens, kVocab);
        data::write_token_file(*dir_ / "val.bin", tokens, kVocab);
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    // A prompt of n tokens: '@' is not in the corpus, each one is a byte piece of its own.
    static std::string prompt_of(int n) {
        const std::string p(static_cast<size_t>(n), '@');
        EXPECT_EQ(data::Tokenizer::load(*dir_ / "tok.model").encode(p).size(),
                  static_cast<size_t>(n));
        return p;
    }
    static std::string sample(const std::string& args) {
        return "sample --model " + (*dir_ / "model") + " " + args;
    }
    // `train` of the tiny config at seq_len 16 over the shards, with the tokenizer: it samples.
    static std::string train(const std::string& extra, const std::string& run) {
        return "train --config configs/tiny.toml --set model.vocab_size=400 --set model.seq_len=16"
               " --set data.train=" +
               (*dir_ / "train.bin") + " --set data.val=" + (*dir_ / "val.bin") +
               " --set data.tokenizer=" + (*dir_ / "tok.model") +
               " --set train.steps=2 --set train.threads=1 --run-dir " + (*dir_ / run) + " " +
               extra;
    }
    // Runs and checks: status 2, a single line of output, containing every `needle`.
    static void expect_error(const std::string& args, std::initializer_list<std::string> needles) {
        expect_one_line_error(args, needles);
    }
    static size_t count(const std::string& text, const std::string& what) {
        size_t n = 0;
        for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
            ++n;
        return n;
    }
    static TempDir* dir_;
};
TempDir* SampleTest::dir_ = nullptr;

// seq_len 16: the start token, 14 prompt tokens and one new token fit; 15 prompt tokens do not
// (they were cut to fit, silently).
TEST_F(SampleTest, PromptThatLeavesNoRoomIsRefused) {
    const CommandResult fits =
        bagualu(sample("-n 1 --max-new-tokens 1 --prompt " + prompt_of(kSeqLen - 2)));
    EXPECT_EQ(fits.status, 0) << fits.output;
    EXPECT_EQ(count(fits.output, "note:"), 0u) << fits.output;
    expect_error(sample("-n 2 --prompt hello --prompt " + prompt_of(kSeqLen - 1)),
                 {"--prompt: prompt 2 is 15 tokens", "needs 17",
                  "more than the model's seq_len = 16", "at most 14 prompt tokens fit"});
    expect_error(sample("-n 1 --prompt " + prompt_of(40)), {"prompt 1 is 40 tokens"});
}

// More new tokens than the context leaves: generated up to seq_len, with one note for all the
// samples (they were clipped silently).
TEST_F(SampleTest, MaxNewTokensBeyondTheContextIsNotedOnce) {
    const CommandResult r =
        bagualu(sample("-n 3 --prompt hello --prompt " + prompt_of(10) + " --max-new-tokens 100"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(count(r.output, "--- sample "), 3u) << r.output;
    EXPECT_EQ(count(r.output, "note: "), 1u) << r.output;
    EXPECT_NE(r.output.find("note: generation stops at the model's seq_len = 16 tokens: the "
                            "start token, prompt 2 (10 tokens) and 100 new tokens would need 111"),
              std::string::npos)
        << r.output;

    const CommandResult within = bagualu(sample("-n 1 --prompt hello --max-new-tokens 4"));
    ASSERT_EQ(within.status, 0) << within.output;
    EXPECT_EQ(count(within.output, "note:"), 0u) << within.output;
}

// The samples at the end of a run: a configured prompt that cannot fit is refused before the
// first step, and nothing of the run is written (it trained, then cut the prompt).
TEST_F(SampleTest, TrainRefusesATooLongConfiguredPromptBeforeTraining) {
    expect_error(train("--set 'sample.prompts=[\"hello\", \"" + prompt_of(20) + "\"]'", "set"),
                 {"--set sample.prompts: prompt 2 is 20 tokens", "seq_len = 16"});
    EXPECT_FALSE(fs::exists(*dir_ / "set"));
    // configs/tiny.toml ends in its [sample] section
    write_file(*dir_ / "long.toml", read_file(std::string(BGL_SOURCE_DIR) + "/configs/tiny.toml") +
                                        "prompts = [\"" + prompt_of(15) + "\"]\n");
    std::string in_file = train("", "file");
    in_file.replace(in_file.find("configs/tiny.toml"), 17, *dir_ / "long.toml");
    expect_error(in_file, {"long.toml: sample.prompts: prompt 1 is 15 tokens", "seq_len = 16"});
    EXPECT_FALSE(fs::exists(*dir_ / "file"));
    // unused by the samples (n_samples = 1 uses the first prompt): no matter
    const CommandResult ok = bagualu(train("--set sample.n_samples=1 --set 'sample.prompts=[\"" +
                                               prompt_of(3) + "\", \"" + prompt_of(20) + "\"]'",
                                           "ok"));
    EXPECT_EQ(ok.status, 0) << ok.output;
    EXPECT_EQ(count(ok.output, "--- sample "), 1u) << ok.output;
}

// --seed takes every uint64 (2^63 and up all became 2^63 - 1: the same samples) and refuses
// anything else with one line.
TEST_F(SampleTest, SeedTakesEveryUint64) {
    const auto with_seed = [&](const std::string& seed) {
        const CommandResult r = bagualu(sample("-n 2 --max-new-tokens 8 --seed " + seed));
        EXPECT_EQ(r.status, 0) << r.output;
        return r.output;
    };
    const std::string below = with_seed("9223372036854775807");
    EXPECT_NE(with_seed("9223372036854775808"), below);
    EXPECT_NE(with_seed("18446744073709551615"), with_seed("9223372036854775808"));
    EXPECT_EQ(with_seed("9223372036854775807"), below);  // a seed repeats its samples
    for (const std::string bad :
         {"-1", "18446744073709551616", "99999999999999999999999", "1e3", "0x10", "12abc"}) {
        expect_error(
            sample("--seed " + bad),
            {"--seed: expected a seed, an integer from 0 to 18446744073709551615, got " + bad});
    }
}

}  // namespace
}  // namespace bagualu::testing

// Tokenizer: training on a small mixed corpus, exact round trips (English, Chinese, newlines,
// spaces, unseen characters), determinism, and load/vocab errors.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include "small_corpus.h"
#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::TempDir;

constexpr int kVocab = 400;

class TokenizerTest : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir();
        train_tokenizer(testing::small_corpus(400), dir_->path("tok"), kVocab, 7);
        tok_ = new Tokenizer(Tokenizer::load(dir_->path("tok.model")));
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete dir_;
    }
    static TempDir* dir_;
    static Tokenizer* tok_;
};

TempDir* TokenizerTest::dir_   = nullptr;
Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, Ids) {
    EXPECT_EQ(tok_->vocab_size(), kVocab);
    EXPECT_EQ(tok_->bos_id(), 1);
    EXPECT_EQ(tok_->eos_id(), 2);
}

TEST_F(TokenizerTest, RoundTrips) {
    const std::vector<std::string> texts = {
        "the quick brown fox jumps over the lazy dog.",
        "  leading spaces and   inner runs    and trailing   ",
        "line one\nline two\n\n\nafter blank lines\n",
        "\n",
        "\t tab\tseparated\t",
        "春眠不觉晓，处处闻啼鸟。",
        "unseen: 醉翁之意不在酒 Ωμέγα café ☃ 🎉",
        "   /\\_/\\\n  ( o.o )\n   > ^ <\n",
        "digits 1234567890 and 3.14159",
        "bell\a and back\bspace",
        "",
    };
    for (const std::string& t : texts) {
        const std::vector<int32_t> ids = tok_->encode(t);
        EXPECT_EQ(tok_->decode(ids), t) << t;
        for (int32_t id : ids) EXPECT_NE(id, 0) << "unk in encoding of '" << t << "'";
    }
}

TEST_F(TokenizerTest, CorpusRoundTrips) {
    for (const std::string& e : testing::small_corpus(400))
        EXPECT_EQ(tok_->decode(tok_->encode(e)), e);
}

TEST_F(TokenizerTest, LearnsMerges) {
    // Frequent words compress well below one token per byte.
    const std::string text = "the quick brown fox jumps over the lazy dog.";
    EXPECT_LT(tok_->encode(text).size(), text.size() * 2 / 3);
}

TEST_F(TokenizerTest, EosDecodesToNothing) {
    std::vector<int32_t> ids = tok_->encode("a");
    ids.push_back(tok_->eos_id());
    EXPECT_EQ(tok_->decode(ids), "a");
}

TEST_F(TokenizerTest, DecodeRejectsIdsOutsideVocab) {
    const std::vector<int32_t> ids = {5, kVocab};
    expect_input_error([&] { (void)tok_->decode(ids); }, {"tok.model", "token 400 at position 1"});
}

TEST_F(TokenizerTest, TrainingIsDeterministic) {
    // Same bytes regardless of the output path.
    train_tokenizer(testing::small_corpus(400), dir_->path("again"), kVocab, 7);
    EXPECT_TRUE(testing::read_all(dir_->path("again.model")) ==
                testing::read_all(dir_->path("tok.model")));
}

TEST(Tokenizer, VocabTooSmall) {
    TempDir dir;
    expect_input_error([&] { train_tokenizer({"abc"}, dir.path("t"), 300, 1); },
                       {"vocab_size 300", "byte"});
}

TEST(Tokenizer, VocabTooSmallForCorpusCharacters) {
    TempDir dir;
    std::vector<std::string> entries;
    // 200 distinct CJK characters need 200 pieces on top of the 259 byte and special pieces.
    for (char32_t c = 0x4E00; c < 0x4E00 + 200; ++c) {
        entries.push_back({static_cast<char>(0xE0 | (c >> 12)),
                           static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
                           static_cast<char>(0x80 | (c & 0x3F))});
    }
    expect_input_error([&] { train_tokenizer(entries, dir.path("t"), 400, 1); },
                       {"vocab_size 400", "Vocabulary size is smaller than required_chars"});
}

TEST(Tokenizer, LoadMissing) {
    TempDir dir;
    const std::string path = dir.path("none.model");
    expect_input_error([&] { Tokenizer::load(path); }, {path});
}

TEST(Tokenizer, LoadGarbage) {
    TempDir dir;
    const std::string path = dir.write("bad.model", "this is not a protobuf");
    expect_input_error([&] { Tokenizer::load(path); }, {path, "not a valid sentencepiece model"});
}

}  // namespace
}  // namespace bagualu::data

// prepare_corpus on a small temporary corpus: shards decode back to the entries, the split is
// hash-based and stable (also under file reordering and in JSON Lines), the threads' encoding
// keeps that order, meta.json matches and tells when the inputs changed, and bad options fail.
#include "data/prepare.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/token_file.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "small_corpus.h"
#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::read_all;
using testing::TempDir;

// Writes the small corpus as two fortune files and returns options pointing into `dir/out`.
PrepareOptions make_corpus(const TempDir& dir, const std::vector<std::string>& entries) {
    std::string first, second;
    for (size_t i = 0; i < entries.size(); ++i) (i % 2 ? second : first) += entries[i] + "\n%\n";
    PrepareOptions opts;
    opts.corpus         = {dir.write("corpus/one", first), dir.write("corpus/two", second)};
    opts.train_path     = dir.path("out/train.bin");
    opts.val_path       = dir.path("out/val.bin");
    opts.tokenizer_path = dir.path("out/tok/tokenizer.spm");
    opts.vocab_size     = 400;
    opts.val_fraction   = 0.1;
    opts.seed           = 99;
    return opts;
}

// Splits a shard at eos and decodes each document.
std::vector<std::string> decode_documents(const Tokenizer& tok,
                                          const std::vector<int32_t>& tokens) {
    std::vector<std::string> docs;
    std::vector<int32_t> doc;
    for (int32_t t : tokens) {
        if (t == tok.eos_id()) {
            docs.push_back(tok.decode(doc));
            doc.clear();
        } else {
            doc.push_back(t);
        }
    }
    EXPECT_TRUE(doc.empty()) << "shard does not end with eos";
    return docs;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
}

TEST(Prepare, ShardsReproduceEntries) {
    TempDir dir;
    const std::vector<std::string> entries = testing::small_corpus(300);
    const PrepareOptions opts              = make_corpus(dir, entries);
    const PrepareResult r                  = prepare_corpus(opts);

    EXPECT_EQ(r.n_entries, 300);
    EXPECT_EQ(r.n_train_entries + r.n_val_entries, 300);
    EXPECT_GT(r.n_val_entries, 10);
    EXPECT_LT(r.n_val_entries, 60);

    const Tokenizer tok = Tokenizer::load(opts.tokenizer_path);
    EXPECT_EQ(tok.vocab_size(), 400);
    const TokenFile train = read_token_file(opts.train_path, tok.vocab_size());
    const TokenFile val   = read_token_file(opts.val_path, tok.vocab_size());
    EXPECT_EQ(train.version, 1);
    EXPECT_EQ(static_cast<int64_t>(train.tokens.size()), r.train_tokens);
    EXPECT_EQ(static_cast<int64_t>(val.tokens.size()), r.val_tokens);

    const std::vector<std::string> train_docs = decode_documents(tok, train.tokens);
    const std::vector<std::string> val_docs   = decode_documents(tok, val.tokens);
    EXPECT_EQ(static_cast<int64_t>(val_docs.size()), r.n_val_entries);
    for (const std::string& d : val_docs)
        EXPECT_TRUE(is_val_entry(d, opts.val_fraction, opts.seed));
    for (const std::string& d : train_docs)
        EXPECT_FALSE(is_val_entry(d, opts.val_fraction, opts.seed));
    std::vector<std::string> all = train_docs;
    all.insert(all.end(), val_docs.begin(), val_docs.end());
    EXPECT_EQ(sorted(all), sorted(entries));

    // Only the requested files are left behind.
    EXPECT_TRUE(std::filesystem::is_regular_file(opts.tokenizer_path));
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path("out"))) {
        names.push_back(std::filesystem::relative(e.path(), dir.path("out")).string());
    }
    EXPECT_EQ(sorted(names), (std::vector<std::string>{"meta.json", "tok", "tok/tokenizer.spm",
                                                       "train.bin", "val.bin"}));
}

TEST(Prepare, MetaJson) {
    TempDir dir;
    const PrepareOptions opts = make_corpus(dir, testing::small_corpus(200));
    const PrepareResult r     = prepare_corpus(opts);

    const auto meta = nlohmann::json::parse(read_all(dir.path("out/meta.json")));
    EXPECT_EQ(meta["vocab_size"], 400);
    EXPECT_EQ(meta["n_entries"], r.n_entries);
    EXPECT_EQ(meta["train_tokens"], r.train_tokens);
    EXPECT_EQ(meta["val_tokens"], r.val_tokens);
    EXPECT_EQ(meta["tokenizer"], opts.tokenizer_path);
    EXPECT_EQ(meta["train"], opts.train_path);
    EXPECT_EQ(meta["val"], opts.val_path);
    EXPECT_EQ(meta["corpus"], opts.corpus);

    const TokenFile val  = read_token_file(opts.val_path, 400);
    const double entropy = unigram_entropy(val.tokens);
    EXPECT_GT(entropy, 1.0);
    EXPECT_EQ(r.val_unigram_entropy, entropy);
    EXPECT_EQ(meta["val_unigram_entropy"].get<double>(), entropy);
    EXPECT_EQ(read_val_unigram_entropy(opts.val_path), entropy);
}

TEST(Prepare, StableAcrossRunsAndFileOrder) {
    TempDir dir;
    PrepareOptions opts       = make_corpus(dir, testing::small_corpus(200));
    const PrepareResult a     = prepare_corpus(opts);
    const std::string train_a = read_all(opts.train_path);
    const std::string val_a   = read_all(opts.val_path);
    const std::string tok_a   = read_all(opts.tokenizer_path);

    std::reverse(opts.corpus.begin(), opts.corpus.end());
    const PrepareResult b = prepare_corpus(opts);
    EXPECT_EQ(a.n_val_entries, b.n_val_entries);
    EXPECT_TRUE(read_all(opts.train_path) == train_a);
    EXPECT_TRUE(read_all(opts.val_path) == val_a);
    EXPECT_TRUE(read_all(opts.tokenizer_path) == tok_a);
}

// The same entries as JSON Lines (gzipped, one file) give the bytes the fortune files give.
TEST(Prepare, JsonLinesGiveTheBytesOfTheSameEntriesAsText) {
    TempDir dir;
    const std::vector<std::string> entries = testing::small_corpus(200);
    PrepareOptions opts                    = make_corpus(dir, entries);
    prepare_corpus(opts);
    const std::string train = read_all(opts.train_path), val = read_all(opts.val_path);
    const std::string tok = read_all(opts.tokenizer_path);

    std::string jsonl;
    for (const std::string& e : entries) jsonl += nlohmann::json{{"body", e}}.dump() + "\n";
    opts.corpus           = {dir.write("json/all.jsonl", jsonl)};
    opts.text_key         = "body";
    const PrepareResult r = prepare_corpus(opts);
    EXPECT_EQ(r.n_entries, 200);
    EXPECT_TRUE(read_all(opts.train_path) == train);
    EXPECT_TRUE(read_all(opts.val_path) == val);
    EXPECT_TRUE(read_all(opts.tokenizer_path) == tok);
    EXPECT_EQ(nlohmann::json::parse(read_all(dir.path("out/meta.json")))["text_key"], "body");
}

// Each thread encodes a range of entries; joined, the documents stay in hash order and each is
// its own encoding.
TEST(Prepare, EncodingOnThreadsKeepsTheOrder) {
    if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: nothing to split";
    TempDir dir;
    const PrepareOptions opts = make_corpus(dir, testing::small_corpus(1500));
    const PrepareResult r     = prepare_corpus(opts);
    ASSERT_GT(r.n_train_entries, 512);  // at least two threads' ranges
    const Tokenizer tok                 = Tokenizer::load(opts.tokenizer_path);
    const std::vector<int32_t> tokens   = read_token_file(opts.train_path, 400).tokens;
    const std::vector<std::string> docs = decode_documents(tok, tokens);
    std::vector<int32_t> again;
    uint64_t last_hash = 0;
    for (const std::string& d : docs) {
        const uint64_t h = XXH64(d.data(), d.size(), opts.seed);
        ASSERT_GE(h, last_hash) << "documents out of hash order";
        last_hash                      = h;
        const std::vector<int32_t> ids = tok.encode(d);
        again.insert(again.end(), ids.begin(), ids.end());
        again.push_back(tok.eos_id());
    }
    EXPECT_TRUE(again == tokens);
}

// tokenizer_entries trains the tokenizer on the first train entries in hash order; as many as
// there are is the same as all.
TEST(Prepare, TokenizerOnASample) {
    TempDir dir;
    PrepareOptions opts    = make_corpus(dir, testing::small_corpus(300));
    const PrepareResult r  = prepare_corpus(opts);
    const std::string all  = read_all(opts.tokenizer_path);
    opts.tokenizer_entries = r.n_train_entries;
    prepare_corpus(opts);
    EXPECT_TRUE(read_all(opts.tokenizer_path) == all);
    opts.tokenizer_entries = 60;
    prepare_corpus(opts);
    EXPECT_FALSE(read_all(opts.tokenizer_path) == all);
    EXPECT_EQ(nlohmann::json::parse(read_all(dir.path("out/meta.json")))["tokenizer_entries"], 60);
    // the sample's tokenizer still encodes every entry exactly (byte fallback)
    const Tokenizer tok = Tokenizer::load(opts.tokenizer_path);
    EXPECT_EQ(decode_documents(tok, read_token_file(opts.train_path, 400).tokens).size(),
              static_cast<size_t>(r.n_train_entries));
    opts.tokenizer_entries = -1;
    expect_input_error([&] { prepare_corpus(opts); }, {"tokenizer_entries = -1"});
}

// meta.json records the corpus files; a changed, added or removed file, or another setting,
// makes the outputs out of date.
TEST(Prepare, OutputsUpToDateUntilTheInputsChange) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, testing::small_corpus(100));
    opts.corpus         = {dir.path("corpus")};  // the folder holding both files
    EXPECT_FALSE(outputs_up_to_date(opts));
    prepare_corpus(opts);
    EXPECT_TRUE(outputs_up_to_date(opts));

    PrepareOptions other = opts;
    other.text_key       = "content";
    EXPECT_FALSE(outputs_up_to_date(other));
    other                   = opts;
    other.tokenizer_entries = 10;
    EXPECT_FALSE(outputs_up_to_date(other));
    other      = opts;
    other.seed = 1;
    EXPECT_FALSE(outputs_up_to_date(other));

    dir.write("corpus/three", "a new entry\n");
    EXPECT_FALSE(outputs_up_to_date(opts));
    prepare_corpus(opts);
    EXPECT_TRUE(outputs_up_to_date(opts));

    // the same size, another time
    const std::string one = dir.path("corpus/one");
    const auto t          = std::filesystem::last_write_time(one);
    std::string text      = read_all(one);
    text[0]               = text[0] == 'x' ? 'y' : 'x';
    dir.write("corpus/one", text);
    std::filesystem::last_write_time(one, t + std::chrono::seconds(2));
    EXPECT_FALSE(outputs_up_to_date(opts));
    prepare_corpus(opts);
    EXPECT_TRUE(outputs_up_to_date(opts));

    std::filesystem::remove(dir.path("corpus/three"));
    EXPECT_FALSE(outputs_up_to_date(opts));
    prepare_corpus(opts);
    std::filesystem::remove(opts.val_path);
    EXPECT_FALSE(outputs_up_to_date(opts));

    // a write that fails once train.bin is new (val.bin cannot be renamed over a folder) leaves
    // no meta.json, so the outputs are not taken as up to date
    prepare_corpus(opts);
    std::filesystem::remove(opts.val_path);
    dir.write("out/val.bin/in_the_way", "x");
    expect_input_error([&] { prepare_corpus(opts); }, {opts.val_path});
    EXPECT_FALSE(std::filesystem::exists(dir.path("out/meta.json")));
    std::filesystem::remove_all(opts.val_path);
    dir.write("out/val.bin", "old");
    EXPECT_FALSE(outputs_up_to_date(opts));
}

// A split named by a pattern is written as shards cut after documents, which hold the tokens
// one file would; a second prepare with fewer shards removes the pattern's others.
TEST(Prepare, ShardPatternsWriteTheSplitInShards) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, testing::small_corpus(300));
    prepare_corpus(opts);
    const std::vector<int32_t> one = read_token_file(opts.train_path, 400).tokens;
    const int eos                  = Tokenizer::load(opts.tokenizer_path).eos_id();

    opts.train_path       = dir.path("out/shards/train_*.bin");
    opts.val_path         = dir.path("out/shards/val_*.bin");
    opts.shard_tokens     = 2000;
    const PrepareResult r = prepare_corpus(opts);
    const auto n          = static_cast<int64_t>((one.size() + 1999) / 2000);
    ASSERT_EQ(static_cast<int64_t>(r.train_files.size()), n);
    ASSERT_GE(n, 3);
    EXPECT_EQ(r.train_files, shard_paths(opts.train_path, n));
    EXPECT_EQ(r.train_files[1], dir.path("out/shards/train_000001.bin"));
    std::vector<int32_t> joined;
    for (const std::string& f : r.train_files) {
        const std::vector<int32_t> t = read_token_file(f, 400).tokens;
        ASSERT_FALSE(t.empty());
        EXPECT_EQ(t.back(), eos) << f << " is not cut after a document";
        // cut at the first document end past each k/n of the tokens
        EXPECT_GE(static_cast<int64_t>(t.size()), static_cast<int64_t>(one.size()) / n - 200);
        joined.insert(joined.end(), t.begin(), t.end());
    }
    EXPECT_TRUE(joined == one);
    EXPECT_EQ(r.val_files.size(), 1u);
    // the loader takes the pattern as data.train
    const TokenShards shards = TokenShards::open(opts.train_path, "data.train", 400, 16);
    EXPECT_EQ(shards.num_shards(), static_cast<size_t>(n));
    EXPECT_EQ(shards.num_tokens(), static_cast<int64_t>(one.size()));
    EXPECT_TRUE(outputs_up_to_date(opts));
    const auto meta = nlohmann::json::parse(read_all(dir.path("out/shards/meta.json")));
    EXPECT_EQ(meta["train_files"], r.train_files);

    // a stray file matching the pattern: out of date, and removed by the next prepare
    dir.write("out/shards/train_999999.bin", "stray");
    EXPECT_FALSE(outputs_up_to_date(opts));
    opts.shard_tokens         = 1'000'000;
    const PrepareResult fewer = prepare_corpus(opts);
    EXPECT_EQ(fewer.train_files, shard_paths(opts.train_path, 1));
    EXPECT_TRUE(read_token_file(fewer.train_files[0], 400).tokens == one);
    for (const char* gone : {"train_000001.bin", "train_999999.bin"}) {
        EXPECT_FALSE(std::filesystem::exists(dir.path(std::string("out/shards/") + gone))) << gone;
    }
    EXPECT_TRUE(outputs_up_to_date(opts));
}

TEST(Prepare, ShardPatternsThatCouldTakeOtherFilesAreRefused) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, testing::small_corpus(20));
    PrepareOptions bad  = opts;
    bad.train_path      = dir.path("out/*_*.bin");
    expect_input_error([&] { prepare_corpus(bad); }, {"data.train", "one `*`"});
    bad.train_path = dir.path("out/*/train.bin");
    expect_input_error([&] { prepare_corpus(bad); }, {"data.train", "file name"});
    bad.train_path = dir.path("out/*.bin");  // val.bin would be one of its shards
    expect_input_error([&] { prepare_corpus(bad); },
                       {"data.val", "matches the shard pattern data.train"});
    bad          = opts;
    bad.val_path = dir.path("corpus/*");  // the corpus files would be removed
    expect_input_error([&] { prepare_corpus(bad); }, {"data.val", "corpus input"});
    bad              = opts;
    bad.shard_tokens = 0;
    expect_input_error([&] { prepare_corpus(bad); }, {"shard_tokens = 0"});
    EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

// The encoded splits are written a bucket of hash ranges at a time: any number of buckets gives
// the same bytes, and the scratch files are gone afterwards, also after an error.
TEST(Prepare, BucketsDoNotChangeTheBytesAndLeaveNothingBehind) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, testing::small_corpus(400));
    opts.corpus         = {dir.path("corpus")};  // the folder holding both files
    prepare_corpus(opts);
    const std::string train = read_all(opts.train_path), val = read_all(opts.val_path);
    const double entropy = *read_val_unigram_entropy(opts.val_path);
    for (int64_t bucket_bytes : {int64_t{1}, int64_t{2000}}) {  // 256 and a few buckets
        opts.bucket_bytes = bucket_bytes;
        prepare_corpus(opts);
        EXPECT_TRUE(read_all(opts.train_path) == train) << bucket_bytes;
        EXPECT_TRUE(read_all(opts.val_path) == val) << bucket_bytes;
        EXPECT_EQ(*read_val_unigram_entropy(opts.val_path), entropy);
    }
    // with a given tokenizer the corpus is read once; the same bytes again
    PrepareOptions given = opts;
    given.tokenizer_from = dir.path("tok_copy.model");
    std::filesystem::copy_file(opts.tokenizer_path, given.tokenizer_from);
    prepare_corpus(given);
    EXPECT_TRUE(read_all(opts.train_path) == train);
    auto leftovers = [&] {
        std::vector<std::string> names;
        for (const auto& e : std::filesystem::directory_iterator(dir.path("out"))) {
            names.push_back(e.path().filename().string());
        }
        std::sort(names.begin(), names.end());
        return names;
    };
    const std::vector<std::string> outputs = {"meta.json", "tok", "train.bin", "val.bin"};
    EXPECT_EQ(leftovers(), outputs);
    // a killed prepare's scratch is removed by the next one; a running one's is left alone
    const pid_t dead = fork();
    if (dead == 0) _exit(0);
    ASSERT_GT(dead, 0);
    waitpid(dead, nullptr, 0);
    dir.write("out/.prepare-" + std::to_string(dead) + "-train/0000.tokens", "abandoned");
    dir.write("out/.prepare-1-train/0000.tokens", "init's, still running");
    prepare_corpus(given);
    std::vector<std::string> with_init = outputs;
    with_init.insert(with_init.begin(), ".prepare-1-train");
    EXPECT_EQ(leftovers(), with_init);
    std::filesystem::remove_all(dir.path("out/.prepare-1-train"));
    // an entry that fails in the second pass (a JSON file after the tokenizer's pass would have
    // read it) ends the run with the outputs as they were and no scratch left
    dir.write("corpus/z.jsonl", "{\"text\": \"fine\"}\n{\"body\": 1}\n");
    expect_input_error([&] { prepare_corpus(given); }, {"z.jsonl:2"});
    EXPECT_EQ(leftovers(), outputs);
    EXPECT_TRUE(read_all(opts.train_path) == train);
}

TEST(Prepare, SeedChangesSplit) {
    const std::vector<std::string> entries = testing::small_corpus(200);
    int differ                             = 0;
    for (const std::string& e : entries)
        differ += is_val_entry(e, 0.5, 1) != is_val_entry(e, 0.5, 2);
    EXPECT_GT(differ, 50);
}

TEST(Prepare, EmptyValSplit) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, {"only one entry", "and another"});
    opts.val_fraction   = 1e-9;
    expect_input_error([&] { prepare_corpus(opts); }, {"val split is empty", "val_fraction"});
}

TEST(Prepare, BadOptions) {
    TempDir dir;
    PrepareOptions opts = make_corpus(dir, testing::small_corpus(20));
    opts.vocab_size     = 256;
    expect_input_error([&] { prepare_corpus(opts); }, {"vocab_size 256", "byte"});
    opts.vocab_size   = 400;
    opts.val_fraction = 1.5;
    expect_input_error([&] { prepare_corpus(opts); }, {"val_fraction 1.5"});
    opts.val_fraction = 0.1;
    opts.text_key     = "";
    expect_input_error([&] { prepare_corpus(opts); }, {"text_key"});
    opts.text_key = "text";
    opts.corpus   = {dir.path("missing")};
    expect_input_error([&] { prepare_corpus(opts); }, {dir.path("missing")});
}

// An output that is a corpus input, lies in a corpus folder, or is another output is refused
// before anything is written: the corpus file keeps its bytes.
TEST(Prepare, OutputsOverwritingInputsOrEachOtherAreRefused) {
    TempDir dir;
    const PrepareOptions good = make_corpus(dir, testing::small_corpus(20));
    const std::string corpus  = read_all(good.corpus[0]);

    PrepareOptions opts = good;
    opts.train_path     = good.corpus[0];
    expect_input_error([&] { prepare_corpus(opts); }, {"data.train", good.corpus[0], "corpus"});
    EXPECT_EQ(read_all(good.corpus[0]), corpus);

    opts          = good;
    opts.corpus   = {dir.path("corpus")};  // the folder
    opts.val_path = dir.path("corpus/sub/val.bin");
    expect_input_error([&] { prepare_corpus(opts); }, {"data.val", "corpus"});

    opts          = good;
    opts.val_path = good.train_path;
    expect_input_error([&] { prepare_corpus(opts); }, {"data.val", "same file as data.train"});

    opts                = good;
    opts.tokenizer_path = dir.path("out/./meta.json");
    expect_input_error([&] { prepare_corpus(opts); }, {"meta.json", "data.tokenizer"});
    EXPECT_FALSE(std::filesystem::exists(good.train_path));

    prepare_corpus(good);  // and the options as made are fine
}

// tokenizer_from: another corpus encoded with a tokenizer made before (a trained model's), not a
// new one: the tokenizer is copied byte for byte, the shards decode with it to the entries, and
// the outputs' checks, the vocabulary size and the eos piece are checked before anything is
// written.
TEST(Prepare, EncodesWithAGivenTokenizer) {
    TempDir dir;
    const PrepareOptions first = make_corpus(dir, testing::small_corpus(300));
    prepare_corpus(first);
    const std::string tok_bytes = read_all(first.tokenizer_path);

    // another corpus (the first 120 entries) into other outputs, with another split and order
    const std::vector<std::string> entries = testing::small_corpus(120);
    PrepareOptions opts                    = make_corpus(dir, entries);
    opts.train_path                        = dir.path("out2/train.bin");
    opts.val_path                          = dir.path("out2/val.bin");
    opts.tokenizer_path                    = dir.path("out2/tokenizer.model");
    opts.seed                              = 7;
    opts.tokenizer_from                    = first.tokenizer_path;
    const PrepareResult r                  = prepare_corpus(opts);
    EXPECT_TRUE(read_all(opts.tokenizer_path) == tok_bytes);
    const Tokenizer tok = Tokenizer::load(opts.tokenizer_path);
    std::vector<std::string> docs =
        decode_documents(tok, read_token_file(opts.train_path, tok.vocab_size()).tokens);
    const std::vector<std::string> val =
        decode_documents(tok, read_token_file(opts.val_path, tok.vocab_size()).tokens);
    EXPECT_EQ(static_cast<int64_t>(val.size()), r.n_val_entries);
    docs.insert(docs.end(), val.begin(), val.end());
    EXPECT_EQ(sorted(docs), sorted(entries));
    const auto meta = nlohmann::json::parse(read_all(dir.path("out2/meta.json")));
    EXPECT_EQ(meta["tokenizer_from"], first.tokenizer_path);

    // the tokenizer in place: encodes with it and leaves it as it was
    opts.tokenizer_from = opts.tokenizer_path;
    prepare_corpus(opts);
    EXPECT_TRUE(read_all(opts.tokenizer_path) == tok_bytes);

    const std::string train_before = read_all(opts.train_path);
    opts.tokenizer_from            = first.tokenizer_path;
    opts.vocab_size                = 512;
    expect_input_error([&] { prepare_corpus(opts); }, {"--tokenizer", first.tokenizer_path,
                                                       "400 pieces", "model.vocab_size = 512"});
    opts.vocab_size     = 400;
    opts.tokenizer_from = first.train_path;  // not a tokenizer
    expect_input_error([&] { prepare_corpus(opts); }, {first.train_path});
    opts.tokenizer_from = opts.val_path;
    expect_input_error([&] { prepare_corpus(opts); },
                       {"--tokenizer", "data.val", "prepare writes"});
    EXPECT_TRUE(read_all(opts.train_path) == train_before);
}

TEST(Prepare, UnigramEntropy) {
    EXPECT_EQ(unigram_entropy({}), 0.0);
    EXPECT_EQ(unigram_entropy(std::vector<int32_t>{7, 7, 7}), 0.0);
    EXPECT_NEAR(unigram_entropy(std::vector<int32_t>{0, 1, 2, 3, 3, 2, 1, 0}), std::log(4.0),
                1e-12);
    const double p = 0.25;
    EXPECT_NEAR(unigram_entropy(std::vector<int32_t>{5, 9, 9, 9}),
                -(p * std::log(p) + (1 - p) * std::log(1 - p)), 1e-12);
}

TEST(Prepare, ReadValUnigramEntropy) {
    TempDir dir;
    EXPECT_EQ(read_val_unigram_entropy(dir.path("val.bin")), std::nullopt);
    dir.write("meta.json", R"({"val": "elsewhere/val.bin", "val_unigram_entropy": 4.5})");
    EXPECT_EQ(read_val_unigram_entropy(dir.path("val.bin")), 4.5);
    EXPECT_EQ(read_val_unigram_entropy(dir.path("other.bin")), std::nullopt);
    dir.write("meta.json", "{not json");
    expect_input_error([&] { read_val_unigram_entropy(dir.path("val.bin")); },
                       {dir.path("meta.json"), "not valid JSON"});
}

}  // namespace
}  // namespace bagualu::data

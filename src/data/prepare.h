// Corpus preparation: text entries -> trained tokenizer + train/val token shards + meta.json.
// Each entry (corpus.h: fortune or plain text, JSON Lines, gzip) goes to val or train by a seeded
// xxhash64 of its text (independent of file order; duplicates land on the same side), and each
// split is written in the order of that hash (a deterministic shuffle), each entry followed by
// eos. The corpus is streamed, in bounded memory:
// 1. unless a tokenizer is given (PrepareOptions::tokenizer_from), a first pass keeps the
//    tokenizer's sample (the first tokenizer_entries train entries in hash order, or all) and
//    the tokenizer is trained on it;
// 2. a second pass encodes batches of entries on every core into scratch files beside the
//    output ("spills"), in buckets of consecutive hash ranges, keeping 24 bytes an entry;
// 3. each split is written a bucket at a time, in hash order (token_file.h; shards for a
//    pattern), then the tokenizer and meta.json beside val_path, which records the inputs (each
//    corpus file's size and time) so that outputs_up_to_date can tell when they changed.
// Memory: the tokenizer's sample, a batch of 16 MiB of text and its tokens, one bucket's tokens
// and 24 bytes an entry. Disk: 4 bytes a token of scratch until the end. Model training is
// elsewhere.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace bagualu::data {

struct PrepareOptions {
    std::vector<std::string> corpus;  // fortune files or folders
    std::string train_path, val_path, tokenizer_path;
    // "" = train the tokenizer on the train entries; else a SentencePiece model to encode with
    // (a trained model's, to train it further on this corpus), copied to tokenizer_path
    std::string tokenizer_from;
    std::string text_key = "text";  // JSON corpus files: the field holding an entry
    // Train the tokenizer on the first N train entries in hash order (a uniform sample); 0 = all
    int64_t tokenizer_entries = 0;
    // A train or val path holding one `*` (in its file name) is a pattern: the split is written
    // as shards of about this many tokens each (cut after a document), the `*` standing for
    // 000000, 000001, ...; files matching the pattern that prepare did not write are removed.
    int64_t shard_tokens = 100'000'000;
    int vocab_size       = 8192;
    double val_fraction  = 0.01;  // in (0, 1)
    uint64_t seed        = 1337;
    // corpus bytes (as stored) a bucket of the encoded train split holds, between 1 and 256
    // buckets; the split is written a bucket at a time
    int64_t bucket_bytes = int64_t{64} << 20;
    // told what prepare_corpus is about to do, once the corpus is read (for a log line)
    std::function<void(const std::string&)> progress;
};

struct PrepareResult {
    int64_t n_entries, n_train_entries, n_val_entries, train_tokens, val_tokens;
    double val_unigram_entropy;                       // nats/token
    std::vector<std::string> train_files, val_files;  // written
};

PrepareResult prepare_corpus(const PrepareOptions& opts);

// Whether the outputs exist and the meta.json beside val_path says they were made by
// prepare_corpus(opts) from the corpus files as they are now (names, sizes and times); a
// tokenizer_from must also hold the bytes of the tokenizer written.
bool outputs_up_to_date(const PrepareOptions& opts);

// Entropy (nats) of the empirical token distribution of `tokens`: the lowest cross-entropy a
// model that ignores context can reach on them. 0 for an empty span.
double unigram_entropy(std::span<const int32_t> tokens);
// The same from each id's count (counts[id]), summed in id order: the same bits.
double unigram_entropy_of_counts(std::span<const int64_t> counts);

// val_unigram_entropy from the meta.json beside `val_path`; nullopt if there is no meta.json or
// it describes a different val file. A meta.json that does not parse is an InputError.
std::optional<double> read_val_unigram_entropy(const std::string& val_path);

// The files a train or val path names: itself, or for a pattern its first n shards.
std::vector<std::string> shard_paths(const std::string& path, int64_t n);

// Path of the meta.json that prepare_corpus writes for `val_path`.
std::string meta_path_for(const std::string& val_path);

// True if the entry goes to the val split for this seed and fraction.
bool is_val_entry(std::string_view entry, double val_fraction, uint64_t seed);

}  // namespace bagualu::data

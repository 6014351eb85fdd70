// Corpus preparation (see prepare.h).
#include "data/prepare.h"

#include <fmt/format.h>
#include <fnmatch.h>
#include <glob.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "data/corpus.h"
#include "data/file_io.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace bagualu::data {

namespace fs = std::filesystem;

namespace {

// The most tokens a shard may be aimed at: a document past the cut still fits the format's
// int32 count.
constexpr int64_t kMaxShardTokens = 1'000'000'000;

uint64_t entry_hash(std::string_view entry, uint64_t seed) {
    return XXH64(entry.data(), entry.size(), seed);
}

// Whether an entry of this hash goes to val: the hash's top 53 bits as a double in [0, 1).
bool val_hash(uint64_t hash, double val_fraction) {
    return static_cast<double>(hash >> 11) * 0x1.0p-53 < val_fraction;
}

bool is_pattern(const std::string& path) { return path.find('*') != std::string::npos; }

// Whether path is base or lies below it (both made absolute, with . and .. and symbolic links
// resolved as far as they exist).
bool same_or_below(const fs::path& path, const fs::path& base) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec), b = fs::weakly_canonical(base, ec);
    if (p == b) return true;
    const fs::path rel = p.lexically_relative(b);
    return !rel.empty() && *rel.begin() != ".." && !rel.is_absolute();
}

// Whether `path` is a file a shard pattern would match (and so write over or remove).
bool matched_by(const std::string& pattern, const std::string& path) {
    if (!is_pattern(pattern)) return false;
    std::error_code ec;
    const fs::path pd = fs::weakly_canonical(fs::path(pattern).parent_path(), ec);
    const fs::path fd = fs::weakly_canonical(fs::path(path).parent_path(), ec);
    return pd == fd && ::fnmatch(fs::path(pattern).filename().c_str(),
                                 fs::path(path).filename().c_str(), 0) == 0;
}

// The outputs (the three files and the meta.json beside val) are written over whatever is there:
// none may be another of them, match another's shard pattern, or be one of the corpus inputs (or
// lie in a corpus folder), which prepare would overwrite while, or before, reading it.
void validate_outputs(const PrepareOptions& opts) {
    const std::pair<const char*, std::string> outs[] = {
        {"data.train", opts.train_path},
        {"data.val", opts.val_path},
        {"data.tokenizer", opts.tokenizer_path},
        {"meta.json (beside data.val)", meta_path_for(opts.val_path)}};
    for (size_t i = 0; i < std::size(outs); ++i) {
        for (size_t j = 0; j < std::size(outs); ++j) {
            if (j != i && matched_by(outs[j].second, outs[i].second)) {
                input_error(
                    "{} = \"{}\" matches the shard pattern {} = \"{}\", whose files "
                    "prepare writes and removes",
                    outs[i].first, outs[i].second, outs[j].first, outs[j].second);
            }
        }
        for (size_t j = 0; j < i; ++j) {
            if (same_or_below(outs[i].second, outs[j].second)) {
                input_error("{} = \"{}\" is the same file as {}: prepare writes each of them",
                            outs[i].first, outs[i].second, outs[j].first);
            }
        }
        for (const std::string& c : opts.corpus) {
            if (matched_by(outs[i].second, c)) {
                input_error(
                    "{} = \"{}\" matches the corpus input \"{}\": prepare would "
                    "overwrite or remove what it reads; write the outputs elsewhere",
                    outs[i].first, outs[i].second, c);
            }
            if (same_or_below(outs[i].second, c)) {
                input_error(
                    "{} = \"{}\" is (or lies in) the corpus input \"{}\": prepare would "
                    "overwrite what it reads; write the outputs elsewhere",
                    outs[i].first, outs[i].second, c);
            }
        }
        // the tokenizer given may be data.tokenizer itself (copied onto itself), no other output
        if (!opts.tokenizer_from.empty() && outs[i].second != opts.tokenizer_path &&
            same_or_below(opts.tokenizer_from, outs[i].second)) {
            input_error("--tokenizer {} is {} = \"{}\", which prepare writes", opts.tokenizer_from,
                        outs[i].first, outs[i].second);
        }
    }
}

void validate(const PrepareOptions& opts) {
    if (opts.corpus.empty()) input_error("corpus: no files or folders given");
    if (opts.train_path.empty() || opts.val_path.empty() || opts.tokenizer_path.empty()) {
        input_error("train, val and tokenizer paths must all be set (got '{}', '{}', '{}')",
                    opts.train_path, opts.val_path, opts.tokenizer_path);
    }
    validate_vocab_size(opts.vocab_size);
    if (opts.text_key.empty()) input_error("text_key must not be empty (the JSON field of a text)");
    if (opts.tokenizer_entries < 0) {
        input_error("tokenizer_entries = {}: must be >= 0 (0 = every train entry)",
                    opts.tokenizer_entries);
    }
    if (!(opts.val_fraction > 0.0 && opts.val_fraction < 1.0)) {
        input_error("val_fraction {} must be in (0, 1)", opts.val_fraction);
    }
    for (const auto& [key, path] :
         {std::pair<const char*, const std::string&>{"train", opts.train_path},
          {"val", opts.val_path}}) {
        const size_t star = path.find('*');
        if (star == std::string::npos) continue;
        if (path.find('*', star + 1) != std::string::npos ||
            path.find_first_of("?[") != std::string::npos ||
            path.find('/', star) != std::string::npos) {
            input_error(
                "data.{} = \"{}\": a shard pattern holds one `*` in its file name and no "
                "`?` or `[` (e.g. \"data/x/{}_*.bin\")",
                key, path, key);
        }
    }
    if (opts.shard_tokens < 1 || opts.shard_tokens > kMaxShardTokens) {
        input_error("shard_tokens = {}: must be in [1, {}] (tokens a shard file holds)",
                    opts.shard_tokens, kMaxShardTokens);
    }
    validate_outputs(opts);
    if (!opts.tokenizer_from.empty()) {
        // the model's tokenizer encodes the corpus for that model: its pieces are the ids the
        // model was trained on, and entries are separated by its </s>
        const Tokenizer tok = Tokenizer::load(opts.tokenizer_from);
        if (tok.vocab_size() != opts.vocab_size) {
            input_error("--tokenizer {}: {} pieces, model.vocab_size = {} (they must agree)",
                        opts.tokenizer_from, tok.vocab_size(), opts.vocab_size);
        }
        if (tok.eos_id() < 0) {
            input_error("--tokenizer {}: no </s> piece, which separates the entries",
                        opts.tokenizer_from);
        }
    }
}

// The tokenizer's training sample: the first `limit` train entries in (hash, text) order, or all
// of them (limit 0), which is the order prepare writes them in. A max-heap of the kept ones.
class TokenizerSample {
   public:
    explicit TokenizerSample(int64_t limit) : limit_(static_cast<size_t>(limit)) {}
    void offer(uint64_t hash, std::string&& text) {
        if (limit_ == 0 || kept_.size() < limit_) {
            kept_.emplace_back(hash, std::move(text));
            if (limit_ != 0) std::push_heap(kept_.begin(), kept_.end());
            return;
        }
        if (!(std::pair<uint64_t, std::string_view>(hash, text) <
              std::pair<uint64_t, std::string_view>(kept_.front().first, kept_.front().second))) {
            return;
        }
        std::pop_heap(kept_.begin(), kept_.end());
        kept_.back() = {hash, std::move(text)};
        std::push_heap(kept_.begin(), kept_.end());
    }
    // The texts in (hash, text) order.
    std::vector<std::string> take_sorted() {
        std::sort(kept_.begin(), kept_.end());
        std::vector<std::string> out;
        out.reserve(kept_.size());
        for (auto& [h, t] : kept_) out.push_back(std::move(t));
        kept_.clear();
        return out;
    }

   private:
    size_t limit_;
    std::vector<std::pair<uint64_t, std::string>> kept_;
};

// One entry's place in the spill: its tokens (eos not included) at [offset, offset + n) of its
// bucket's file.
struct SpillRow {
    uint64_t hash;
    uint64_t offset;
    uint32_t n;
    uint32_t bucket;
};

// A split's encoded entries on disk, in buckets of consecutive hash ranges, so that the split is
// written in hash order by reading one bucket at a time, whole and in sequence. Its files lie in
// a folder of their own beside the output, removed when the spill is destroyed.
class Spill {
   public:
    Spill(const fs::path& dir, int n_buckets) : dir_(dir), files_(static_cast<size_t>(n_buckets)) {
        std::error_code ec;
        fs::create_directories(dir_, ec);
        if (ec)
            input_error("{}: cannot create the encoding's scratch folder: {}", dir_.string(),
                        ec.message());
        sizes_.assign(files_.size(), 0);
    }
    ~Spill() {
        for (std::FILE* f : files_) {
            if (f != nullptr) std::fclose(f);
        }
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    Spill(const Spill&)            = delete;
    Spill& operator=(const Spill&) = delete;

    // Buckets are monotone in the hash, so bucket order is hash order.
    uint32_t bucket_of(uint64_t hash) const {
        return static_cast<uint32_t>(((hash >> 32) * files_.size()) >> 32);
    }
    void add(uint64_t hash, const std::vector<int32_t>& tokens) {
        const uint32_t b = bucket_of(hash);
        std::FILE*& f    = files_[b];
        if (f == nullptr) {
            f = std::fopen(path(b).c_str(), "w+b");
            if (f == nullptr) fail(b);
        }
        if (!tokens.empty() &&
            std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f) != tokens.size()) {
            fail(b);
        }
        rows_.push_back({hash, sizes_[b], static_cast<uint32_t>(tokens.size()), b});
        sizes_[b] += tokens.size();
        n_tokens_ += static_cast<int64_t>(tokens.size()) + 1;  // and its eos
    }
    std::vector<SpillRow>& rows() { return rows_; }
    int64_t n_tokens() const { return n_tokens_; }  // eos included
    // Bucket b's tokens, read whole into `out` (its memory reused: one bucket at a time).
    void read_bucket(uint32_t b, std::vector<int32_t>& out) {
        out.clear();
        out.resize(sizes_[b]);
        std::FILE* f = files_[b];
        if (f != nullptr &&
            (std::fflush(f) != 0 || std::fseek(f, 0, SEEK_SET) != 0 ||
             std::fread(out.data(), sizeof(int32_t), out.size(), f) != out.size())) {
            fail(b);
        }
    }

   private:
    std::string path(uint32_t b) const { return (dir_ / fmt::format("{:04d}.tokens", b)).string(); }
    [[noreturn]] void fail(uint32_t b) const {
        input_error("{}: cannot write or read the encoded tokens: {}", path(b),
                    std::strerror(errno));
    }
    fs::path dir_;
    std::vector<std::FILE*> files_;
    std::vector<uint64_t> sizes_;  // tokens in each bucket's file
    std::vector<SpillRow> rows_;
    int64_t n_tokens_ = 0;
};

// Encodes batches of entries on every core (sentencepiece's encoder is const and thread-safe),
// each entry's tokens kept whole, then hands them to the spills in the entries' order, so nothing
// depends on the number of threads.
class BatchEncoder {
   public:
    BatchEncoder(const Tokenizer& tok, uint64_t seed, double val_fraction, Spill& train, Spill& val)
        : tok_(tok), seed_(seed), val_fraction_(val_fraction), train_(train), val_(val) {}
    void add(std::string&& text) {
        bytes_ += text.size();
        text_bytes_ += static_cast<int64_t>(text.size());
        texts_.push_back(std::move(text));
        if (bytes_ >= kBatchBytes) flush();
    }
    void flush() {
        const size_t n = texts_.size();
        if (n == 0) return;
        std::vector<std::vector<int32_t>> ids(n);
        const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1,
                                                    std::max<size_t>(1, n / 256));
        std::vector<std::exception_ptr> errors(n_threads);
        auto encode_range = [&](size_t t) {
            try {
                for (size_t i = n * t / n_threads; i < n * (t + 1) / n_threads; ++i) {
                    ids[i] = tok_.encode(texts_[i]);
                }
            } catch (...) {
                errors[t] = std::current_exception();
            }
        };
        std::vector<std::thread> threads;
        for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(encode_range, t);
        encode_range(0);
        for (std::thread& th : threads) th.join();
        for (const std::exception_ptr& e : errors) {
            if (e) std::rethrow_exception(e);
        }
        for (size_t i = 0; i < n; ++i) {
            const uint64_t h = entry_hash(texts_[i], seed_);
            (val_hash(h, val_fraction_) ? val_ : train_).add(h, ids[i]);
        }
        texts_.clear();
        bytes_ = 0;
    }
    int64_t text_bytes() const { return text_bytes_; }

   private:
    static constexpr size_t kBatchBytes = 16 << 20;
    const Tokenizer& tok_;
    uint64_t seed_;
    double val_fraction_;
    Spill &train_, &val_;
    std::vector<std::string> texts_;
    size_t bytes_       = 0;
    int64_t text_bytes_ = 0;
};

constexpr std::string_view kSpillPrefix = ".prepare-";  // then the pid, "-", the split

// Removes the scratch folders in `dir` of a prepare that is no longer running (killed before it
// could remove them), so they do not pile up.
void remove_abandoned_spills(const fs::path& dir) {
    std::error_code ec;
    for (const fs::directory_entry& de : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
        const std::string name = de.path().filename().string();
        if (!name.starts_with(kSpillPrefix) || !de.is_directory(ec)) continue;
        const long pid = std::strtol(name.c_str() + kSpillPrefix.size(), nullptr, 10);
        if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
            fs::remove_all(de.path(), ec);
        }
    }
}

// Files matching the pattern now (none for a plain path).
std::vector<std::string> existing_shards(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    return out;
}

// Writes a spilled split in hash order (corpus order among equal hashes), each entry followed by
// eos, to `path`, or for a pattern to about ceil(n / shard_tokens) shards of nearly equal size,
// each cut after the first document that reaches its share, and removes the pattern's other
// files. `counts` (vocab_size long, or empty) gets each token's count. Returns the files written.
std::vector<std::string> write_split(const std::string& path, Spill& spill, int eos, int vocab_size,
                                     int64_t shard_tokens, std::vector<int64_t>& counts) {
    std::vector<SpillRow>& rows = spill.rows();
    std::stable_sort(rows.begin(), rows.end(),
                     [](const SpillRow& a, const SpillRow& b) { return a.hash < b.hash; });
    const int64_t total = spill.n_tokens();
    if (!is_pattern(path) && total > std::numeric_limits<int32_t>::max()) {
        input_error(
            "{}: {} tokens exceed a token file's limit of {}: name the split as a shard "
            "pattern (\"{}_*.bin\") to write it in shards",
            path, total, std::numeric_limits<int32_t>::max(),
            fs::path(path).replace_extension().string());
    }
    const int64_t n_shards =
        is_pattern(path) ? std::max<int64_t>(1, (total + shard_tokens - 1) / shard_tokens) : 1;
    std::vector<std::string> written;
    std::unique_ptr<TokenFileWriter> out;
    int64_t done = 0;                 // tokens written, eos included
    int64_t next = total / n_shards;  // the first shard to cut (k = 1)
    int64_t k    = 1;
    std::vector<int32_t> bucket;
    int64_t loaded = -1;
    for (const SpillRow& r : rows) {
        if (!out) {
            written.push_back(
                is_pattern(path)
                    ? shard_paths(path, static_cast<int64_t>(written.size()) + 1).back()
                    : path);
            out = std::make_unique<TokenFileWriter>(written.back(), vocab_size);
        }
        if (static_cast<int64_t>(r.bucket) != loaded) {
            // in hash order the buckets come in order: each is read once, in sequence
            BGL_CHECK(static_cast<int64_t>(r.bucket) > loaded, "{}: bucket {} after bucket {}",
                      path, r.bucket, loaded);
            spill.read_bucket(r.bucket, bucket);
            loaded = r.bucket;
        }
        const std::span<const int32_t> doc(bucket.data() + r.offset, r.n);
        out->append(doc);
        out->append(std::span(&eos, 1));
        if (!counts.empty()) {
            for (int32_t t : doc) ++counts[static_cast<size_t>(t)];
            ++counts[static_cast<size_t>(eos)];
        }
        done += static_cast<int64_t>(r.n) + 1;
        if (k < n_shards && done >= next && done < total) {
            out->finish();
            out.reset();
            while (k < n_shards && total * k / n_shards <= done) ++k;
            next = total * k / n_shards;
        }
    }
    if (out) out->finish();
    if (is_pattern(path)) {
        const std::set<std::string> keep(written.begin(), written.end());
        for (const std::string& old : existing_shards(path)) {
            if (keep.count(old) == 0) fs::remove(old);  // an earlier prepare's further shard
        }
    }
    return written;
}

// What meta.json records of the corpus's files: [path, bytes, mtime_ns] each, in reading order.
nlohmann::json corpus_files_json(const std::vector<CorpusFile>& files) {
    nlohmann::json out = nlohmann::json::array();
    for (const CorpusFile& f : files) out.push_back({f.path, f.bytes, f.mtime_ns});
    return out;
}

}  // namespace

bool is_val_entry(std::string_view entry, double val_fraction, uint64_t seed) {
    return val_hash(entry_hash(entry, seed), val_fraction);
}

double unigram_entropy(std::span<const int32_t> tokens) {
    std::map<int32_t, int64_t> by_id;
    for (int32_t t : tokens) ++by_id[t];
    std::vector<int64_t> counts;  // in id order, as unigram_entropy_of_counts sums them
    for (const auto& [id, c] : by_id) counts.push_back(c);
    return unigram_entropy_of_counts(counts);
}

double unigram_entropy_of_counts(std::span<const int64_t> counts) {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    if (total == 0) return 0.0;
    const double n = static_cast<double>(total);
    double h       = 0.0;
    for (int64_t c : counts) {  // in id order
        if (c == 0) continue;
        const double p = static_cast<double>(c) / n;
        h -= p * std::log(p);
    }
    return h;
}

std::vector<std::string> shard_paths(const std::string& path, int64_t n) {
    const size_t star = path.find('*');
    if (star == std::string::npos) return {path};
    std::vector<std::string> out;
    for (int64_t i = 0; i < n; ++i) {
        out.push_back(path.substr(0, star) + fmt::format("{:06d}", i) + path.substr(star + 1));
    }
    return out;
}

std::string meta_path_for(const std::string& val_path) {
    return (fs::path(val_path).parent_path() / "meta.json").string();
}

std::optional<double> read_val_unigram_entropy(const std::string& val_path) {
    const std::string meta_path = meta_path_for(val_path);
    if (!fs::exists(meta_path)) return std::nullopt;
    const std::string text = read_file_bytes(meta_path, "meta.json");
    const auto meta        = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded() || !meta.is_object()) {
        input_error("{}: not valid JSON (expected the meta.json written by prepare)", meta_path);
    }
    if (meta.contains("val") && meta["val"].is_string() &&
        fs::path(meta["val"].get<std::string>()).filename() != fs::path(val_path).filename()) {
        return std::nullopt;
    }
    if (!meta.contains("val_unigram_entropy") || !meta["val_unigram_entropy"].is_number()) {
        input_error("{}: missing number 'val_unigram_entropy'", meta_path);
    }
    return meta["val_unigram_entropy"].get<double>();
}

PrepareResult prepare_corpus(const PrepareOptions& opts) {
    validate(opts);
    const std::vector<CorpusFile> files = list_corpus_files(opts.corpus);
    auto progress                       = [&](const std::string& what) {
        if (opts.progress) opts.progress(what);
    };
    int64_t n_train = 0, n_val = 0, text_bytes = 0;
    auto check_splits = [&] {
        if (n_train + n_val == 0) {
            input_error("corpus: no text entries found in {}", fmt::join(opts.corpus, ", "));
        }
        if (n_val == 0) {
            input_error(
                "val split is empty: none of the {} entries hashed into val at val_fraction "
                "{} (seed {}); raise val_fraction or add entries",
                n_train, opts.val_fraction, opts.seed);
        }
        if (n_train == 0) {
            input_error(
                "train split is empty: all {} entries hashed into val at val_fraction {} "
                "(seed {}); lower val_fraction or add entries",
                n_val, opts.val_fraction, opts.seed);
        }
        progress(fmt::format("{} entries ({:.1f} MB of text) from {} file{}", n_train + n_val,
                             static_cast<double>(text_bytes) / 1e6, files.size(),
                             files.size() == 1 ? "" : "s"));
    };

    // 1. the tokenizer: trained on a sample of the train entries (a first pass over the
    // corpus), or the one given
    std::string model_bytes;
    if (opts.tokenizer_from.empty()) {
        TokenizerSample sample(opts.tokenizer_entries);
        for_each_corpus_entry(files, opts.text_key, [&](std::string&& e) {
            text_bytes += static_cast<int64_t>(e.size());
            const uint64_t h = entry_hash(e, opts.seed);
            if (val_hash(h, opts.val_fraction)) {
                ++n_val;
                return;
            }
            ++n_train;
            sample.offer(h, std::move(e));
        });
        check_splits();
        std::vector<std::string> texts = sample.take_sorted();
        progress(fmt::format("training a {}-piece BPE tokenizer on {} train entries ...",
                             opts.vocab_size, texts.size()));
        model_bytes = train_tokenizer_model(texts, opts.vocab_size, opts.seed);
    } else {
        model_bytes = read_file_bytes(opts.tokenizer_from, "--tokenizer");
    }
    const Tokenizer tok = Tokenizer::from_model_bytes(
        model_bytes, opts.tokenizer_from.empty() ? opts.tokenizer_path : opts.tokenizer_from);

    // 2. encode every entry into the spills, in buckets of its hash
    for (const std::string* p : {&opts.train_path, &opts.val_path, &opts.tokenizer_path}) {
        create_parent_dirs(*p);
    }
    int64_t corpus_bytes = 0;
    for (const CorpusFile& f : files) corpus_bytes += f.bytes;
    // bucket_bytes of corpus file a train bucket (a gzipped one holds more), at most 256
    const int n_buckets = static_cast<int>(
        std::clamp<int64_t>(corpus_bytes / std::max<int64_t>(1, opts.bucket_bytes), 1, 256));
    const fs::path out_dir   = fs::path(opts.train_path).parent_path();
    const std::string prefix = fmt::format("{}{}-", kSpillPrefix, ::getpid());
    remove_abandoned_spills(out_dir);
    Spill train(out_dir / (prefix + "train"), n_buckets);
    Spill val(out_dir / (prefix + "val"),
              std::max(1, static_cast<int>(std::ceil(n_buckets * opts.val_fraction))));
    if (!opts.tokenizer_from.empty())
        progress(fmt::format("encoding with {} ...", opts.tokenizer_from));
    BatchEncoder encoder(tok, opts.seed, opts.val_fraction, train, val);
    for_each_corpus_entry(files, opts.text_key,
                          [&](std::string&& e) { encoder.add(std::move(e)); });
    encoder.flush();
    ::malloc_trim(0);  // the batches' freed memory back to the system before the buckets are read
    if (!opts.tokenizer_from.empty()) {
        n_train    = static_cast<int64_t>(train.rows().size());
        n_val      = static_cast<int64_t>(val.rows().size());
        text_bytes = encoder.text_bytes();
        check_splits();
    } else if (static_cast<int64_t>(train.rows().size()) != n_train ||
               static_cast<int64_t>(val.rows().size()) != n_val) {
        input_error("corpus: {} changed while prepare read it ({} entries, then {}); run it again",
                    fmt::join(opts.corpus, ", "), n_train + n_val,
                    train.rows().size() + val.rows().size());
    }

    // 3. write the splits in hash order, then the tokenizer and meta.json; the old meta.json goes
    // first, so that outputs a failed write leaves half new are never taken as up to date
    std::error_code ec;
    fs::remove(meta_path_for(opts.val_path), ec);
    std::vector<int64_t> no_counts, val_counts(static_cast<size_t>(tok.vocab_size()), 0);
    PrepareResult r;
    r.n_train_entries = n_train;
    r.n_val_entries   = n_val;
    r.n_entries       = n_train + n_val;
    r.train_tokens    = train.n_tokens();
    r.val_tokens      = val.n_tokens();
    r.train_files     = write_split(opts.train_path, train, tok.eos_id(), tok.vocab_size(),
                                    opts.shard_tokens, no_counts);
    r.val_files = write_split(opts.val_path, val, tok.eos_id(), tok.vocab_size(), opts.shard_tokens,
                              val_counts);
    r.val_unigram_entropy = unigram_entropy_of_counts(val_counts);
    write_file_atomic(opts.tokenizer_path, model_bytes);

    const nlohmann::json meta = {
        {"vocab_size", tok.vocab_size()},
        {"n_entries", r.n_entries},
        {"n_train_entries", r.n_train_entries},
        {"n_val_entries", r.n_val_entries},
        {"train_tokens", r.train_tokens},
        {"val_tokens", r.val_tokens},
        {"val_unigram_entropy", r.val_unigram_entropy},
        {"tokenizer", opts.tokenizer_path},
        {"tokenizer_from", opts.tokenizer_from},
        {"train", opts.train_path},
        {"train_files", r.train_files},
        {"val_files", r.val_files},
        {"shard_tokens", opts.shard_tokens},
        {"val", opts.val_path},
        {"corpus", opts.corpus},
        {"corpus_files", corpus_files_json(files)},
        {"text_key", opts.text_key},
        {"tokenizer_entries", opts.tokenizer_entries},
        {"val_fraction", opts.val_fraction},
        {"seed", opts.seed},
    };
    write_file_atomic(meta_path_for(opts.val_path), meta.dump(2) + "\n");
    return r;
}

bool outputs_up_to_date(const PrepareOptions& opts) {
    const std::string meta = meta_path_for(opts.val_path);
    for (const std::string* p : {&meta, &opts.tokenizer_path}) {
        if (!fs::exists(*p)) return false;
    }
    try {
        const nlohmann::json j = nlohmann::json::parse(read_file_bytes(meta, "meta.json"));
        for (const auto& [key, path] :
             {std::pair<const char*, const std::string&>{"train_files", opts.train_path},
              {"val_files", opts.val_path}}) {
            const auto files = j.value(key, std::vector<std::string>{});
            // every file written is there, and for a pattern no other matches it
            if (files.empty() || !std::all_of(files.begin(), files.end(),
                                              [](const std::string& f) { return fs::exists(f); })) {
                return false;
            }
            if (is_pattern(path) && existing_shards(path).size() != files.size()) return false;
        }
        const bool sharded = is_pattern(opts.train_path) || is_pattern(opts.val_path);
        return j.value("vocab_size", -1) == opts.vocab_size &&
               (!sharded || j.value("shard_tokens", int64_t{-1}) == opts.shard_tokens) &&
               j.value("train", std::string()) == opts.train_path &&
               j.value("val", std::string()) == opts.val_path &&
               j.value("corpus", std::vector<std::string>{}) == opts.corpus &&
               j.value("corpus_files", nlohmann::json()) ==
                   corpus_files_json(list_corpus_files(opts.corpus)) &&
               j.value("text_key", std::string()) == opts.text_key &&
               j.value("tokenizer_entries", int64_t{-1}) == opts.tokenizer_entries &&
               j.value("val_fraction", -1.0) == opts.val_fraction &&
               j.value("seed", uint64_t{0}) == opts.seed &&
               j.value("tokenizer_from", std::string()) == opts.tokenizer_from &&
               (opts.tokenizer_from.empty() ||
                read_file_bytes(opts.tokenizer_from, "--tokenizer") ==
                    read_file_bytes(opts.tokenizer_path, "data.tokenizer"));
    } catch (const std::exception&) {
        return false;  // unreadable or changed inputs: prepare again, which names the problem
    }
}

}  // namespace bagualu::data

// Corpus preparation (see prepare.h). Holds all entries and both token streams in memory, the
// tokens twice while the threads' parts are joined: about 5 bytes for each byte of text (194 MB
// at the peak for 38.6 MB of JSON Lines text, 13.3 M tokens); the fortunes corpus is ~5 MB of
// text and ~1.4 M tokens.
#include "data/prepare.h"

#include <fmt/format.h>
#include <fnmatch.h>
#include <glob.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_map>

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

// Hash in [0, 1): the top 53 bits of the xxhash64 as a double.
double unit_hash(std::string_view entry, uint64_t seed) {
    return static_cast<double>(entry_hash(entry, seed) >> 11) * 0x1.0p-53;
}

// Whether path is base or lies below it (both made absolute, with . and .. and symbolic links
// resolved as far as they exist).
bool same_or_below(const fs::path& path, const fs::path& base) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec), b = fs::weakly_canonical(base, ec);
    if (p == b) return true;
    const fs::path rel = p.lexically_relative(b);
    return !rel.empty() && *rel.begin() != ".." && !rel.is_absolute();
}

// The outputs (the three files and the meta.json beside val) are written over whatever is there:
// none may be another of them or one of the corpus inputs (or lie in a corpus folder), which
// prepare would overwrite while, or before, reading it.
// Whether `path` is a file a shard pattern would match (and so write over or remove).
bool matched_by(const std::string& pattern, const std::string& path) {
    if (pattern.find('*') == std::string::npos) return false;
    std::error_code ec;
    const fs::path pd = fs::weakly_canonical(fs::path(pattern).parent_path(), ec);
    const fs::path fd = fs::weakly_canonical(fs::path(path).parent_path(), ec);
    return pd == fd && ::fnmatch(fs::path(pattern).filename().c_str(),
                                 fs::path(path).filename().c_str(), 0) == 0;
}

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

// Sorts by (hash, text) so the order depends on neither file order nor hash ties.
void sort_by_hash(std::vector<std::string>& entries, uint64_t seed) {
    std::vector<std::pair<uint64_t, std::string>> keyed;
    keyed.reserve(entries.size());
    for (std::string& e : entries) keyed.emplace_back(entry_hash(e, seed), std::move(e));
    std::sort(keyed.begin(), keyed.end());
    for (size_t i = 0; i < keyed.size(); ++i) entries[i] = std::move(keyed[i].second);
}

// Each entry's tokens followed by eos, the document separator. Every core encodes a contiguous
// range of entries (sentencepiece's encoder is const and thread-safe); the ranges are joined in
// order, so the tokens do not depend on the number of threads.
std::vector<int32_t> encode_entries(const Tokenizer& tok, const std::vector<std::string>& entries) {
    const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1,
                                                std::max<size_t>(1, entries.size() / 256));
    std::vector<std::vector<int32_t>> parts(n_threads);
    std::vector<std::exception_ptr> errors(n_threads);
    auto encode_range = [&](size_t t) {
        try {
            const size_t lo = entries.size() * t / n_threads;
            const size_t hi = entries.size() * (t + 1) / n_threads;
            for (size_t i = lo; i < hi; ++i) {
                const std::vector<int32_t> ids = tok.encode(entries[i]);
                parts[t].insert(parts[t].end(), ids.begin(), ids.end());
                parts[t].push_back(tok.eos_id());
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
    size_t total = 0;
    for (const auto& p : parts) total += p.size();
    std::vector<int32_t> tokens = std::move(parts[0]);
    tokens.reserve(total);
    for (size_t t = 1; t < n_threads; ++t)
        tokens.insert(tokens.end(), parts[t].begin(), parts[t].end());
    return tokens;
}

bool is_pattern(const std::string& path) { return path.find('*') != std::string::npos; }

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

// Writes a split's tokens (documents ending with eos) to `path`, or for a pattern to about
// ceil(n / shard_tokens) shards of nearly equal size cut after a document, and removes the
// pattern's other files. Returns the files written.
std::vector<std::string> write_split(const std::string& path, const std::vector<int32_t>& tokens,
                                     int eos, int vocab_size, int64_t shard_tokens) {
    const auto total = static_cast<int64_t>(tokens.size());
    if (!is_pattern(path)) {
        if (total > std::numeric_limits<int32_t>::max()) {
            input_error(
                "{}: {} tokens exceed a token file's limit of {}: name the split as a shard "
                "pattern (\"{}_*.bin\") to write it in shards",
                path, total, std::numeric_limits<int32_t>::max(),
                fs::path(path).replace_extension().string());
        }
        write_token_file(path, tokens, vocab_size);
        return {path};
    }
    const int64_t n           = std::max<int64_t>(1, (total + shard_tokens - 1) / shard_tokens);
    std::vector<int64_t> cuts = {0};
    for (int64_t k = 1; k < n; ++k) {
        int64_t c = std::max(total * k / n, cuts.back());
        while (c < total && (c == 0 || tokens[static_cast<size_t>(c - 1)] != eos)) ++c;
        if (c > cuts.back() && c < total) cuts.push_back(c);
    }
    cuts.push_back(total);
    const std::vector<std::string> paths = shard_paths(path, static_cast<int64_t>(cuts.size()) - 1);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        write_token_file(paths[i],
                         std::span(tokens).subspan(static_cast<size_t>(cuts[i]),
                                                   static_cast<size_t>(cuts[i + 1] - cuts[i])),
                         vocab_size);
    }
    const std::set<std::string> written(paths.begin(), paths.end());
    for (const std::string& old : existing_shards(path)) {
        if (written.count(old) == 0) fs::remove(old);  // an earlier prepare's further shard
    }
    return paths;
}

// What meta.json records of the corpus's files: [path, bytes, mtime_ns] each, in reading order.
nlohmann::json corpus_files_json(const std::vector<CorpusFile>& files) {
    nlohmann::json out = nlohmann::json::array();
    for (const CorpusFile& f : files) out.push_back({f.path, f.bytes, f.mtime_ns});
    return out;
}

}  // namespace

bool is_val_entry(std::string_view entry, double val_fraction, uint64_t seed) {
    return unit_hash(entry, seed) < val_fraction;
}

double unigram_entropy(std::span<const int32_t> tokens) {
    if (tokens.empty()) return 0.0;
    std::unordered_map<int32_t, int64_t> counts;
    for (int32_t t : tokens) ++counts[t];
    // Sum in id order so the result does not depend on hash-map iteration order.
    std::vector<std::pair<int32_t, int64_t>> sorted(counts.begin(), counts.end());
    std::sort(sorted.begin(), sorted.end());
    const double n = static_cast<double>(tokens.size());
    double h       = 0.0;
    for (const auto& [id, c] : sorted) {
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
    std::vector<std::string> entries    = read_corpus_entries(files, opts.text_key);
    if (entries.empty()) {
        input_error("corpus: no text entries found in {}", fmt::join(opts.corpus, ", "));
    }

    std::vector<std::string> train, val;
    for (std::string& e : entries) {
        (is_val_entry(e, opts.val_fraction, opts.seed) ? val : train).push_back(std::move(e));
    }
    if (val.empty()) {
        input_error(
            "val split is empty: none of the {} entries hashed into val at val_fraction "
            "{} (seed {}); raise val_fraction or add entries",
            train.size(), opts.val_fraction, opts.seed);
    }
    if (train.empty()) {
        input_error(
            "train split is empty: all {} entries hashed into val at val_fraction {} "
            "(seed {}); lower val_fraction or add entries",
            val.size(), opts.val_fraction, opts.seed);
    }
    sort_by_hash(train, opts.seed);
    sort_by_hash(val, opts.seed);
    auto progress = [&](const std::string& what) {
        if (opts.progress) opts.progress(what);
    };
    size_t text_bytes = 0;
    for (const auto* split : {&train, &val}) {
        for (const std::string& e : *split) text_bytes += e.size();
    }
    progress(fmt::format("{} entries ({:.1f} MB of text) from {} file{}", train.size() + val.size(),
                         static_cast<double>(text_bytes) / 1e6, files.size(),
                         files.size() == 1 ? "" : "s"));

    for (const std::string* p : {&opts.train_path, &opts.val_path, &opts.tokenizer_path}) {
        create_parent_dirs(*p);
    }
    // the train split is in hash order, so its first entries are a uniform sample
    const size_t n_tok = opts.tokenizer_entries > 0
                             ? std::min(train.size(), static_cast<size_t>(opts.tokenizer_entries))
                             : train.size();
    progress(opts.tokenizer_from.empty()
                 ? fmt::format("training a {}-piece BPE tokenizer on {} train entries ...",
                               opts.vocab_size, n_tok)
                 : fmt::format("encoding with {} ...", opts.tokenizer_from));
    write_file_atomic(
        opts.tokenizer_path,
        opts.tokenizer_from.empty()
            ? train_tokenizer_model(std::span(train).first(n_tok), opts.vocab_size, opts.seed)
            : read_file_bytes(opts.tokenizer_from, "--tokenizer"));
    const Tokenizer tok                        = Tokenizer::load(opts.tokenizer_path);
    const std::vector<int32_t> train_tokens    = encode_entries(tok, train);
    const std::vector<int32_t> val_tokens      = encode_entries(tok, val);
    const std::vector<std::string> train_files = write_split(
        opts.train_path, train_tokens, tok.eos_id(), tok.vocab_size(), opts.shard_tokens);
    const std::vector<std::string> val_files =
        write_split(opts.val_path, val_tokens, tok.eos_id(), tok.vocab_size(), opts.shard_tokens);

    PrepareResult r;
    r.n_train_entries     = static_cast<int64_t>(train.size());
    r.n_val_entries       = static_cast<int64_t>(val.size());
    r.n_entries           = r.n_train_entries + r.n_val_entries;
    r.train_tokens        = static_cast<int64_t>(train_tokens.size());
    r.val_tokens          = static_cast<int64_t>(val_tokens.size());
    r.val_unigram_entropy = unigram_entropy(val_tokens);
    r.train_files         = train_files;
    r.val_files           = val_files;

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
        {"train_files", train_files},
        {"val_files", val_files},
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

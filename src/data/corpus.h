// The text entries of a corpus (data.corpus) for prepare. Each path is a file or a folder; a
// folder contributes every regular file directly in it, sorted by name, skipping symlinks,
// `*.dat` (strfile indexes), `*.u8` and text files that are not UTF-8.
//
// Formats, by file name (after a `.gz` suffix, which any of them may carry):
// - `*.jsonl`, `*.ndjson`, `*.json`: JSON Lines, one object a line, whose string field
//   `text_key` (data.text_key, "text" by default) is an entry; blank lines are skipped. A file
//   whose first character is `[` is one JSON array of such objects instead. The text is kept
//   as it is; entries that are empty or only whitespace are dropped.
// - anything else: fortune(6) text, or plain text split on blank lines (fortunes.h).
// A file that starts with gzip's magic bytes is decompressed, whatever its name. Every problem
// in a JSON file (a line that is not an object, a missing or non-string field) is an InputError
// naming the file and line.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/function_ref.h"

struct z_stream_s;

namespace bagualu::data {

struct CorpusFile {
    std::string path;
    bool named    = false;  // given by itself, not found in a folder
    int64_t bytes = 0, mtime_ns = 0;
};

// The corpus's files in reading order. InputError for a path that does not exist.
std::vector<CorpusFile> list_corpus_files(const std::vector<std::string>& paths);

// Calls fn with every entry of the files, in their order, holding one chunk of a JSON Lines file
// at a time (a JSON array, or a text file, whole).
void for_each_corpus_entry(const std::vector<CorpusFile>& files, std::string_view text_key,
                           FunctionRef<void(std::string&&)> fn);

// All entries of the files, in their order.
std::vector<std::string> read_corpus_entries(const std::vector<CorpusFile>& files,
                                             std::string_view text_key = "text");
inline std::vector<std::string> read_corpus_entries(const std::vector<std::string>& paths,
                                                    std::string_view text_key = "text") {
    return read_corpus_entries(list_corpus_files(paths), text_key);
}

// Whether `path` names a JSON file (see above).
bool is_json_corpus_file(std::string_view path);

// A file's bytes a chunk at a time (about 1 MiB), inflated when the file starts with gzip's
// magic; gzip that is truncated, fails its CRC or has trailing bytes is an InputError naming the
// file and `what` it should hold.
class ByteReader {
   public:
    ByteReader(const std::string& path, std::string_view what);
    ~ByteReader();
    ByteReader(const ByteReader&)            = delete;
    ByteReader& operator=(const ByteReader&) = delete;
    // Appends the next bytes to `out`; false once there are none.
    bool read_some(std::string& out);

   private:
    static constexpr size_t kChunk = 1 << 20;
    void refill();
    [[noreturn]] void gzip_error(const std::string& reason) const;
    std::string path_, what_;
    std::FILE* f_ = nullptr;
    std::vector<char> in_;
    size_t in_pos_ = 0, in_len_ = 0;
    bool eof_ = false, gzip_ = false, done_ = false;
    int64_t file_size_ = 0, consumed_ = 0;
    std::unique_ptr<z_stream_s> zs_;
};

// The file's bytes, gunzipped when it starts with gzip's magic (several members concatenated
// are read one after another). `what` names the expected content in errors.
std::string read_maybe_gzip(const std::string& path, std::string_view what);

}  // namespace bagualu::data

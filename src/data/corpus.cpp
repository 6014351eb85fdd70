// Corpus reader (see corpus.h). Files are read a chunk at a time (gzip inflated by zlib as it
// comes); JSON Lines are parsed by nlohmann::json a line at a time, so reading one holds a chunk
// and a line, whatever the file's size. Fortune and plain text files are read whole.
#include "data/corpus.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/function_ref.h"
#include "data/file_io.h"
#include "data/fortunes.h"

namespace bagualu::data {

namespace fs = std::filesystem;

namespace {

bool has_suffix(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool starts_gzip(std::string_view bytes) {
    return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
           static_cast<unsigned char>(bytes[1]) == 0x8b;
}

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_blank(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_reason(const std::exception& e) {
    std::string_view msg = e.what();
    if (!msg.empty() && msg[0] == '[') {
        const size_t end = msg.find("] ");
        if (end != std::string_view::npos) msg.remove_prefix(end + 2);
    }
    return std::string(msg);
}

const char* json_type(const nlohmann::json& j) { return j.type_name(); }

using EntrySink = FunctionRef<void(std::string&&)>;

// The entry of one JSON value; `where` is "FILE:LINE" or "FILE: element N".
void take_entry(nlohmann::json& j, std::string_view key, const std::string& where, EntrySink sink) {
    if (!j.is_object()) {
        input_error("{}: a JSON {}, expected an object with a string field \"{}\" (data.text_key)",
                    where, json_type(j), key);
    }
    const auto it = j.find(key);
    if (it == j.end()) {
        std::vector<std::string> keys;
        for (const auto& [k, v] : j.items()) {
            if (keys.size() == 8) {
                keys.push_back("...");
                break;
            }
            keys.push_back(k);
        }
        input_error(
            "{}: no field \"{}\" (data.text_key); the object has {}", where, key,
            keys.empty() ? std::string("no fields") : fmt::format("{}", fmt::join(keys, ", ")));
    }
    if (!it->is_string()) {
        input_error("{}: field \"{}\" is a JSON {}, expected a string", where, key, json_type(*it));
    }
    std::string& text = it->get_ref<std::string&>();
    if (text.find('\0') != std::string::npos) {
        input_error("{}: field \"{}\" holds a NUL character (\\u0000), which is not text", where,
                    key);
    }
    if (!is_blank(text)) sink(std::move(text));
}

void take_json_line(std::string_view line, std::string_view key, const std::string& file,
                    int64_t line_no, EntrySink sink) {
    if (is_blank(line)) return;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        input_error("{}:{}: not valid JSON ({}; expected one object a line)", file, line_no,
                    json_reason(e));
    }
    take_entry(j, key, fmt::format("{}:{}", file, line_no), sink);
}

void take_json_array(std::string_view text, std::string_view key, const std::string& file,
                     EntrySink sink) {
    nlohmann::json arr;
    try {
        arr = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        input_error("{}: not valid JSON: {}", file, json_reason(e));
    }
    for (size_t i = 0; i < arr.size(); ++i) {
        take_entry(arr[i], key, fmt::format("{}: element {}", file, i + 1), sink);
    }
}

constexpr std::string_view kBom = "\xef\xbb\xbf";  // a UTF-8 byte-order mark

// A JSON file read a chunk at a time: its lines as they come, or a whole array.
void stream_json(ByteReader& r, std::string_view key, const std::string& file, EntrySink sink) {
    std::string buf;
    bool more        = r.read_some(buf);
    const size_t bom = std::string_view(buf).starts_with(kBom) ? kBom.size() : 0;
    size_t first     = bom;  // the first character that is not whitespace
    for (;;) {
        while (first < buf.size() && is_space(buf[first])) ++first;
        if (first < buf.size() || !more) break;
        more = r.read_some(buf);
    }
    if (first < buf.size() && buf[first] == '[') {
        while (more) more = r.read_some(buf);
        take_json_array(std::string_view(buf).substr(first), key, file, sink);
        return;
    }
    size_t pos      = bom;
    int64_t line_no = 0;
    for (;;) {
        for (size_t nl; (nl = buf.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            take_json_line(std::string_view(buf).substr(pos, nl - pos), key, file, ++line_no, sink);
        }
        if (!more) break;
        buf.erase(0, pos);
        pos  = 0;
        more = r.read_some(buf);
    }
    if (pos < buf.size()) {
        take_json_line(std::string_view(buf).substr(pos), key, file, ++line_no, sink);
    }
}

// Whether the folder scan reads this file (symlinks and non-regular files are skipped before).
bool folder_reads(const std::string& name) {
    return !has_suffix(name, ".dat") && !has_suffix(name, ".u8");
}

int64_t mtime_ns(const fs::path& p, std::error_code& ec) {
    const auto t = std::chrono::file_clock::to_sys(fs::last_write_time(p, ec));  // since 1970
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

CorpusFile corpus_file(const fs::path& p, bool named) {
    std::error_code ec;
    CorpusFile f;
    f.path  = p.string();
    f.named = named;
    f.bytes = static_cast<int64_t>(fs::file_size(p, ec));
    if (!ec) f.mtime_ns = mtime_ns(p, ec);
    if (ec) input_error("{}: cannot read: {}", f.path, ec.message());
    return f;
}

}  // namespace

bool is_json_corpus_file(std::string_view path) {
    std::string_view name = path;
    if (has_suffix(name, ".gz")) name.remove_suffix(3);
    return has_suffix(name, ".jsonl") || has_suffix(name, ".ndjson") || has_suffix(name, ".json");
}

ByteReader::ByteReader(const std::string& path, std::string_view what) : path_(path), what_(what) {
    f_ = open_regular_file(path, what);
    std::error_code ec;
    file_size_ = static_cast<int64_t>(fs::file_size(path, ec));
    // a small file gets a small buffer (the reader is opened for every file of a corpus)
    in_.resize(static_cast<size_t>(std::clamp<int64_t>(file_size_ + 1, 4096, kChunk)));
    refill();
    gzip_ = starts_gzip(std::string_view(in_.data() + in_pos_, in_len_ - in_pos_));
    if (gzip_) {
        // 16 + MAX_WBITS: gzip framing only (header and CRC-32 checked)
        zs_ = std::make_unique<z_stream>();
        BGL_CHECK(inflateInit2(zs_.get(), 16 + MAX_WBITS) == Z_OK, "zlib: inflateInit2 failed");
    }
}

ByteReader::~ByteReader() {
    if (zs_) inflateEnd(zs_.get());
    if (f_ != nullptr) std::fclose(f_);
}

// Moves what is left of the input to the front and reads more after it.
void ByteReader::refill() {
    std::memmove(in_.data(), in_.data() + in_pos_, in_len_ - in_pos_);
    in_len_ -= in_pos_;
    in_pos_ = 0;
    while (!eof_ && in_len_ < in_.size()) {
        const size_t n = std::fread(in_.data() + in_len_, 1, in_.size() - in_len_, f_);
        in_len_ += n;
        if (n == 0) {
            if (std::ferror(f_)) input_error("{}: read error: {}", path_, std::strerror(errno));
            eof_ = true;
        }
    }
}

[[noreturn]] void ByteReader::gzip_error(const std::string& reason) const {
    input_error("{}: not valid gzip ({}): {}", path_, what_, reason);
}

bool ByteReader::read_some(std::string& out) {
    if (!gzip_) {
        if (in_pos_ == in_len_) refill();
        if (in_pos_ == in_len_) return false;
        out.append(in_.data() + in_pos_, in_len_ - in_pos_);
        in_pos_ = in_len_;
        return true;
    }
    if (done_) return false;
    const size_t before = out.size();
    char chunk[1 << 16];
    while (out.size() - before < kChunk) {
        if (in_pos_ == in_len_ && !eof_) refill();
        zs_->next_in       = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
        zs_->avail_in      = static_cast<uInt>(in_len_ - in_pos_);
        zs_->next_out      = reinterpret_cast<Bytef*>(chunk);
        zs_->avail_out     = sizeof chunk;
        const int rc       = inflate(zs_.get(), Z_NO_FLUSH);
        const size_t taken = (in_len_ - in_pos_) - zs_->avail_in;
        in_pos_ += taken;
        consumed_ += static_cast<int64_t>(taken);
        out.append(chunk, sizeof chunk - zs_->avail_out);
        if (rc == Z_STREAM_END) {
            if (in_len_ - in_pos_ < 2 && !eof_) refill();
            if (in_pos_ == in_len_) {
                done_ = true;
                break;
            }
            if (!starts_gzip(std::string_view(in_.data() + in_pos_, in_len_ - in_pos_))) {
                gzip_error(fmt::format("{} bytes after the gzip data that are not gzip",
                                       file_size_ - consumed_));
            }
            inflateReset(zs_.get());  // the next member
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && in_pos_ == in_len_ && eof_) {
            gzip_error("truncated (the gzip data ends early)");
        }
        if (rc == Z_BUF_ERROR) continue;  // more input to read
        gzip_error(zs_->msg != nullptr ? zs_->msg : fmt::format("zlib error {}", rc));
    }
    return out.size() > before || !done_;
}

std::string read_maybe_gzip(const std::string& path, std::string_view what) {
    ByteReader r(path, what);
    std::string out;
    while (r.read_some(out)) {
    }
    return out;
}

std::vector<CorpusFile> list_corpus_files(const std::vector<std::string>& paths) {
    std::vector<CorpusFile> files;
    for (const std::string& path : paths) {
        std::error_code ec;
        const fs::file_status st = fs::status(path, ec);
        if (st.type() == fs::file_type::not_found) {
            input_error("{}: no such file or folder (expected the corpus's text)", path);
        }
        if (ec) input_error("{}: cannot read: {}", path, ec.message());
        if (!fs::is_directory(st)) {
            files.push_back(corpus_file(path, /*named=*/true));
            continue;
        }
        std::vector<fs::path> found;
        for (const fs::directory_entry& de : fs::directory_iterator(path, ec)) {
            if (de.is_symlink() || !de.is_regular_file()) continue;
            if (folder_reads(de.path().filename().string())) found.push_back(de.path());
        }
        if (ec) input_error("{}: cannot list folder: {}", path, ec.message());
        std::sort(found.begin(), found.end());
        for (const fs::path& p : found) files.push_back(corpus_file(p, /*named=*/false));
    }
    return files;
}

void for_each_corpus_entry(const std::vector<CorpusFile>& files, std::string_view text_key,
                           FunctionRef<void(std::string&&)> fn) {
    for (const CorpusFile& f : files) {
        if (is_json_corpus_file(f.path)) {
            ByteReader r(f.path, "JSON Lines file");
            stream_json(r, text_key, f.path, fn);
            continue;
        }
        // fortune or plain text: read whole (the split depends on all of it)
        const std::string text = read_maybe_gzip(f.path, "corpus file");
        if (!is_utf8_text(text)) {
            if (!f.named) continue;  // a folder's binary files are not text
            input_error(
                "{}: not UTF-8 text (expected fortune or plain text, or JSON Lines named "
                "*.jsonl)",
                f.path);
        }
        for (std::string& e : split_fortune_text(strip_ansi_escapes(text))) fn(std::move(e));
    }
}

std::vector<std::string> read_corpus_entries(const std::vector<CorpusFile>& files,
                                             std::string_view text_key) {
    std::vector<std::string> entries;
    for_each_corpus_entry(files, text_key,
                          [&](std::string&& e) { entries.push_back(std::move(e)); });
    return entries;
}

}  // namespace bagualu::data

// Corpus reader (see corpus.h). gzip is inflated by zlib in memory; JSON is parsed by
// nlohmann::json a line at a time, so a JSON Lines file costs its bytes and its entries.
#include "data/corpus.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
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

// The entry of one JSON value; `where` is "FILE:LINE" or "FILE: element N".
void take_entry(const nlohmann::json& j, std::string_view key, const std::string& where,
                std::vector<std::string>& out) {
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
    const std::string& text = it->get_ref<const std::string&>();
    if (text.find('\0') != std::string::npos) {
        input_error("{}: field \"{}\" holds a NUL character (\\u0000), which is not text", where,
                    key);
    }
    if (!is_blank(text)) out.push_back(text);
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

std::string read_maybe_gzip(const std::string& path, std::string_view what) {
    std::string bytes = read_file_bytes(path, what);
    if (!starts_gzip(bytes)) return bytes;

    std::string out;
    z_stream zs{};
    // 16 + MAX_WBITS: gzip framing only (header and CRC-32 checked)
    BGL_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "zlib: inflateInit2 failed");
    zs.next_in  = reinterpret_cast<Bytef*>(bytes.data());
    size_t used = 0;  // input consumed by finished members
    std::string reason;
    char chunk[1 << 16];
    for (;;) {
        const size_t left = bytes.size() - used;
        zs.next_in        = reinterpret_cast<Bytef*>(bytes.data() + used);
        zs.avail_in       = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
        zs.next_out       = reinterpret_cast<Bytef*>(chunk);
        zs.avail_out      = sizeof chunk;
        const int rc      = inflate(&zs, Z_NO_FLUSH);
        out.append(chunk, sizeof chunk - zs.avail_out);
        used = static_cast<size_t>(reinterpret_cast<char*>(zs.next_in) - bytes.data());
        if (rc == Z_STREAM_END) {
            if (used == bytes.size()) break;
            if (!starts_gzip(std::string_view(bytes).substr(used))) {
                reason = fmt::format("{} bytes after the gzip data that are not gzip",
                                     bytes.size() - used);
                break;
            }
            inflateReset(&zs);  // the next member
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && used == bytes.size() && zs.avail_out != 0) {
            reason = "truncated (the gzip data ends early)";
        } else {
            reason = zs.msg != nullptr ? zs.msg : fmt::format("zlib error {}", rc);
        }
        break;
    }
    inflateEnd(&zs);
    if (!reason.empty()) input_error("{}: not valid gzip ({}): {}", path, what, reason);
    return out;
}

std::vector<std::string> split_json_entries(std::string_view text, std::string_view key,
                                            const std::string& file) {
    std::vector<std::string> out;
    const size_t bom = text.starts_with("\xef\xbb\xbf") ? 3 : 0;  // a UTF-8 byte-order mark
    size_t first     = bom;
    while (first < text.size() && is_space(text[first])) ++first;
    if (first < text.size() && text[first] == '[') {
        nlohmann::json arr;
        try {
            arr = nlohmann::json::parse(text.substr(first));
        } catch (const nlohmann::json::exception& e) {
            input_error("{}: not valid JSON: {}", file, json_reason(e));
        }
        for (size_t i = 0; i < arr.size(); ++i) {
            take_entry(arr[i], key, fmt::format("{}: element {}", file, i + 1), out);
        }
        return out;
    }
    size_t start = bom, line_no = 0;
    while (start < text.size()) {
        size_t nl = text.find('\n', start);
        if (nl == std::string_view::npos) nl = text.size();
        const std::string_view line = text.substr(start, nl - start);
        start                       = nl + 1;
        ++line_no;
        if (is_blank(line)) continue;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            input_error("{}:{}: not valid JSON ({}; expected one object a line)", file, line_no,
                        json_reason(e));
        }
        take_entry(j, key, fmt::format("{}:{}", file, line_no), out);
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

std::vector<std::string> read_corpus_entries(const std::vector<CorpusFile>& files,
                                             std::string_view text_key) {
    std::vector<std::string> entries;
    for (const CorpusFile& f : files) {
        const bool json        = is_json_corpus_file(f.path);
        const std::string text = read_maybe_gzip(f.path, json ? "JSON Lines" : "corpus text");
        if (json) {
            for (std::string& e : split_json_entries(text, text_key, f.path)) {
                entries.push_back(std::move(e));
            }
            continue;
        }
        if (!is_utf8_text(text)) {
            if (!f.named) continue;  // a folder's binary files are not text
            input_error(
                "{}: not UTF-8 text (expected fortune or plain text, or JSON Lines named "
                "*.jsonl)",
                f.path);
        }
        for (std::string& e : split_fortune_text(strip_ansi_escapes(text))) {
            entries.push_back(std::move(e));
        }
    }
    return entries;
}

}  // namespace bagualu::data

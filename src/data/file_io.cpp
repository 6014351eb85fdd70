// Whole-file reads and tmp+rename writes (see file_io.h). Plain stdio, so errno gives the
// reason for a failure; the .tmp file is removed when a write or rename fails. No fsync: a
// crash may lose the new file, but `path` always holds either the old or the new content.
#include "data/file_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace bagualu::data {

namespace fs = std::filesystem;

namespace {

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

std::FILE* open_regular_file(const std::string& path, std::string_view what) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) {
        input_error("{}: cannot open {}: no such file", path, what);
    }
    if (ec) input_error("{}: cannot open {}: {}", path, what, ec.message());
    if (fs::is_directory(st)) input_error("{}: is a directory, expected a {}", path, what);
    // A FIFO or device would block or never end: only regular files are read.
    if (!fs::is_regular_file(st))
        input_error("{}: is not a regular file, expected a {}", path, what);
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) input_error("{}: cannot open {}: {}", path, what, std::strerror(errno));
    return f;
}

std::string read_file_bytes(const std::string& path, std::string_view what) {
    FilePtr f(open_regular_file(path, what));
    std::string bytes;
    char buf[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) bytes.append(buf, n);
    if (std::ferror(f.get())) input_error("{}: read error: {}", path, std::strerror(errno));
    return bytes;
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    const std::string tmp = path + ".tmp";
    std::FILE* f          = std::fopen(tmp.c_str(), "wb");
    if (!f) input_error("{}: cannot write {}: {}", path, tmp, std::strerror(errno));
    const bool wrote      = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const int write_errno = errno;
    const bool closed     = std::fclose(f) == 0;
    if (!wrote || !closed) {
        const int err = wrote ? errno : write_errno;
        std::remove(tmp.c_str());
        input_error("{}: cannot write {}: {}", path, tmp, std::strerror(err));
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::remove(tmp.c_str());
        input_error("{}: cannot rename {} into place: {}", path, tmp, ec.message());
    }
}

void create_parent_dirs(const std::string& path) {
    const fs::path parent = fs::path(path).parent_path();
    if (parent.empty()) return;
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) input_error("{}: cannot create folder {}: {}", path, parent.string(), ec.message());
}

}  // namespace bagualu::data

// Memory-mapped token shards (see token_shards.h). POSIX mmap and glob; errno names the reason
// when a file cannot be opened or mapped.
#include "data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace bagualu::data {

namespace fs = std::filesystem;

std::vector<std::string> resolve_shard_paths(const std::string& spec, const std::string& key) {
    std::vector<std::string> paths;
    std::error_code ec;
    if (spec.find_first_of("*?[") != std::string::npos) {
        glob_t g{};
        const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
        if (rc == 0) {
            for (size_t i = 0; i < g.gl_pathc; ++i) {
                if (!fs::is_directory(g.gl_pathv[i], ec)) paths.emplace_back(g.gl_pathv[i]);
            }
        }
        globfree(&g);
        if (paths.empty()) input_error("{} = \"{}\": the pattern matches no file", key, spec);
    } else if (fs::is_directory(spec, ec)) {
        for (const auto& e : fs::directory_iterator(spec, ec)) {
            if (e.path().extension() == ".bin" && !e.is_directory(ec)) {
                paths.push_back(e.path().string());
            }
        }
        if (paths.empty()) input_error("{} = \"{}\": the directory holds no .bin file", key, spec);
    } else {
        paths.push_back(spec);
    }
    std::sort(paths.begin(), paths.end());
    return paths;
}

TokenShards::~TokenShards() { release(); }

TokenShards::TokenShards(TokenShards&& o) noexcept
    : shards_(std::move(o.shards_)), T_(o.T_), n_windows_(o.n_windows_), n_tokens_(o.n_tokens_) {
    o.shards_.clear();
    o.n_windows_ = o.n_tokens_ = 0;
}

TokenShards& TokenShards::operator=(TokenShards&& o) noexcept {
    if (this != &o) {
        release();
        shards_    = std::move(o.shards_);
        T_         = o.T_;
        n_windows_ = o.n_windows_;
        n_tokens_  = o.n_tokens_;
        o.shards_.clear();
        o.n_windows_ = o.n_tokens_ = 0;
    }
    return *this;
}

void TokenShards::release() {
    for (Shard& s : shards_) {
        if (s.map != nullptr) ::munmap(const_cast<char*>(s.map), s.map_bytes);
    }
    shards_.clear();
}

namespace {

// Maps `path` read-only; returns null for an empty file. Throws InputError naming the path.
const char* map_file(const std::string& path, size_t* bytes) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) {
        input_error("{}: cannot open token file: no such file", path);
    }
    if (fs::is_directory(st)) input_error("{}: is a directory, expected a token file", path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) input_error("{}: cannot open token file: {}", path, std::strerror(errno));
    struct stat sb {};
    if (::fstat(fd, &sb) != 0) {
        const int err = errno;
        ::close(fd);
        input_error("{}: cannot stat token file: {}", path, std::strerror(err));
    }
    *bytes = static_cast<size_t>(sb.st_size);
    if (*bytes == 0) {
        ::close(fd);
        return nullptr;
    }
    void* p       = ::mmap(nullptr, *bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file open
    if (p == MAP_FAILED) input_error("{}: cannot map token file: {}", path, std::strerror(err));
    return static_cast<const char*>(p);
}

}  // namespace

TokenShards TokenShards::open(const std::string& spec, const std::string& key, int vocab_size,
                              int seq_len) {
    BGL_CHECK(vocab_size > 0 && seq_len > 0, "vocab_size {} seq_len {}", vocab_size, seq_len);
    TokenShards out;
    out.T_ = seq_len;
    for (const std::string& path : resolve_shard_paths(spec, key)) {
        Shard& s = out.shards_.emplace_back();
        s.path   = path;
        s.map    = map_file(path, &s.map_bytes);
        s.layout = check_token_header(path, s.map, static_cast<int64_t>(s.map_bytes));
        check_token_ids(path, s.map + kTokenFileHeaderBytes, s.layout, vocab_size);
        // Validation touched every page; training reads a window at a time.
        ::madvise(const_cast<char*>(s.map), s.map_bytes, MADV_DONTNEED);
        s.first_window = out.n_windows_;
        s.windows      = s.layout.count > 0 ? (s.layout.count - 1) / seq_len : 0;
        out.n_windows_ += s.windows;
        out.n_tokens_ += s.layout.count;
    }
    if (out.n_windows_ == 0) {
        if (out.shards_.size() == 1) {
            input_error("{}: {} tokens, fewer than model.seq_len + 1 = {} (one training window)",
                        out.shards_[0].path, out.n_tokens_, seq_len + 1);
        }
        input_error(
            "{} = \"{}\": {} files of {} tokens in all hold no window of model.seq_len + 1 "
            "= {} tokens",
            key, spec, out.shards_.size(), out.n_tokens_, seq_len + 1);
    }
    return out;
}

void TokenShards::read_window(int64_t w, int32_t* out) const {
    BGL_CHECK(w >= 0 && w < n_windows_, "window {} of {}", w, n_windows_);
    // The last shard whose first window is <= w (shards without windows are never chosen).
    const auto it  = std::upper_bound(shards_.begin(), shards_.end(), w,
                                      [](int64_t v, const Shard& s) { return v < s.first_window; });
    const Shard& s = *(it - 1);
    const char* p  = s.map + kTokenFileHeaderBytes + (w - s.first_window) * T_ * s.layout.width;
    if (s.layout.width == 2) {
        for (int i = 0; i <= T_; ++i) {
            uint16_t t;
            std::memcpy(&t, p + 2 * i, 2);
            out[i] = t;
        }
    } else {
        for (int i = 0; i <= T_; ++i) {
            uint32_t t;
            std::memcpy(&t, p + 4 * i, 4);
            out[i] = static_cast<int32_t>(t);
        }
    }
}

}  // namespace bagualu::data

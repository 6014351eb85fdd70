// Token shards read with pread (see token_shards.h). POSIX open/pread and glob; errno names the
// reason when a file cannot be opened or read.
#include "data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
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
    : shards_(std::move(o.shards_)),
      T_(o.T_),
      vocab_size_(o.vocab_size_),
      n_windows_(o.n_windows_),
      n_tokens_(o.n_tokens_) {
    o.shards_.clear();
    o.n_windows_ = o.n_tokens_ = 0;
}

TokenShards& TokenShards::operator=(TokenShards&& o) noexcept {
    if (this != &o) {
        release();
        shards_     = std::move(o.shards_);
        T_          = o.T_;
        vocab_size_ = o.vocab_size_;
        n_windows_  = o.n_windows_;
        n_tokens_   = o.n_tokens_;
        o.shards_.clear();
        o.n_windows_ = o.n_tokens_ = 0;
    }
    return *this;
}

void TokenShards::release() {
    for (Shard& s : shards_) {
        if (s.fd >= 0) ::close(s.fd);
    }
    shards_.clear();
}

namespace {

const char* file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

// Opens `path` read-only; refuses what is not a regular file before opening it (opening a FIFO
// blocks until a writer comes) and again after (O_NONBLOCK: a FIFO swapped in between does not
// block either). Throws InputError naming the path.
int open_shard(const std::string& path, int64_t* bytes) {
    struct stat sb {};
    if (::stat(path.c_str(), &sb) != 0) {
        if (errno == ENOENT) input_error("{}: cannot open token file: no such file", path);
        input_error("{}: cannot open token file: {}", path, std::strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) input_error("{}: is a directory, expected a token file", path);
    if (!S_ISREG(sb.st_mode)) {
        input_error("{}: is {}, expected a regular token file", path, file_kind(sb.st_mode));
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) input_error("{}: cannot open token file: {}", path, std::strerror(errno));
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ::close(fd);
        input_error("{}: changed while being opened; expected a regular token file", path);
    }
    *bytes = static_cast<int64_t>(sb.st_size);
    return fd;
}

// Reads n bytes at offset; returns the bytes read (fewer only at end of file). Throws
// InputError naming the path on a read error.
int64_t pread_full(int fd, const std::string& path, char* out, int64_t n, int64_t offset) {
    int64_t got = 0;
    while (got < n) {
        const ssize_t r = ::pread(fd, out + got, static_cast<size_t>(n - got), offset + got);
        if (r < 0) {
            if (errno == EINTR) continue;
            input_error("{}: read error: {}", path, std::strerror(errno));
        }
        if (r == 0) break;
        got += r;
    }
    return got;
}

// The header of an open shard, checked against its size.
TokenFileLayout read_shard_header(int fd, const std::string& path, int64_t bytes) {
    char header[kTokenFileHeaderBytes] = {};
    const int64_t got = pread_full(fd, path, header, std::min(bytes, kTokenFileHeaderBytes), 0);
    const TokenFileLayout layout = check_token_header(path, header, std::max(got, bytes));
    if (got < std::min(bytes, kTokenFileHeaderBytes)) {
        input_error("{}: shrank to {} bytes while being read", path, got);
    }
    return layout;
}

// The ids of the first `tokens` tokens of an open shard, read in chunks; counted into
// `counts` (vocab_size entries) when given.
void check_shard_ids(int fd, const std::string& path, const TokenFileLayout& layout, int64_t tokens,
                     int vocab_size, std::vector<int64_t>* counts) {
    constexpr int64_t kChunkTokens = int64_t{1} << 18;
    // no larger than the ids checked: a small split's check allocates (and touches) no more
    std::vector<char> chunk(static_cast<size_t>(std::min(kChunkTokens, tokens) * layout.width));
    for (int64_t first = 0; first < tokens; first += kChunkTokens) {
        const int64_t n    = std::min(kChunkTokens, tokens - first);
        const int64_t want = n * layout.width;
        if (pread_full(fd, path, chunk.data(), want,
                       kTokenFileHeaderBytes + first * layout.width) != want) {
            input_error("{}: shrank while being read (header says {} tokens)", path, layout.count);
        }
        TokenFileLayout part = layout;
        part.count           = n;
        check_token_ids(path, chunk.data(), part, vocab_size, first, counts);
    }
}

}  // namespace

TokenShards TokenShards::open(const std::string& spec, const std::string& key, int vocab_size,
                              int seq_len, bool check_ids, std::vector<int64_t>* id_counts) {
    BGL_CHECK(vocab_size > 0 && seq_len > 0, "vocab_size {} seq_len {}", vocab_size, seq_len);
    TokenShards out;
    out.T_          = seq_len;
    out.vocab_size_ = vocab_size;
    for (const std::string& path : resolve_shard_paths(spec, key)) {
        Shard& s       = out.shards_.emplace_back();
        s.path         = path;
        int64_t bytes  = 0;
        s.fd           = open_shard(path, &bytes);
        s.layout       = read_shard_header(s.fd, path, bytes);
        s.first_window = out.n_windows_;
        s.windows      = windows_in(s.layout.count, seq_len);
        out.n_windows_ += s.windows;
        out.n_tokens_ += s.layout.count;
    }
    if (id_counts) id_counts->clear();
    if (check_ids) {
        const bool whole             = out.n_tokens_ <= kScanAllTokens;
        std::vector<int64_t>* counts = whole ? id_counts : nullptr;
        if (counts) counts->assign(static_cast<size_t>(vocab_size), 0);
        for (Shard& s : out.shards_) {
            s.checked = whole ? s.layout.count : std::min(s.layout.count, kScanHeadTokens);
            check_shard_ids(s.fd, s.path, s.layout, s.checked, vocab_size, counts);
        }
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
    const auto before   = [](int64_t v, const Shard& sh) { return v < sh.first_window; };
    const auto it       = std::upper_bound(shards_.begin(), shards_.end(), w, before);
    const Shard& s      = *(it - 1);
    const int64_t first = (w - s.first_window) * T_;  // the window's first token in the file
    const int64_t want  = static_cast<int64_t>(T_ + 1) * s.layout.width;
    // out holds 4 (T + 1) bytes, enough for either width: read in place, then widen.
    char* bytes = reinterpret_cast<char*>(out);
    const int64_t got =
        pread_full(s.fd, s.path, bytes, want, kTokenFileHeaderBytes + first * s.layout.width);
    if (got != want) {
        struct stat sb {};
        const int64_t now = ::fstat(s.fd, &sb) == 0 ? static_cast<int64_t>(sb.st_size) : -1;
        input_error(
            "{}: now holds {} bytes, {} when the run started: the token file was truncated while "
            "training read it",
            s.path, now, kTokenFileHeaderBytes + s.layout.count * s.layout.width);
    }
    const auto limit = static_cast<uint32_t>(vocab_size_);
    uint32_t bad     = 0;
    int at           = -1;
    if (s.layout.width == 2) {
        // Backwards, so that no uint16 is overwritten before it is widened (4 i >= 2 i).
        for (int i = T_; i >= 0; --i) {
            uint16_t t;
            std::memcpy(&t, bytes + 2 * i, 2);
            if (t >= limit) [[unlikely]] {
                bad = t;
                at  = i;
            }
            out[i] = t;
        }
    } else {
        for (int i = T_; i >= 0; --i) {
            uint32_t t;
            std::memcpy(&t, bytes + 4 * i, 4);
            if (t >= limit) [[unlikely]] {
                bad = t;
                at  = i;
            }
            out[i] = static_cast<int32_t>(t);
        }
    }
    if (at >= 0) [[unlikely]] {
        if (first + at < s.checked) {
            input_error(
                "{}: token {} at position {} is >= vocab_size {}: the token file changed after "
                "it was checked at start-up",
                s.path, bad, first + at, vocab_size_);
        }
        input_error(
            "{}: token {} at position {} is >= vocab_size {}: the file was written for another "
            "vocabulary, or changed since the run started",
            s.path, bad, first + at, vocab_size_);
    }
}

}  // namespace bagualu::data

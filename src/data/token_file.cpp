// llm.c token shard reader/writer (see token_file.h). The header and tokens are stored
// little-endian; the code assumes a little-endian host and says so at compile time.
// read_token_file reads a file whole; token_shards.h maps them instead (the data loader).
#include "data/token_file.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "data/file_io.h"

namespace bagualu::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

template <typename T>
void append_tokens(std::string& bytes, std::span<const int32_t> tokens) {
    const size_t offset = bytes.size();
    bytes.resize(offset + tokens.size() * sizeof(T));
    char* out = bytes.data() + offset;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const T t = static_cast<T>(tokens[i]);
        std::memcpy(out + i * sizeof(T), &t, sizeof(T));
    }
}

template <typename T>
void decode_tokens(std::vector<int32_t>& out, const char* in, int64_t count) {
    out.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
        T t;
        std::memcpy(&t, in + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        out[static_cast<size_t>(i)] = static_cast<int32_t>(t);
    }
}

}  // namespace

void write_token_file(const std::string& path, std::span<const int32_t> tokens, int vocab_size) {
    if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        input_error("{}: {} tokens exceed the shard format's limit of {} per file", path,
                    tokens.size(), std::numeric_limits<int32_t>::max());
    }
    TokenFileWriter w(path, vocab_size);
    w.append(tokens);
    w.finish();
}

TokenFileWriter::TokenFileWriter(std::string path, int vocab_size)
    : path_(std::move(path)),
      tmp_(path_ + ".tmp"),
      vocab_size_(vocab_size),
      version_(vocab_size <= 65536 ? 1 : 2) {
    BGL_CHECK(vocab_size > 0, "vocab_size {} for {}", vocab_size, path_);
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (f_ == nullptr) fail("write");
    const int32_t header[kTokenFileHeaderInts] = {};  // the count comes with finish
    if (std::fwrite(header, sizeof header, 1, f_) != 1) fail("write");
}

TokenFileWriter::~TokenFileWriter() {
    if (f_ != nullptr) {
        std::fclose(f_);
        std::remove(tmp_.c_str());
    }
}

void TokenFileWriter::fail(const char* doing) const {
    const int err = errno;
    input_error("{}: cannot {} {}: {}", path_, doing, tmp_, std::strerror(err));
}

void TokenFileWriter::append(std::span<const int32_t> tokens) {
    BGL_CHECK(f_ != nullptr, "{}: append after finish", path_);
    if (count_ + static_cast<int64_t>(tokens.size()) > std::numeric_limits<int32_t>::max()) {
        input_error("{}: more than {} tokens, the shard format's limit per file", path_,
                    std::numeric_limits<int32_t>::max());
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
        BGL_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
                  "{}: token {} at position {} outside [0, {})", path_, tokens[i],
                  count_ + static_cast<int64_t>(i), vocab_size_);
    }
    buf_.clear();
    if (version_ == 1) {
        append_tokens<uint16_t>(buf_, tokens);
    } else {
        append_tokens<uint32_t>(buf_, tokens);
    }
    if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) fail("write");
    count_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::finish() {
    BGL_CHECK(f_ != nullptr, "{}: finish twice", path_);
    const int32_t head[3] = {kTokenFileMagic, version_, static_cast<int32_t>(count_)};
    if (std::fseek(f_, 0, SEEK_SET) != 0 || std::fwrite(head, sizeof head, 1, f_) != 1) {
        fail("write");
    }
    std::FILE* f = f_;
    f_           = nullptr;
    if (std::fclose(f) != 0) {
        const int err = errno;
        std::remove(tmp_.c_str());
        input_error("{}: cannot write {}: {}", path_, tmp_, std::strerror(err));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp_.c_str());
        input_error("{}: cannot rename {} into place: {}", path_, tmp_, std::strerror(err));
    }
}

TokenFileLayout check_token_header(const std::string& path, const char* bytes, int64_t size) {
    if (size < kTokenFileHeaderBytes) {
        input_error("{}: file has {} bytes, less than the {}-byte header: not a token shard", path,
                    size, kTokenFileHeaderBytes);
    }
    int32_t header[kTokenFileHeaderInts];
    std::memcpy(header, bytes, sizeof(header));
    if (header[0] != kTokenFileMagic) {
        input_error("{}: bad magic {} (expected {}): not a token shard", path, header[0],
                    kTokenFileMagic);
    }
    const int version = header[1];
    if (version != 1 && version != 2) {
        input_error("{}: unsupported version {} (expected 1 = uint16 tokens or 2 = uint32 tokens)",
                    path, version);
    }
    const int64_t count = header[2];
    if (count < 0) input_error("{}: bad token count {} in header", path, count);
    const int width        = version == 1 ? 2 : 4;
    const int64_t expected = kTokenFileHeaderBytes + count * width;
    if (size < expected) {
        input_error("{}: truncated: header says {} tokens ({} bytes) but file has {} bytes", path,
                    count, expected, size);
    }
    if (size > expected) {
        input_error("{}: header says {} tokens ({} bytes) but file has {} bytes (trailing data)",
                    path, count, expected, size);
    }
    return TokenFileLayout{version, count, width};
}

namespace {

template <typename T>
void check_ids(const std::string& path, const char* body, int64_t count, int vocab_size,
               int64_t first, std::vector<int64_t>* counts) {
    const auto limit = static_cast<uint32_t>(vocab_size);
    for (int64_t i = 0; i < count; ++i) {
        T t;
        std::memcpy(&t, body + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        // A uint32 id above INT32_MAX would read back negative as int32; compare as unsigned.
        if (static_cast<uint32_t>(t) >= limit) [[unlikely]] {
            input_error(
                "{}: token {} at position {} is >= vocab_size {} (data and model vocab "
                "disagree)",
                path, static_cast<uint32_t>(t), first + i, vocab_size);
        }
        if (counts) ++(*counts)[static_cast<size_t>(t)];
    }
}

}  // namespace

void check_token_ids(const std::string& path, const char* body, const TokenFileLayout& layout,
                     int vocab_size, int64_t first, std::vector<int64_t>* counts) {
    BGL_CHECK(!counts || counts->size() == static_cast<size_t>(vocab_size),
              "{} counts for a vocabulary of {}", counts ? counts->size() : 0, vocab_size);
    if (layout.version == 1) {
        check_ids<uint16_t>(path, body, layout.count, vocab_size, first, counts);
    } else {
        check_ids<uint32_t>(path, body, layout.count, vocab_size, first, counts);
    }
}

TokenFile read_token_file(const std::string& path, int vocab_size) {
    BGL_CHECK(vocab_size > 0, "vocab_size {} for {}", vocab_size, path);
    const std::string bytes = read_file_bytes(path, "token file");
    const TokenFileLayout layout =
        check_token_header(path, bytes.data(), static_cast<int64_t>(bytes.size()));
    const char* body = bytes.data() + kTokenFileHeaderBytes;
    check_token_ids(path, body, layout, vocab_size);
    TokenFile out;
    out.version = layout.version;
    if (layout.version == 1) {
        decode_tokens<uint16_t>(out.tokens, body, layout.count);
    } else {
        decode_tokens<uint32_t>(out.tokens, body, layout.count);
    }
    return out;
}

}  // namespace bagualu::data

// Token shards in the llm.c / nanoGPT format: a header of 256 little-endian int32
//   [0] magic 20240520, [1] version (1: uint16 tokens, 2: uint32 tokens), [2] token count, rest 0
// followed by the tokens. Reading validates everything a corrupt or mismatched shard can get
// wrong (magic, version, size, token ids vs the model's vocab) and reports it as an InputError.
// Streaming readers and per-rank offsets live in the data loader, not here.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace bagualu::data {

inline constexpr int32_t kTokenFileMagic       = 20240520;
inline constexpr int kTokenFileHeaderInts      = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// Writes `tokens` (each in [0, vocab_size)) to `path` through `path + ".tmp"` and a rename.
// Version 1 (uint16) when vocab_size <= 65536, else version 2 (uint32).
void write_token_file(const std::string& path, std::span<const int32_t> tokens, int vocab_size);

// write_token_file a piece at a time: tokens are appended to `path + ".tmp"` (header first,
// its count filled in by finish), renamed over `path` by finish; a writer destroyed before
// finish removes the .tmp file. At most 2^31 - 1 tokens.
class TokenFileWriter {
   public:
    TokenFileWriter(std::string path, int vocab_size);
    ~TokenFileWriter();
    TokenFileWriter(const TokenFileWriter&)            = delete;
    TokenFileWriter& operator=(const TokenFileWriter&) = delete;
    void append(std::span<const int32_t> tokens);
    void finish();

   private:
    void fail(const char* doing) const;
    std::string path_, tmp_;
    int vocab_size_, version_;
    std::FILE* f_  = nullptr;
    int64_t count_ = 0;
    std::string buf_;
};

struct TokenFile {
    std::vector<int32_t> tokens;
    int version;
};

// Reads and validates a shard; every token must be < vocab_size.
TokenFile read_token_file(const std::string& path, int vocab_size);

// What a valid header says; `bytes` (the whole file, `size` bytes) must match it exactly.
struct TokenFileLayout {
    int version   = 1;
    int64_t count = 0;  // tokens
    int width     = 2;  // bytes per token
};
// Validates magic, version and the file size against the header; throws InputError naming path.
TokenFileLayout check_token_header(const std::string& path, const char* bytes, int64_t size);
// Throws InputError naming path and position when a token of `body` (count tokens of width
// bytes each, as in `layout`) is >= vocab_size. `first` is the position of body's first token in
// the file (for the message, when body is one chunk of it). counts: when given (vocab_size
// entries), each id is counted into it as it is checked.
void check_token_ids(const std::string& path, const char* body, const TokenFileLayout& layout,
                     int vocab_size, int64_t first = 0, std::vector<int64_t>* counts = nullptr);

}  // namespace bagualu::data

// One split of the token data as training reads it: a set of llm.c token shards (token_file.h),
// each kept open read-only. The split is named by one .bin file, a glob pattern
// ("data/x/train_*.bin") or a directory (every *.bin in it); files are taken in sorted order.
// Opening refuses anything but regular files (a FIFO would block) and validates each file like
// read_token_file (header, size, every token id < vocab_size), reading it in chunks. A split of
// more than kScanAllTokens tokens is not read whole at start-up (2^28 tokens are 0.5-1 GiB, and
// every reading rank would read it at every start): its headers and sizes are checked, and the
// first kScanHeadTokens ids of each file (a file written for another vocabulary shows it at
// once); every other id is checked as its window is read, below. The training loader has rank 0
// alone check the ids at start-up, for every rank (data/loader.h).
// A file may change while a run reads it (overwritten in place, truncated): every window is
// read with pread, never through a mapping (a truncated mapping raises SIGBUS, which no caller
// could turn into an error message), and its token ids are checked again as it is read, so a
// shard that shrank or now holds an id >= vocab_size ends the run with an InputError naming it
// instead of reading or writing out of bounds. A file replaced by a rename is not seen: the
// open descriptor keeps the file that was validated.
// Windows: a shard of n tokens holds floor((n - 1) / T) windows of T + 1 tokens starting at
// k * T (inputs = first T, targets = last T); windows never cross a shard boundary. Window ids
// run over the shards in order, so one file gives the same ids as the whole-file reader did.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace bagualu::data {

// Windows of T + 1 tokens a shard of n tokens holds.
inline int64_t windows_in(int64_t n_tokens, int T) { return n_tokens > 0 ? (n_tokens - 1) / T : 0; }

inline constexpr int64_t kScanAllTokens  = int64_t{1} << 28;
inline constexpr int64_t kScanHeadTokens = int64_t{1} << 16;

class TokenShards {
   public:
    TokenShards() = default;  // no shards, no windows
    ~TokenShards();
    TokenShards(TokenShards&& o) noexcept;
    TokenShards& operator=(TokenShards&& o) noexcept;
    TokenShards(const TokenShards&)            = delete;
    TokenShards& operator=(const TokenShards&) = delete;

    // `key` is the config key that named `spec` ("data.train"), for errors. Throws InputError
    // naming the file at fault, or the spec when it matches nothing or holds no window.
    // check_ids = false: headers and sizes only (where another rank checks the ids for all).
    // id_counts: when given, set to the count of each id 0..vocab_size-1 over the whole split
    // where the check read every id (a split of up to kScanAllTokens), else left empty.
    static TokenShards open(const std::string& spec, const std::string& key, int vocab_size,
                            int seq_len, bool check_ids = true,
                            std::vector<int64_t>* id_counts = nullptr);

    int64_t num_windows() const { return n_windows_; }
    int64_t num_tokens() const { return n_tokens_; }
    int seq_len() const { return T_; }
    size_t num_shards() const { return shards_.size(); }
    const std::string& path(size_t i) const { return shards_[i].path; }
    // Windows of shard i.
    int64_t shard_windows(size_t i) const { return shards_[i].windows; }

    // Copies the T + 1 tokens of window w (0 <= w < num_windows()) to out. Throws InputError
    // naming the file when it has shrunk or a token id is >= vocab_size (it changed since open).
    // Thread-safe (pread).
    void read_window(int64_t w, int32_t* out) const;

   private:
    struct Shard {
        std::string path;
        int fd = -1;  // open read-only while the shards live
        TokenFileLayout layout;
        int64_t first_window = 0;  // id of its first window
        int64_t windows      = 0;
        int64_t checked      = 0;  // tokens whose ids open() checked (from the first)
    };
    void release();

    std::vector<Shard> shards_;
    int T_             = 0;
    int vocab_size_    = 0;
    int64_t n_windows_ = 0;
    int64_t n_tokens_  = 0;
};

// The files a split names, sorted: `spec` itself when it is a file, the *.bin files in it when
// it is a directory, its matches when it holds a glob character (* ? [). Throws InputError
// naming key and spec when a directory or pattern matches no file.
std::vector<std::string> resolve_shard_paths(const std::string& spec, const std::string& key);

}  // namespace bagualu::data

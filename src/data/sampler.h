// Which sequences of a token array a training step reads.
// The train split is cut into n = (tokens - 1) / T non-overlapping windows of T+1 tokens
// (inputs = first T, targets = last T). Every epoch visits all windows once, in an order that
// is a pure function of (seed, epoch): a Fisher-Yates shuffle driven by Rng(seed, epoch).
// The cursor (epoch, position) is all the state there is, so a run can resume exactly.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace bagualu::data {

struct SamplerCursor {
    int64_t epoch    = 0;
    int64_t position = 0;  // windows already taken in this epoch
};

class SequenceSampler {
   public:
    SequenceSampler(std::span<const int32_t> tokens, int seq_len, uint64_t seed);
    int64_t num_windows() const { return n_windows_; }
    // Fills inputs and targets (B, T) with the next B windows; crosses epoch boundaries.
    void next_batch(int32_t* inputs, int32_t* targets, int B);
    const SamplerCursor& cursor() const { return cursor_; }
    void                 set_cursor(const SamplerCursor& c);

   private:
    void shuffle_epoch();

    std::span<const int32_t> tokens_;
    int                      T_;
    uint64_t                 seed_;
    int64_t                  n_windows_;
    SamplerCursor            cursor_;
    std::vector<int64_t>     order_;  // [n_windows] window index in visiting order
};

// Fills (B, T) inputs/targets with windows first_window .. first_window+B-1 in file order
// (the deterministic validation batches).
void sequential_batch(std::span<const int32_t> tokens, int seq_len, int64_t first_window, int B,
                      int32_t* inputs, int32_t* targets);

}  // namespace bagualu::data

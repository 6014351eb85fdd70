// Which windows of the train split a training step reads (windows: token_shards.h).
// Every epoch visits all n windows once, in an order that is a pure function of (seed, epoch):
// a Fisher-Yates shuffle driven by Rng(seed, epoch). The cursor (epoch, position) is all the
// state there is, so a run can resume exactly. An epoch ends lazily: after its last window the
// cursor reads (epoch, n) until the next window is taken as (epoch + 1, 0).
#pragma once
#include <cstdint>
#include <vector>

namespace bagualu::data {

struct SamplerCursor {
    int64_t epoch    = 0;
    int64_t position = 0;  // windows already taken in this epoch

    bool operator==(const SamplerCursor&) const = default;
};

class SequenceSampler {
   public:
    SequenceSampler(int64_t n_windows, uint64_t seed);
    int64_t num_windows() const { return n_windows_; }
    // The id of the next window; crosses epoch boundaries.
    int64_t next();
    // Passes over n windows (another rank's share) without reading them.
    void skip(int64_t n);
    const SamplerCursor& cursor() const { return cursor_; }
    void set_cursor(const SamplerCursor& c);

   private:
    void shuffle_epoch();
    void start_next_epoch_if_done();

    uint64_t seed_;
    int64_t n_windows_;
    SamplerCursor cursor_;
    std::vector<int64_t> order_;  // [n_windows] window id in visiting order
};

// The cursor of a sampler over n_windows windows at c after taking k more (no shuffle needed).
SamplerCursor advance_cursor(SamplerCursor c, int64_t n_windows, int64_t k);

}  // namespace bagualu::data

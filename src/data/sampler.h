// Which windows of the train split a training step reads (windows: token_shards.h).
// Every epoch visits all n windows once, in an order that is a pure function of (seed, epoch,
// n). The cursor (epoch, position) is all the state there is, so a run can resume exactly. An
// epoch ends lazily: after its last window the cursor reads (epoch, n) until the next window is
// taken as (epoch + 1, 0).
// Two ways to draw an epoch's order, chosen by n alone (shuffle_kind_for), so every rank, every
// resume and every number of ranks draws the same:
// - exact (n <= kExactShuffleWindows): a Fisher-Yates shuffle driven by Rng(seed, epoch), held as
//   a table of n window ids (at most 32 MiB);
// - keyed (larger n): a keyed bijection of [0, n) (WindowPermutation), evaluated at each position:
//   no table, nothing to compute at an epoch's start. A corpus of 10^12 tokens in windows of 2,049
//   is 4.9 x 10^8 windows, whose table would take 3.9 GB on every rank that reads and seconds of
//   random swaps at each epoch.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace bagualu::data {

struct SamplerCursor {
    int64_t epoch    = 0;
    int64_t position = 0;  // windows already taken in this epoch

    bool operator==(const SamplerCursor&) const = default;
};

enum class ShuffleKind { exact, keyed };
inline constexpr int64_t kExactShuffleWindows = int64_t{1} << 22;
inline ShuffleKind shuffle_kind_for(int64_t n_windows) {
    return n_windows <= kExactShuffleWindows ? ShuffleKind::exact : ShuffleKind::keyed;
}
const char* shuffle_kind_name(ShuffleKind k);

// A bijection of [0, n) keyed by 64 bits: a balanced Feistel network of kRounds rounds over 2h
// bits (the least h with 4^h >= n, h >= 1), whose round function is a 64-bit mixer of the half
// and a round key, cycle-walked into [0, n) (a value >= n is permuted again until it falls
// inside, on average fewer than 4 times since 4^h < 4n). Any n up to 2^62.
class WindowPermutation {
   public:
    static constexpr int kRounds = 6;
    WindowPermutation()          = default;
    WindowPermutation(uint64_t n, uint64_t key);
    uint64_t size() const { return n_; }
    uint64_t operator()(uint64_t i) const;  // i < size()

   private:
    uint64_t feistel(uint64_t x) const;
    uint64_t n_    = 0;
    int half_bits_ = 1;
    uint64_t mask_ = 1;
    std::array<uint64_t, kRounds> keys_{};
};

class SequenceSampler {
   public:
    SequenceSampler(int64_t n_windows, uint64_t seed)
        : SequenceSampler(n_windows, seed, shuffle_kind_for(n_windows)) {}
    // A kind other than shuffle_kind_for(n_windows) is for tests.
    SequenceSampler(int64_t n_windows, uint64_t seed, ShuffleKind kind);
    int64_t num_windows() const { return n_windows_; }
    ShuffleKind kind() const { return kind_; }
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
    ShuffleKind kind_;
    SamplerCursor cursor_;
    std::vector<int64_t> order_;  // exact: [n_windows] window id in visiting order
    WindowPermutation perm_;      // keyed: this epoch's order
};

// The cursor of a sampler over n_windows windows at c after taking k more (no shuffle needed).
SamplerCursor advance_cursor(SamplerCursor c, int64_t n_windows, int64_t k);

// ---- blends (data.blend) ----
// Training may read several splits ("sources") in fixed proportions p_i (data.blend_weights,
// normalised). Source s's windows come in its own order: a SequenceSampler over its windows with
// the seed source_seed(seed, s). Which source each window of the global order comes from is the
// smooth weighted round robin: every source keeps a deficit e_i (its share of the windows taken
// so far minus the windows it gave); each window adds p_i to every e_i, then the source with the
// largest e_i (the first on ties) gives the window and its e_i falls by 1. After j windows every
// source has given p_i j windows to within one, at every j: no stretch of the order drifts from
// the proportions, and the state is the deficits alone, so new weights on a resumed run take
// effect from the next window without a burst that would repay the past.
uint64_t source_seed(uint64_t seed, int source);

// The position in the global order: each source's cursor and, in a blend, the deficits. One
// source (no blend) has no deficits.
struct OrderCursor {
    OrderCursor() = default;
    OrderCursor(const SamplerCursor& one) : sources{one} {}  // NOLINT: one source, implicitly
    OrderCursor(std::vector<SamplerCursor> s, std::vector<double> d)
        : sources(std::move(s)), deficits(std::move(d)) {}

    std::vector<SamplerCursor> sources;
    std::vector<double> deficits;

    bool operator==(const OrderCursor&) const = default;
};

class BlendSchedule {
   public:
    BlendSchedule() = default;  // one source
    // weights: one per source, finite and > 0 (normalised here); empty: one source
    explicit BlendSchedule(const std::vector<double>& weights);
    int sources() const { return p_.empty() ? 1 : static_cast<int>(p_.size()); }
    double share(int s) const { return p_.empty() ? 1.0 : p_[static_cast<std::size_t>(s)]; }
    // The source of the next window; updates the deficits (sources() of them in a blend).
    int next(std::vector<double>& deficits) const;
    // The cursor of a fresh order.
    OrderCursor start() const;
    // The cursor after k more windows, with windows[s] windows in source s (no shuffle needed).
    OrderCursor advance(OrderCursor c, const std::vector<int64_t>& windows, int64_t k) const;

   private:
    std::vector<double> p_;
};

}  // namespace bagualu::data

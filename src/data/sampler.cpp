#include "data/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace bagualu::data {

const char* shuffle_kind_name(ShuffleKind k) { return k == ShuffleKind::exact ? "exact" : "keyed"; }

namespace {
// The finaliser of MurmurHash3: every input bit moves every output bit (avalanche).
uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
    z = (z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53ull;
    return z ^ (z >> 33);
}
}  // namespace

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n) {
    BGL_CHECK(n > 0 && n <= (uint64_t{1} << 62), "a permutation of {} values", n);
    const int bits = std::max(2, static_cast<int>(std::bit_width(n - 1)));
    half_bits_     = (bits + 1) / 2;
    mask_          = (uint64_t{1} << half_bits_) - 1;
    uint64_t x     = key;
    for (uint64_t& k : keys_) k = splitmix64(x);
}

uint64_t WindowPermutation::feistel(uint64_t x) const {
    uint64_t l = x >> half_bits_, r = x & mask_;
    for (const uint64_t k : keys_) {
        const uint64_t f = mix64(r ^ k) & mask_;
        l                = std::exchange(r, l ^ f);
    }
    return (l << half_bits_) | r;
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
    BGL_CHECK(i < n_, "index {} of a permutation of {}", i, n_);
    // feistel permutes [0, 4^h) and i < n <= 4^h: walking the cycle of i until it falls in
    // [0, n) gives a bijection of [0, n)
    do {
        i = feistel(i);
    } while (i >= n_);
    return i;
}

SequenceSampler::SequenceSampler(int64_t n_windows, uint64_t seed, ShuffleKind kind)
    : seed_(seed), n_windows_(n_windows), kind_(kind) {
    BGL_CHECK(n_windows_ > 0, "a sampler over {} windows", n_windows_);
    if (kind_ == ShuffleKind::exact) order_.resize(static_cast<size_t>(n_windows_));
    shuffle_epoch();
}

void SequenceSampler::shuffle_epoch() {
    if (kind_ == ShuffleKind::keyed) {
        uint64_t x =
            seed_ ^ (0x5EED0000ull + static_cast<uint64_t>(cursor_.epoch)) * 0xD1B54A32D192ED03ull;
        perm_ = WindowPermutation(static_cast<uint64_t>(n_windows_), splitmix64(x));
        return;
    }
    std::iota(order_.begin(), order_.end(), int64_t{0});
    Rng rng(seed_, 0x5EED0000ull + static_cast<uint64_t>(cursor_.epoch));
    for (int64_t i = n_windows_ - 1; i > 0; --i) {
        const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
        std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
}

void SequenceSampler::set_cursor(const SamplerCursor& c) {
    BGL_CHECK(c.epoch >= 0 && c.position >= 0 && c.position <= n_windows_,
              "cursor epoch {} position {} of {}", c.epoch, c.position, n_windows_);
    const bool same_epoch = c.epoch == cursor_.epoch;
    cursor_               = c;
    if (!same_epoch) shuffle_epoch();
}

void SequenceSampler::start_next_epoch_if_done() {
    if (cursor_.position == n_windows_) {
        ++cursor_.epoch;
        cursor_.position = 0;
        shuffle_epoch();
    }
}

int64_t SequenceSampler::next() {
    start_next_epoch_if_done();
    const int64_t p = cursor_.position++;
    if (kind_ == ShuffleKind::keyed) return static_cast<int64_t>(perm_(static_cast<uint64_t>(p)));
    return order_[static_cast<size_t>(p)];
}

void SequenceSampler::skip(int64_t n) {
    while (n > 0) {
        start_next_epoch_if_done();
        const int64_t take = std::min(n, n_windows_ - cursor_.position);
        cursor_.position += take;
        n -= take;
    }
}

SamplerCursor advance_cursor(SamplerCursor c, int64_t n_windows, int64_t k) {
    BGL_CHECK(n_windows > 0 && k >= 0, "advance {} over {} windows", k, n_windows);
    while (k > 0) {
        if (c.position == n_windows) {
            ++c.epoch;
            c.position = 0;
        }
        const int64_t take = std::min(k, n_windows - c.position);
        c.position += take;
        k -= take;
    }
    return c;
}

uint64_t source_seed(uint64_t seed, int source) {
    return seed ^ (static_cast<uint64_t>(source) * 0x9E3779B97F4A7C15ull);
}

BlendSchedule::BlendSchedule(const std::vector<double>& weights) {
    if (weights.empty()) return;
    double sum = 0;
    for (const double w : weights) {
        BGL_CHECK(std::isfinite(w) && w > 0, "a blend weight of {}", w);
        sum += w;
    }
    for (const double w : weights) p_.push_back(w / sum);
}

int BlendSchedule::next(std::vector<double>& deficits) const {
    if (p_.empty()) return 0;
    BGL_CHECK(deficits.size() == p_.size(), "{} deficits for {} sources", deficits.size(),
              p_.size());
    int best = 0;
    for (size_t i = 0; i < p_.size(); ++i) {
        deficits[i] += p_[i];
        if (deficits[i] > deficits[static_cast<size_t>(best)]) best = static_cast<int>(i);
    }
    deficits[static_cast<size_t>(best)] -= 1;
    return best;
}

OrderCursor BlendSchedule::start() const {
    OrderCursor c;
    c.sources.resize(static_cast<size_t>(sources()));
    if (!p_.empty()) c.deficits.assign(p_.size(), 0.0);
    return c;
}

OrderCursor BlendSchedule::advance(OrderCursor c, const std::vector<int64_t>& windows,
                                   int64_t k) const {
    BGL_CHECK(
        c.sources.size() == static_cast<size_t>(sources()) && windows.size() == c.sources.size(),
        "a cursor of {} sources over {} splits", c.sources.size(), windows.size());
    std::vector<int64_t> taken(c.sources.size(), 0);
    if (p_.empty()) {
        taken[0] = k;
    } else {
        for (int64_t i = 0; i < k; ++i) ++taken[static_cast<size_t>(next(c.deficits))];
    }
    for (size_t s = 0; s < taken.size(); ++s)
        c.sources[s] = advance_cursor(c.sources[s], windows[s], taken[s]);
    return c;
}

}  // namespace bagualu::data

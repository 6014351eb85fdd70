#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace bagualu::data {

SequenceSampler::SequenceSampler(int64_t n_windows, uint64_t seed)
    : seed_(seed), n_windows_(n_windows) {
    BGL_CHECK(n_windows_ > 0, "a sampler over {} windows", n_windows_);
    order_.resize(static_cast<size_t>(n_windows_));
    shuffle_epoch();
}

void SequenceSampler::shuffle_epoch() {
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
    return order_[static_cast<size_t>(cursor_.position++)];
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

}  // namespace bagualu::data

#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace bagualu::data {

SequenceSampler::SequenceSampler(std::span<const int32_t> tokens, int seq_len, uint64_t seed)
    : tokens_(tokens),
      T_(seq_len),
      seed_(seed),
      n_windows_(tokens.size() > 0 ? (static_cast<int64_t>(tokens.size()) - 1) / seq_len : 0) {
    BGL_CHECK(n_windows_ > 0, "{} tokens hold no window of {}", tokens.size(), seq_len + 1);
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
    BGL_CHECK(c.position >= 0 && c.position <= n_windows_, "cursor position {} of {}", c.position,
              n_windows_);
    cursor_ = c;
    shuffle_epoch();
}

void SequenceSampler::next_batch(int32_t* inputs, int32_t* targets, int B) {
    for (int b = 0; b < B; ++b) {
        if (cursor_.position == n_windows_) {
            ++cursor_.epoch;
            cursor_.position = 0;
            shuffle_epoch();
        }
        const int64_t  w   = order_[static_cast<size_t>(cursor_.position++)];
        const int32_t* src = tokens_.data() + w * T_;
        std::copy(src, src + T_, inputs + static_cast<int64_t>(b) * T_);
        std::copy(src + 1, src + 1 + T_, targets + static_cast<int64_t>(b) * T_);
    }
}

void sequential_batch(std::span<const int32_t> tokens, int seq_len, int64_t first_window, int B,
                      int32_t* inputs, int32_t* targets) {
    for (int b = 0; b < B; ++b) {
        const int64_t w = first_window + b;
        BGL_CHECK((w + 1) * seq_len + 1 <= static_cast<int64_t>(tokens.size()),
                  "window {} beyond {} tokens", w, tokens.size());
        const int32_t* src = tokens.data() + w * seq_len;
        std::copy(src, src + seq_len, inputs + static_cast<int64_t>(b) * seq_len);
        std::copy(src + 1, src + 1 + seq_len, targets + static_cast<int64_t>(b) * seq_len);
    }
}

}  // namespace bagualu::data

// BalanceBias: the per-expert routing bias and its once-per-step update (balance_bias.h).
#include "moe/balance_bias.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace bagualu::moe {

BalanceBias::BalanceBias(int E)
    : b_(static_cast<size_t>(E), 0.0f), load_(static_cast<size_t>(E), 0) {}

void BalanceBias::set(std::span<const float> values) {
    BGL_CHECK(values.size() == b_.size(), "balance bias: {} values for {} experts", values.size(),
              b_.size());
    std::copy(values.begin(), values.end(), b_.begin());
}

void BalanceBias::add_load(const int64_t* load) {
    for (size_t e = 0; e < load_.size(); ++e) load_[e] += load[e];
}

void BalanceBias::discard_step() { std::fill(load_.begin(), load_.end(), 0); }

void BalanceBias::end_step(double rate, bool proportional) {
    const size_t Es = b_.size();
    const auto E    = static_cast<int64_t>(Es);
    int64_t total   = 0;
    for (const int64_t l : load_) total += l;
    step_load_ = load_;
    if (rate <= 0) {
        discard_step();
        return;
    }
    // sign(mean_load - load_e) = sign(total - E * load_e), in integers: no rounding decides it
    const auto r = static_cast<float>(rate);
    for (size_t e = 0; e < Es; ++e) {
        const int64_t d = total - E * load_[e];
        if (proportional) {
            if (total > 0) {
                b_[e] +=
                    static_cast<float>(rate * static_cast<double>(d) / static_cast<double>(total));
            }
            continue;
        }
        if (d > 0) b_[e] += r;
        if (d < 0) b_[e] -= r;
    }
    double sum = 0;  // summed in expert order, in double: the same on every rank
    for (const float v : b_) sum += v;
    const double mean = sum / static_cast<double>(E);
    for (float& v : b_) v = static_cast<float>(static_cast<double>(v) - mean);
    std::fill(load_.begin(), load_.end(), 0);
}

double BalanceBias::max_violation() const {
    int64_t total = 0, mx = 0;
    for (const int64_t l : step_load_) {
        total += l;
        mx = std::max(mx, l);
    }
    const auto E = static_cast<int64_t>(step_load_.size());
    return total > 0 ? static_cast<double>(mx * E) / static_cast<double>(total) - 1.0 : 0.0;
}

BiasStats BalanceBias::stats() const {
    BiasStats s;
    if (b_.empty()) return s;
    s.min = s.max  = b_[0];
    double abs_sum = 0;
    for (const float v : b_) {
        s.min = std::min(s.min, static_cast<double>(v));
        s.max = std::max(s.max, static_cast<double>(v));
        abs_sum += std::fabs(static_cast<double>(v));
    }
    s.mean_abs = abs_sum / static_cast<double>(b_.size());
    return s;
}

}  // namespace bagualu::moe

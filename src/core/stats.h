// Medians, and how far a median of timings on a noisy machine can be trusted: an interval that
// covers the median of the distribution the timings came from with a stated probability,
// whatever that distribution (binomial order statistics; no normality assumed, as timings on a
// shared host are skewed and heavy-tailed).
#pragma once
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace bagualu {

// The median: the middle value, or the mean of the two middle values for an even count; 0 for
// none.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct MedianInterval {
    double lo = 0, hi = 0;
    double coverage = 0;  // the probability that [lo, hi] covers the median, >= the one asked
};

// [x_(j), x_(n+1-j)] of the n sorted values with the largest j whose coverage, P(j <= B <= n - j)
// for B ~ Binomial(n, 1/2), is at least `confidence` (each value lies below the median with
// probability 1/2, independently). None where even [x_(1), x_(n)] covers less: at 95%, fewer
// than 6 values. Needs the values to be independent draws; rounds of a benchmark taken in turn
// are close to that, one slow stretch of the host is not.
inline std::optional<MedianInterval> median_interval(std::vector<double> v,
                                                     double confidence = 0.95) {
    const size_t n = v.size();
    if (n == 0) return std::nullopt;
    std::sort(v.begin(), v.end());
    // P(B <= i) for i = 0, 1, ..., in logs so that 2^-n does not underflow for long runs
    const double nd = static_cast<double>(n);
    const auto pmf  = [&](size_t k) {
        const double kd = static_cast<double>(k);
        return std::exp(std::lgamma(nd + 1) - std::lgamma(kd + 1) - std::lgamma(nd - kd + 1) -
                         nd * std::log(2.0));
    };
    std::optional<MedianInterval> best;
    double below = 0;  // P(B <= j - 1)
    for (size_t j = 1; 2 * j <= n + 1; ++j) {
        below += pmf(j - 1);
        const double coverage = 1 - 2 * below;
        if (coverage < confidence) break;
        best = MedianInterval{v[j - 1], v[n - j], coverage};
    }
    return best;
}

}  // namespace bagualu

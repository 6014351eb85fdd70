// The median and the order-statistic interval for it: the textbook ranks for small counts, and
// the stated coverage reached on draws from a skewed distribution, as benchmark timings are.
#include "core/stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace bagualu {
namespace {

TEST(Median, MiddleValueOrMeanOfTheTwoMiddleOnes) {
    EXPECT_EQ(median({}), 0.0);
    EXPECT_EQ(median({3.0}), 3.0);
    EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
    EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

// 1..n shuffled: the interval is [j, n + 1 - j] with j from the binomial tails (n = 15: P(B <= 3)
// = 0.0176 and P(B <= 4) = 0.0592 for B ~ Binomial(15, 1/2), so j = 4 at 95%).
TEST(MedianInterval, RanksFromTheBinomialTails) {
    const auto ranks = [](int n, double confidence) {
        std::vector<double> v;
        for (int i = n; i >= 1; --i) v.push_back(i);  // descending: the function sorts
        return median_interval(v, confidence);
    };
    EXPECT_FALSE(ranks(5, 0.95).has_value());  // even [x1, x5] covers 1 - 2/32 = 0.9375
    const struct {
        int n;
        double lo, hi, coverage;
    } cases[] = {{6, 1, 6, 1 - 2.0 / 64},
                 {9, 2, 8, 1 - 2 * 10.0 / 512},
                 {15, 4, 12, 1 - 2 * 576.0 / 32768},
                 {20, 6, 15, 1 - 2 * 21700.0 / 1048576}};
    for (const auto& c : cases) {
        const auto r = ranks(c.n, 0.95);
        ASSERT_TRUE(r.has_value()) << c.n;
        EXPECT_EQ(r->lo, c.lo) << c.n;
        EXPECT_EQ(r->hi, c.hi) << c.n;
        EXPECT_NEAR(r->coverage, c.coverage, 1e-12) << c.n;
    }
    // a lower confidence narrows it; 2000 values do not underflow 2^-n
    EXPECT_EQ(ranks(15, 0.5)->lo, 6);  // P(B <= 5) = 0.151, P(B <= 6) = 0.304
    const auto big = ranks(2000, 0.95);
    ASSERT_TRUE(big.has_value());
    EXPECT_NEAR(big->lo, 1000.5 - 1.96 * std::sqrt(2000.0) / 2, 2.0);
    EXPECT_NEAR(big->hi, 1000.5 + 1.96 * std::sqrt(2000.0) / 2, 2.0);
}

// Lognormal draws (skewed, like step times with a slow tail), median exp(0) = 1: over 20,000
// samples of 15 the interval covers 1 in 96.5% of them, as stated, within three standard errors
// of a proportion (0.0013).
TEST(MedianInterval, CoversTheMedianAsOftenAsItStates) {
    std::mt19937_64 rng(42);
    std::lognormal_distribution<double> draw(0.0, 0.5);
    constexpr int kTrials = 20000;
    int covered           = 0;
    double stated         = 0;
    for (int t = 0; t < kTrials; ++t) {
        std::vector<double> v(15);
        for (double& x : v) x = draw(rng);
        const auto r = median_interval(v);
        ASSERT_TRUE(r.has_value());
        stated = r->coverage;
        covered += r->lo <= 1.0 && 1.0 <= r->hi;
    }
    const double rate = static_cast<double>(covered) / kTrials;
    EXPECT_NEAR(rate, stated, 3 * std::sqrt(stated * (1 - stated) / kTrials)) << rate;
    EXPECT_GE(stated, 0.95);
}

}  // namespace
}  // namespace bagualu

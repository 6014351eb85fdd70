// Single-process parts of collectives.h: shard boundaries, the online-averaging fold (including
// why it exists: fp16 sums overflow where the running mean does not), and the bf16/fp16
// conversions.
#include "dist/comm/collectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "dist/comm/half.h"

namespace bagualu::dist {
namespace {

using detail::bf16_from_float;
using detail::float_from_bf16;
using detail::float_from_fp16;
using detail::fp16_from_float;

TEST(ShardOf, CoversTheArrayContiguously) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{7}, size_t{64}, size_t{1001}}) {
        for (int P = 1; P <= 9; ++P) {
            size_t next = 0;
            for (int r = 0; r < P; ++r) {
                const ShardInfo s = shard_of(n, r, P);
                EXPECT_EQ(s.offset, next) << n << " " << P << " " << r;
                EXPECT_EQ(s.offset, n * static_cast<size_t>(r) / static_cast<size_t>(P));
                EXPECT_LE(s.size, n / static_cast<size_t>(P) + 1);
                EXPECT_GE(s.size, n / static_cast<size_t>(P));
                next = s.offset + s.size;
            }
            EXPECT_EQ(next, n);
        }
    }
    const ShardInfo big = shard_of(size_t{1} << 62, 3, 4);
    EXPECT_EQ(big.offset, size_t{3} << 60);
    EXPECT_EQ(big.size, size_t{1} << 60);
    EXPECT_THROW(shard_of(10, 4, 4), InternalError);
}

// The automatic choice: halving/doubling for small arrays over a power of two, and over any P
// above 64 ranks when each shard is latency-bound (a paper-scale dense bucket over 96,000 ranks);
// the ring otherwise. And the hops the planner counts for each.
TEST(CollAlgoChoice, AutomaticPicksHalvingWhereLatencyDominates) {
    const auto pick = [](int P, size_t bytes) {
        return resolve_algo(CollAlgo::automatic, P, bytes);
    };
    EXPECT_EQ(pick(4, size_t{256} << 10), CollAlgo::halving_doubling);
    EXPECT_EQ(pick(4, (size_t{256} << 10) + 1), CollAlgo::ring);
    EXPECT_EQ(pick(3, 1024), CollAlgo::ring);  // few ranks: the ring's P-1 hops are few
    EXPECT_EQ(pick(64, size_t{1} << 20), CollAlgo::ring);
    EXPECT_EQ(pick(65, 65 * kLatencyBoundShardBytes), CollAlgo::halving_doubling);
    EXPECT_EQ(pick(65, 65 * kLatencyBoundShardBytes + 65), CollAlgo::ring);
    EXPECT_EQ(pick(96000, size_t{393216000}), CollAlgo::halving_doubling);  // 4 KiB shards
    EXPECT_EQ(resolve_algo(CollAlgo::ring, 96000, 1), CollAlgo::ring);

    const double b = 96000.0 * 4096;
    EXPECT_EQ(coll_traffic(CollAlgo::ring, 96000, b, false).hops, 95999);
    EXPECT_EQ(coll_traffic(CollAlgo::halving_doubling, 65536, b, false).hops, 16);
    EXPECT_EQ(coll_traffic(CollAlgo::halving_doubling, 96000, b, false).hops, 19);
    EXPECT_EQ(coll_traffic(CollAlgo::halving_doubling, 96000, b, true).hops, 18);
    // the pairs move the whole array once more than a power of two would
    EXPECT_DOUBLE_EQ(coll_traffic(CollAlgo::halving_doubling, 96000, b, false).busiest_bytes,
                     b + 65535.0 / 65536 * b);
    EXPECT_DOUBLE_EQ(coll_traffic(CollAlgo::halving_doubling, 65536, b, true).busiest_bytes,
                     65535.0 / 65536 * b);
    EXPECT_THROW(coll_traffic(CollAlgo::automatic, 4, b, false), InternalError);
}

TEST(HalfFloat, Conversions) {
    EXPECT_EQ(fp16_from_float(1.0f), 0x3c00);
    EXPECT_EQ(fp16_from_float(65504.0f), 0x7bff);
    EXPECT_EQ(fp16_from_float(65520.0f), 0x7c00);  // rounds to inf
    EXPECT_EQ(fp16_from_float(-std::numeric_limits<float>::infinity()), 0xfc00);
    EXPECT_TRUE(std::isnan(float_from_fp16(fp16_from_float(std::nanf("")))));
    EXPECT_EQ(float_from_fp16(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    EXPECT_EQ(fp16_from_float(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(fp16_from_float(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
    EXPECT_EQ(fp16_from_float(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
    EXPECT_EQ(bf16_from_float(1.0f), 0x3f80);
    EXPECT_EQ(bf16_from_float(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie -> even
    EXPECT_EQ(float_from_bf16(0xc040), -3.0f);
    EXPECT_TRUE(std::isnan(float_from_bf16(bf16_from_float(std::nanf("")))));
    for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive fp16 round-trips
        ASSERT_EQ(fp16_from_float(float_from_fp16(static_cast<uint16_t>(h))), h);
    }
}

TEST(FoldMean, IsTheRunningMean) {
    std::vector<float> mean{2.0f, -4.0f}, x{4.0f, 8.0f}, out(2);
    fold_mean(out.data(), mean.data(), x.data(), 2, 0.25f);  // mean of 3 values, then a 4th
    EXPECT_EQ(out, (std::vector<float>{2.5f, -1.0f}));
}

// 1024 fp16 values near 60000: summing in fp16 overflows to inf after two values; folding the
// running mean (float32 arithmetic, fp16 storage in and out) stays within fp16 rounding of the
// exact mean.
TEST(FoldMean, Fp16MeanOfLargeValuesDoesNotOverflow) {
    constexpr int kCount = 1024;
    Rng rng(7);
    std::vector<uint16_t> values(kCount);
    double exact = 0;
    for (auto& v : values) {
        v = fp16_from_float(static_cast<float>(60000.0 + 2000.0 * (rng.uniform() - 0.5)));
        exact += float_from_fp16(v);
    }
    exact /= kCount;

    uint16_t sum = fp16_from_float(0.0f);  // sum-then-divide, fp16 accumulator
    for (uint16_t v : values) sum = fp16_from_float(float_from_fp16(sum) + float_from_fp16(v));
    const float sum_then_divide = float_from_fp16(fp16_from_float(float_from_fp16(sum) / kCount));
    EXPECT_TRUE(std::isinf(sum_then_divide));

    float mean = float_from_fp16(values[0]);  // online averaging, float32 accumulator
    for (int i = 1; i < kCount; ++i) {
        mean +=
            (float_from_fp16(values[static_cast<size_t>(i)]) - mean) / static_cast<float>(i + 1);
    }
    const uint16_t online = fp16_from_float(mean);
    EXPECT_EQ(online, fp16_from_float(static_cast<float>(exact)));
    EXPECT_LE(std::abs(float_from_fp16(online) - exact), 16.0);  // half an fp16 ulp at 60000

    // The same through fold_mean_fp16, one contribution at a time (fp16 between folds, as on
    // the wire): still finite and within a few fp16 ulps.
    uint16_t folded = values[0];
    for (int i = 1; i < kCount; ++i) {
        fold_mean_fp16(&folded, &folded, &values[static_cast<size_t>(i)], 1,
                       1.0f / static_cast<float>(i + 1));
    }
    EXPECT_TRUE(std::isfinite(float_from_fp16(folded)));
    EXPECT_LE(std::abs(float_from_fp16(folded) - exact), 8 * 32.0);
}

}  // namespace
}  // namespace bagualu::dist

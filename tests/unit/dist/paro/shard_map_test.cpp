// ParO bookkeeping (dist/paro/shard_map.h) without communication: the pieces of all ranks' shards
// cover every tensor element of a space exactly once with the right decay flag and offsets, and
// the bucket copies, used as a simulated reduce-scatter and all-gather, move each float to and
// from its owner. Odd tensor sizes, odd rank counts and buckets smaller than a tensor.
#include "dist/paro/shard_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dist/paro/grad_sync.h"

namespace bagualu::dist::paro {
namespace {

// Dense and expert tensors interleaved, sizes not multiples of 16.
model::ParamLayout mixed_layout() {
    model::ParamLayout l;
    l.add("wte", {37, 3}, true);
    l.add("ln.weight", {5}, false);
    l.add("experts.0.w", {50}, true, true);
    l.add("experts.0.b", {5}, false, true);
    l.add("proj.weight", {10, 10}, true);
    l.add("proj.bias", {3}, false);
    l.add("experts.1.w", {64}, true, true);
    l.add("ln_f.bias", {17}, false);
    return l;
}

std::vector<FlatRun> runs_of(const model::ParamLayout& l, bool expert) {
    std::vector<FlatRun> runs;
    for (const Segment& s : make_segments(l)) {
        if (s.expert == expert) runs.push_back({s.begin, s.end});
    }
    return runs;
}

// ranks x bucket sizes x {dense, expert}
class ShardMapTest : public ::testing::TestWithParam<std::tuple<int, size_t, bool>> {};

TEST_P(ShardMapTest, PiecesCoverEveryElementOnce) {
    const auto [P, bucket, expert] = GetParam();
    const model::ParamLayout l     = mixed_layout();
    std::vector<int> seen(l.total_floats(), 0);
    for (int r = 0; r < P; ++r) {
        const ShardMap map(runs_of(l, expert), l, P, r, bucket);
        EXPECT_EQ(map.shard_size() % 16, 0u);
        EXPECT_EQ(map.piece_size() % 16, 0u);
        EXPECT_EQ(map.piece_size() * map.num_buckets(), map.shard_size());
        EXPECT_GE(map.shard_size() * static_cast<size_t>(P), map.numel());
        size_t next = 0;  // pieces ascend in the shard and do not overlap
        for (const ShardPiece& p : map.pieces()) {
            const model::ParamSpec& s = l.spec(p.spec);
            EXPECT_EQ(s.expert, expert) << s.name;
            EXPECT_EQ(p.decay, s.decay) << s.name;
            EXPECT_EQ(p.flat_offset, s.offset + p.elem_offset);
            EXPECT_LE(p.elem_offset + p.len, s.numel);
            EXPECT_GE(p.shard_offset, next);
            EXPECT_LE(p.shard_offset + p.len, map.shard_size());
            next = p.shard_offset + p.len;
            for (size_t i = 0; i < p.len; ++i) ++seen[p.flat_offset + i];
        }
    }
    for (const model::ParamSpec& s : l.specs()) {
        for (size_t i = 0; i < s.numel; ++i) {
            EXPECT_EQ(seen[s.offset + i], s.expert == expert ? 1 : 0) << s.name << "[" << i << "]";
        }
    }
}

TEST_P(ShardMapTest, BucketsReduceScatterAndGatherThroughOwners) {
    const auto [P, bucket, expert] = GetParam();
    const model::ParamLayout l     = mixed_layout();
    const size_t n                 = l.total_floats();
    std::vector<ShardMap> maps;
    std::vector<std::vector<float>> flat(static_cast<size_t>(P), std::vector<float>(n));
    for (int r = 0; r < P; ++r) {
        maps.emplace_back(runs_of(l, expert), l, P, r, bucket);
        for (size_t i = 0; i < n; ++i) flat[size_t(r)][i] = float(r + 1) * 1000.f + float(i);
    }
    const ShardMap& m0 = maps[0];
    // reduce-scatter by hand: piece r of every rank's packed bucket summed into rank r
    for (size_t b = 0; b < m0.num_buckets(); ++b) {
        std::vector<std::vector<float>> bufs(size_t(P), std::vector<float>(m0.bucket_size()));
        for (int r = 0; r < P; ++r)
            maps[size_t(r)].pack(b, flat[size_t(r)].data(), bufs[size_t(r)].data());
        for (int r = 0; r < P; ++r) {
            std::vector<float> sum(m0.bucket_size(), 0.f);
            for (int s = 0; s < P; ++s) {
                for (size_t i = 0; i < sum.size(); ++i) sum[i] += bufs[size_t(s)][i];
            }
            maps[size_t(r)].unpack(b, sum.data(), flat[size_t(r)].data(), true);
        }
    }
    const float rank_sum = 1000.f * float(P * (P + 1) / 2);
    for (int r = 0; r < P; ++r) {
        for (const ShardPiece& p : maps[size_t(r)].pieces()) {
            for (size_t i = p.flat_offset; i < p.flat_offset + p.len; ++i) {
                EXPECT_EQ(flat[size_t(r)][i], rank_sum + float(P) * float(i)) << "rank " << r;
            }
        }
    }
    // all-gather by hand: every rank ends with each owner's values
    for (int r = 0; r < P; ++r) {
        for (const ShardPiece& p : maps[size_t(r)].pieces()) {
            for (size_t i = 0; i < p.len; ++i) flat[size_t(r)][p.flat_offset + i] = -float(r + 1);
        }
    }
    for (size_t b = 0; b < m0.num_buckets(); ++b) {
        std::vector<float> gathered(m0.bucket_size());
        for (int r = 0; r < P; ++r)
            maps[size_t(r)].pack_own(b, flat[size_t(r)].data(), gathered.data());
        for (int r = 0; r < P; ++r)
            maps[size_t(r)].unpack(b, gathered.data(), flat[size_t(r)].data(), false);
    }
    for (int owner = 0; owner < P; ++owner) {
        for (const ShardPiece& p : maps[size_t(owner)].pieces()) {
            for (int r = 0; r < P; ++r) {
                EXPECT_EQ(flat[size_t(r)][p.flat_offset], -float(owner + 1)) << "rank " << r;
                EXPECT_EQ(flat[size_t(r)][p.flat_offset + p.len - 1], -float(owner + 1));
            }
        }
    }
}

// Buckets are consecutive floats of the space, so a later bucket starts later in the flat array
// (backward finishes the late layers first: their buckets can be reduced first).
TEST_P(ShardMapTest, BucketsFollowTheFlatOrder) {
    const auto [P, bucket, expert] = GetParam();
    const model::ParamLayout l     = mixed_layout();
    const ShardMap map(runs_of(l, expert), l, P, 0, bucket);
    for (size_t b = 0; b < map.num_buckets(); ++b) {
        size_t lo = SIZE_MAX, hi = 0;
        for (const BucketCopy& c : map.copies(b)) {
            lo = std::min(lo, c.flat_offset);
            hi = std::max(hi, c.flat_offset + c.len);
        }
        EXPECT_EQ(map.first_flat(b), lo);
        if (b + 1 < map.num_buckets()) {
            EXPECT_LE(hi, map.first_flat(b + 1)) << "bucket " << b;
        }
    }
    if (bucket == 40) {
        EXPECT_GT(map.num_buckets(), 1u);
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardMapTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                                            ::testing::Values(size_t{40}, size_t{1} << 20),
                                            ::testing::Bool()));

TEST(ShardMap, EmptySpaceHasNoShard) {
    const model::ParamLayout l = mixed_layout();
    const ShardMap map({}, l, 4, 1, 1024);
    EXPECT_EQ(map.numel(), 0u);
    EXPECT_EQ(map.shard_size(), 0u);
    EXPECT_EQ(map.num_buckets(), 0u);
    EXPECT_TRUE(map.pieces().empty());
}

}  // namespace
}  // namespace bagualu::dist::paro

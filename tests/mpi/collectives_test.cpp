// Our collectives under mpirun: reduce_scatter_mean + all_gather == MPI_Allreduce / P for sizes
// not divisible by P (ring and halving/doubling, the latter over odd P too), bf16/fp16 payloads
// against a float reference, and hierarchical all-to-all == flat all-to-all on real and faked node
// layouts.
#include "dist/comm/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "dist/comm/alltoallv.h"
#include "dist/comm/counters.h"
#include "dist/comm/half.h"
#include "mpi_world.h"

namespace bagualu::dist {
namespace {

// halving/doubling runs over any P: over a power of two as such, else with paired ranks
std::vector<CollAlgo> algos_for(int) {
    return {CollAlgo::automatic, CollAlgo::ring, CollAlgo::halving_doubling};
}

std::vector<size_t> sizes_for(int P) {
    const auto p = static_cast<size_t>(P);
    return {0, 1, p - 1, p + 1, 7 * p + 3, 1001, 65537, 300007};
}

// Every rank's result equals rank 0's, bit for bit.
bool same_on_every_rank(Comm& w, const void* data, size_t bytes) {
    std::vector<char> mine(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    std::vector<char> root = mine;
    w.broadcast(root.data(), bytes, 0);
    int64_t differs = root != mine;
    w.allreduce_max(std::span<int64_t>(&differs, 1));
    return differs == 0;
}

TEST(Collectives, ReduceScatterAllGatherEqualsMpiAllreduce) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    for (CollAlgo algo : algos_for(P)) {
        for (size_t n : sizes_for(P)) {
            Rng rng(1234 + n, static_cast<uint64_t>(r));
            std::vector<float> x(n);
            for (auto& v : x) v = static_cast<float>(0.5 + rng.uniform());
            std::vector<float> ref = x;
            w.allreduce_sum(std::span<float>(ref));
            for (auto& v : ref) v /= static_cast<float>(P);

            const ShardInfo s = shard_of(n, r, P);
            std::vector<float> shard(s.size);
            reduce_scatter_mean(w, x, shard, algo);
            std::vector<float> full(n);
            all_gather(w, shard, full, algo);
            std::vector<float> in_place = x;
            allreduce_mean(w, in_place, algo);

            size_t bad = 0;
            for (size_t i = 0; i < n; ++i) {
                bad += std::abs(full[i] - ref[i]) > 1e-6f * std::abs(ref[i]);
                bad += in_place[i] != full[i];
            }
            EXPECT_EQ(bad, 0u) << "n=" << n << " algo=" << static_cast<int>(algo);
            EXPECT_TRUE(same_on_every_rank(w, full.data(), n * sizeof(float)));
        }
    }
}

// The traffic bagualu plan counts (dist::coll_traffic) is what a call makes: the most sendrecv
// hops of any rank, and the bytes a rank sends on the mean, for both algorithms at every P
// (halving/doubling over P not a power of two with its paired ranks).
TEST(Collectives, TrafficIsWhatTheCallsMake) {
    Comm& w        = test_world();
    const int P    = w.size();
    const size_t n = 7 * static_cast<size_t>(P) * 1000 + 3;
    for (CollAlgo algo : {CollAlgo::ring, CollAlgo::halving_doubling}) {
        std::vector<float> x(n, 1.0f), full(n);
        const ShardInfo s = shard_of(n, w.rank(), P);
        std::vector<float> shard(s.size);
        for (const bool gather : {false, true}) {
            const CommTally before = comm_tally();
            if (gather) {
                all_gather(w, shard, full, algo);
            } else {
                reduce_scatter_mean(w, x, shard, algo);
            }
            const CommCount hop = (comm_tally() - before)[CommKind::sendrecv];
            int64_t most = static_cast<int64_t>(hop.calls), sent = static_cast<int64_t>(hop.bytes);
            w.allreduce_max(std::span<int64_t>(&most, 1));
            w.allreduce_sum(std::span<int64_t>(&sent, 1));
            const CollTraffic t = coll_traffic(algo, P, double(n * sizeof(float)), gather);
            EXPECT_EQ(most, t.hops) << "algo " << static_cast<int>(algo) << " gather " << gather;
            // the pairs' shards are n/P to one element each way
            EXPECT_NEAR(double(sent) / P, t.mean_sent_bytes, double(sizeof(float)))
                << "algo " << static_cast<int>(algo) << " gather " << gather;
        }
    }
}

// Bruck's all-to-all (alltoall_bruck) places every block where MPI's all-to-all does, for blocks
// of odd sizes, and makes the traffic bagualu plan counts (bruck_traffic): ceil(log2 P) sendrecv
// hops and the bytes each rank sends.
TEST(Collectives, BruckAlltoallEqualsTheDirectOne) {
    Comm& w     = test_world();
    const int P = w.size(), r = w.rank();
    for (const size_t words : {size_t{1}, size_t{3}, size_t{17}}) {
        const size_t b = words * sizeof(int32_t) + 1;  // an odd number of bytes
        std::vector<std::byte> send(static_cast<size_t>(P) * b), ref(send.size()),
            got(send.size(), std::byte{0xEE});
        for (size_t i = 0; i < send.size(); ++i)
            send[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(r) * 29 + b) & 0xFF);
        std::vector<int64_t> counts(static_cast<size_t>(P), static_cast<int64_t>(b)),
            displs(counts);
        for (int q = 0; q < P; ++q) displs[static_cast<size_t>(q)] = int64_t{q} * int64_t(b);
        w.alltoallv_bytes(send.data(), counts, displs, ref.data(), counts, displs, 1);
        const CommTally before = comm_tally();
        alltoall_bruck(w, send.data(), b, got.data());
        const CommCount hop = (comm_tally() - before)[CommKind::sendrecv];
        EXPECT_EQ(got, ref) << "block " << b << " bytes";
        const BruckTraffic t = bruck_traffic(P, double(b));
        EXPECT_EQ(static_cast<int>(hop.calls), t.hops);
        EXPECT_EQ(double(hop.bytes), t.sent_bytes);
    }
}

// Over nodes (collectives.h): for every node size k dividing P (k consecutive ranks a node), the
// two-level and the one-level reduce-scatter give the same bits, f32 and bf16, every algorithm;
// the f32 mean is the MPI sum / P to float rounding (1e-6 relative: at most 2 log2 P or P folds
// of values in [0.5, 1.5], each rounding once); the all-gathers place the same bytes; one node
// is the plain call, bit for bit.
TEST(Collectives, TwoLevelEqualsOneLevelOverNodes) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    for (int k = 1; k <= P; ++k) {
        if (P % k != 0) continue;
        const NodeLayout lay = make_node_layout(w, r / k * k);
        ASSERT_EQ(lay.nodes, P / k);
        for (CollAlgo algo : algos_for(P)) {
            for (size_t n : {size_t{0}, size_t{1}, static_cast<size_t>(P) + 1,
                             static_cast<size_t>(7 * P + 3), size_t{1001}, size_t{65537}}) {
                Rng rng(99 + n, static_cast<uint64_t>(r));
                std::vector<float> x(n);
                for (auto& v : x) v = static_cast<float>(0.5 + rng.uniform());
                std::vector<float> ref = x;
                w.allreduce_sum(std::span<float>(ref));
                const ShardInfo s = shard_of(n, r, P);
                std::vector<float> one(s.size), two(s.size), plain(s.size);
                reduce_scatter_mean(w, lay, false, x, one, algo);
                reduce_scatter_mean(w, lay, true, x, two, algo);
                reduce_scatter_mean(w, x, plain, algo);
                size_t bad = 0;
                for (size_t i = 0; i < s.size; ++i) {
                    const float want = ref[s.offset + i] / static_cast<float>(P);
                    bad += std::bit_cast<uint32_t>(one[i]) != std::bit_cast<uint32_t>(two[i]);
                    bad += std::abs(two[i] - want) > 1e-6f * want;
                    if (k == P)
                        bad += std::bit_cast<uint32_t>(plain[i]) != std::bit_cast<uint32_t>(two[i]);
                }
                std::vector<uint16_t> h(n), h1(s.size), h2(s.size);
                for (size_t i = 0; i < n; ++i) h[i] = detail::bf16_from_float(x[i]);
                reduce_scatter_mean_bf16(w, lay, false, h, h1, algo);
                reduce_scatter_mean_bf16(w, lay, true, h, h2, algo);
                bad += h1 != h2;
                std::vector<uint16_t> f(n), f1(s.size), f2(s.size), f0(s.size);
                for (size_t i = 0; i < n; ++i) f[i] = detail::fp16_from_float(x[i]);
                reduce_scatter_mean_fp16(w, lay, false, f, f1, algo);
                reduce_scatter_mean_fp16(w, lay, true, f, f2, algo);
                reduce_scatter_mean_fp16(w, f, f0, algo);
                bad += f1 != f2;
                if (k == P) bad += f0 != f2;  // one node: the plain call
                std::vector<float> g1(n), g2(n);
                all_gather(w, lay, false, std::span<const float>(two), g1, algo);
                all_gather(w, lay, true, std::span<const float>(two), g2, algo);
                // (memcmp on an empty vector's null data() is undefined)
                bad += n > 0 && std::memcmp(g1.data(), g2.data(), n * sizeof(float)) != 0;
                std::vector<uint16_t> a1(n), a2(n);
                all_gather(w, lay, false, std::span<const uint16_t>(h2), a1, algo);
                all_gather(w, lay, true, std::span<const uint16_t>(h2), a2, algo);
                bad += a1 != a2;
                std::vector<float> in_place = x;
                allreduce_mean(w, lay, true, in_place, algo);
                bad += n > 0 && std::memcmp(in_place.data(), g2.data(), n * sizeof(float)) != 0;
                EXPECT_EQ(bad, 0u) << "k=" << k << " n=" << n << " algo=" << static_cast<int>(algo);
                EXPECT_TRUE(same_on_every_rank(w, in_place.data(), n * sizeof(float)));
            }
        }
    }
}

// Payload variants: inputs are bf16/fp16 values; the reference is their exact mean. Each of the
// at most P roundings (P-1 hops, then the result) errs by at most u * max|x| (u = 2^-8 bf16,
// 2^-11 fp16), since a partial mean never exceeds max|x|; earlier errors shrink with each fold.
TEST(Collectives, HalfPayloadsMatchFloatReference) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    struct Kind {
        const char* name;
        uint16_t (*to)(float);
        float (*from)(uint16_t);
        void (*allreduce)(Comm&, std::span<uint16_t>, CollAlgo);
        double u;
        double center;  // values are center + spread * normal
        double spread;
    };
    const Kind kinds[] = {
        {"bf16", detail::bf16_from_float, detail::float_from_bf16, allreduce_mean_bf16, 0x1p-8, 0.0,
         3.0},
        {"fp16", detail::fp16_from_float, detail::float_from_fp16, allreduce_mean_fp16, 0x1p-11,
         0.0, 3.0},
        {"fp16 near 60000", detail::fp16_from_float, detail::float_from_fp16, allreduce_mean_fp16,
         0x1p-11, 60000.0, 500.0},
    };
    for (const Kind& k : kinds) {
        for (CollAlgo algo : algos_for(P)) {
            for (size_t n : {size_t{1000}, size_t{65537}}) {
                Rng rng(99 + n, static_cast<uint64_t>(r));
                std::vector<uint16_t> x(n);
                std::vector<double> ref(n);
                double maxabs = 0;
                for (size_t i = 0; i < n; ++i) {
                    const double v = std::min(k.center + k.spread * rng.normal(), 65000.0);
                    x[i]           = k.to(static_cast<float>(v));
                    ref[i]         = k.from(x[i]);
                    maxabs         = std::max(maxabs, std::abs(ref[i]));
                }
                w.allreduce_sum(std::span<double>(ref));
                w.allreduce_max(std::span<double>(&maxabs, 1));
                std::vector<uint16_t> got = x;
                k.allreduce(w, got, algo);
                double worst = 0;
                for (size_t i = 0; i < n; ++i) {
                    const double g = k.from(got[i]);
                    worst = std::max(worst, std::isfinite(g) ? std::abs(g - ref[i] / P) : 1e30);
                }
                EXPECT_LE(worst, P * k.u * maxabs)
                    << k.name << " n=" << n << " algo=" << static_cast<int>(algo);
                EXPECT_TRUE(same_on_every_rank(w, got.data(), n * sizeof(uint16_t)));
            }
        }
    }
}

// Random counts (some zero), send blocks in shuffled order with gaps, receive with gaps; the
// direct exchange against `algo`'s, which must give the same bytes.
template <typename Algo>
void equals_flat(Comm& w, uint64_t seed, const Algo& algo) {
    const int P   = w.size();
    const int r   = w.rank();
    const auto up = static_cast<size_t>(P);
    std::vector<int64_t> sc(up), sd(up), rc(up), rd(up);
    Rng rng(seed, static_cast<uint64_t>(r));
    for (auto& c : sc) c = rng.below(4) == 0 ? 0 : static_cast<int64_t>(rng.below(50));
    int64_t off = 3;
    for (int q = P - 1; q >= 0; --q) {
        sd[q] = off;
        off += sc[q] + static_cast<int64_t>(rng.below(3));
    }
    std::vector<float> send(static_cast<size_t>(off));
    for (auto& v : send) v = static_cast<float>(rng.uniform());
    w.alltoall(sc, rc);
    int64_t roff = 0;
    for (int q = 0; q < P; ++q) {
        rd[q] = roff;
        roff += rc[q] + 1;
    }
    std::vector<float> flat(static_cast<size_t>(roff), -1.0f), got(flat.size(), -1.0f);
    w.alltoallv<float>(send, sc, sd, flat, rc, rd);
    algo(send.data(), sc, sd, got.data(), rc, rd);
    EXPECT_EQ(got, flat) << "seed " << seed;
}

void hierarchical_equals_flat(Comm& w, NodeGroups& groups, uint64_t seed) {
    equals_flat(w, seed, [&](const float* s, auto& sc, auto& sd, float* d, auto& rc, auto& rd) {
        alltoallv_hierarchical(w, groups, s, sc, sd, d, rc, rd, sizeof(float));
    });
}

TEST(Collectives, HierarchicalAlltoallvEqualsFlat) {
    Comm& w     = test_world();
    const int r = w.rank();
    auto real   = make_node_groups(w);
    EXPECT_EQ(real.members.size(), 1u);
    for (uint64_t seed = 0; seed < 3; ++seed) hierarchical_equals_flat(w, real, seed);
    for (int per_node : {1, 2, 3}) {
        // Fake nodes of per_node consecutive ranks; key reversed to exercise the rank mapping.
        auto groups = make_node_groups(w, w.split(r / per_node, -r));
        EXPECT_EQ(groups.members.size(), static_cast<size_t>((w.size() + per_node - 1) / per_node));
        for (uint64_t seed = 10; seed < 13; ++seed) hierarchical_equals_flat(w, groups, seed);
    }
}

// Every row length dividing P (P itself and 1 included: one phase is then a self-copy), and the
// leaders' exchange of a hierarchical all-to-all over a grid of the leaders: the direct
// exchange's bytes; each row and column exchange is one alltoallv call.
TEST(Collectives, GridAlltoallvEqualsFlat) {
    Comm& w     = test_world();
    const int P = w.size();
    for (int S = 1; S <= P; ++S) {
        if (P % S != 0) continue;
        GridGroups grid = make_grid_groups(w, S);
        ASSERT_EQ(grid.row->size(), S);
        ASSERT_EQ(grid.col->size(), P / S);
        EXPECT_EQ(grid.row->rank(), w.rank() % S);
        for (uint64_t seed = 20; seed < 23; ++seed) {
            const CommTally before = comm_tally();
            equals_flat(w, seed,
                        [&](const float* s, auto& sc, auto& sd, float* d, auto& rc, auto& rd) {
                            alltoallv_grid(grid, s, sc, sd, d, rc, rd, sizeof(float));
                        });
            // the direct exchange, the sizes, the rows, the columns
            EXPECT_EQ((comm_tally() - before)[CommKind::alltoallv].calls, 4u) << "S " << S;
        }
    }
    if (P % 2 == 0 && P >= 4) {
        // nodes of 2 ranks; the leaders (P / 2 of them) in rows of 2 when that divides
        const int r = w.rank();
        auto groups = make_node_groups(w, w.split(r / 2, r));
        if (groups.leaders && groups.leaders->size() % 2 == 0) {
            groups.leader_grid = std::make_unique<GridGroups>(make_grid_groups(*groups.leaders, 2));
        }
        for (uint64_t seed = 30; seed < 33; ++seed) hierarchical_equals_flat(w, groups, seed);
    }
}

}  // namespace
}  // namespace bagualu::dist

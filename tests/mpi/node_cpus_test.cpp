// dist::node_cpu_share under mpirun (P = 1..4, one machine): ranks given one mask split it into
// disjoint contiguous parts that cover it, in rank order; ranks given different masks keep
// theirs; more ranks than CPUs take one CPU each in turn. No ASSERT before the collectives.
#include "dist/node_cpus.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mpi_world.h"

namespace bagualu::dist {
namespace {

// Every rank's share of the masks mask_of(rank), gathered (CPU lists padded with -1).
std::vector<std::vector<int>> shares(Comm& w, const std::vector<int>& mine) {
    const std::vector<int> got = node_cpu_share(*w.split_shared(), mine);
    constexpr int kMax         = 16;
    std::vector<int> padded(kMax, -1), all(size_t(kMax) * size_t(w.size()));
    for (size_t i = 0; i < got.size() && i < kMax; ++i) padded[i] = got[i];
    w.allgather(padded.data(), kMax * sizeof(int), all.data());
    std::vector<std::vector<int>> out(static_cast<size_t>(w.size()));
    for (int r = 0; r < w.size(); ++r) {
        for (int i = 0; i < kMax; ++i) {
            const int c = all[size_t(r) * kMax + size_t(i)];
            if (c >= 0) out[size_t(r)].push_back(c);
        }
    }
    return out;
}

TEST(NodeCpus, RanksGivenOneMaskSplitIt) {
    Comm& w     = test_world();
    const int P = w.size();
    // one mask of 8 CPUs (4..11) for every rank: parts of 8 / P, in rank order
    const std::vector<std::vector<int>> one = shares(w, {4, 5, 6, 7, 8, 9, 10, 11});
    std::vector<int> joined;
    for (int r = 0; r < P; ++r) {
        EXPECT_EQ(one[size_t(r)], cpu_part({4, 5, 6, 7, 8, 9, 10, 11}, r, P)) << "rank " << r;
        EXPECT_GE(one[size_t(r)].size(), size_t(8 / P));
        joined.insert(joined.end(), one[size_t(r)].begin(), one[size_t(r)].end());
    }
    EXPECT_EQ(joined, (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11}));
    // a mask of its own on every rank (a launcher that bound each rank): kept
    const std::vector<std::vector<int>> own = shares(w, {w.rank(), 100 + w.rank()});
    for (int r = 0; r < P; ++r) EXPECT_EQ(own[size_t(r)], (std::vector<int>{r, 100 + r}));
    // one CPU for all: each keeps it (oversubscribed, one thread each)
    const std::vector<std::vector<int>> single = shares(w, {3});
    for (int r = 0; r < P; ++r) EXPECT_EQ(single[size_t(r)], std::vector<int>{3});
    // two masks (a socket each), the ranks alternating between them: each mask split by its
    // own ranks, in rank order
    const std::vector<int> a{0, 1, 2, 3}, b{8, 9, 10, 11};
    const std::vector<std::vector<int>> two = shares(w, w.rank() % 2 ? b : a);
    const int na = (P + 1) / 2, nb = P / 2;
    for (int r = 0; r < P; ++r) {
        const std::vector<int> want = r % 2 ? cpu_part(b, r / 2, nb) : cpu_part(a, r / 2, na);
        EXPECT_EQ(two[size_t(r)], want) << "rank " << r;
    }
}

}  // namespace
}  // namespace bagualu::dist

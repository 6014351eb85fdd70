// Comm under mpirun (P = 1..4): reductions, broadcast, gathers, all-to-all(v) round trips with
// ragged counts and gaps, pairwise == MPI alltoallv, split / split_shared, point-to-point and
// error reporting. Tests avoid ASSERT before collectives so a failure on one rank cannot hang.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "bench/comm_bench.h"
#include "core/error.h"
#include "dist/comm/alltoallv.h"
#include "mpi_world.h"

namespace bagualu::dist {
namespace {

TEST(Comm, Reductions) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    std::vector<float> f{1.0f, static_cast<float>(r)};
    std::vector<double> d{0.5 * r};
    std::vector<int64_t> i{int64_t{1} << 40, r};
    w.allreduce_sum(std::span<float>(f));
    w.allreduce_sum(std::span<double>(d));
    w.allreduce_sum(std::span<int64_t>(i));
    EXPECT_EQ(f[0], static_cast<float>(P));
    EXPECT_EQ(f[1], static_cast<float>(P * (P - 1) / 2));
    EXPECT_EQ(d[0], 0.25 * P * (P - 1));
    EXPECT_EQ(i[0], P * (int64_t{1} << 40));
    std::vector<double> dm{-1.0 * r, 1.0 * r};
    std::vector<int64_t> im{-r, 3 * r};
    w.allreduce_max(std::span<double>(dm));
    w.allreduce_max(std::span<int64_t>(im));
    EXPECT_EQ(dm, (std::vector<double>{0.0, P - 1.0}));
    EXPECT_EQ(im, (std::vector<int64_t>{0, 3 * (P - 1)}));
}

TEST(Comm, BroadcastAndAllgather) {
    Comm& w     = test_world();
    const int P = w.size();
    std::vector<int> v(1000, w.rank());
    w.broadcast(v.data(), v.size() * sizeof(int), P - 1);
    EXPECT_EQ(v, std::vector<int>(1000, P - 1));
    const int64_t mine[2] = {w.rank(), 10 * w.rank()};
    std::vector<int64_t> all(2 * static_cast<size_t>(P));
    w.allgather(mine, sizeof(mine), all.data());
    for (int q = 0; q < P; ++q) {
        EXPECT_EQ(all[2 * static_cast<size_t>(q)], q);
        EXPECT_EQ(all[2 * static_cast<size_t>(q) + 1], 10 * q);
    }
}

// Rank r sends count(r, q) elements to q; element k carries (r, q, k).
int64_t count(int r, int q) { return (r * 7 + q * 3) % 5 + (r == q ? 0 : 1); }
int64_t tag(int r, int q, int64_t k) { return (int64_t{r} << 40) | (int64_t{q} << 20) | k; }

TEST(Comm, AlltoallvRoundTrip) {
    Comm& w       = test_world();
    const int P   = w.size();
    const int r   = w.rank();
    const auto up = static_cast<size_t>(P);
    std::vector<int64_t> sc(up), sd(up), rc(up), rd(up);
    int64_t off = 0;
    for (int q = 0; q < P; ++q) {  // gaps of 2 between blocks, in reverse peer order
        const auto i = static_cast<size_t>(P - 1 - q);
        sc[i]        = count(r, P - 1 - q);
        sd[i]        = off;
        off += sc[i] + 2;
    }
    std::vector<int64_t> send(static_cast<size_t>(off), -1);
    for (int q = 0; q < P; ++q) {
        for (int64_t k = 0; k < sc[q]; ++k) send[static_cast<size_t>(sd[q] + k)] = tag(r, q, k);
    }
    w.alltoall(sc, rc);
    int64_t roff = 0;
    for (int q = 0; q < P; ++q) {
        EXPECT_EQ(rc[q], count(q, r));
        rd[q] = roff + 1;
        roff += rc[q] + 1;
    }
    std::vector<int64_t> recv(static_cast<size_t>(roff + 1), -1);
    w.alltoallv<int64_t>(send, sc, sd, recv, rc, rd);
    for (int q = 0; q < P; ++q) {
        for (int64_t k = 0; k < rc[q]; ++k) {
            EXPECT_EQ(recv[static_cast<size_t>(rd[q] + k)], tag(q, r, k));
        }
    }
    std::vector<int64_t> recv2(recv.size(), -1);
    alltoallv_pairwise(w, send.data(), sc, sd, recv2.data(), rc, rd, sizeof(int64_t));
    EXPECT_EQ(recv2, recv);

    std::vector<int64_t> back(send.size(), -1);  // and back again
    w.alltoallv<int64_t>(recv, rc, rd, back, sc, sd);
    for (int q = 0; q < P; ++q) {
        for (int64_t k = 0; k < sc[q]; ++k) {
            EXPECT_EQ(back[static_cast<size_t>(sd[q] + k)], tag(r, q, k));
        }
    }
}

TEST(Comm, SplitAndSplitShared) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    auto sub    = w.split(r % 2, -r);  // key -r: reversed order inside each group
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), (P - r % 2 + 1) / 2);
    EXPECT_EQ(sub->rank(), sub->size() - 1 - r / 2);
    std::vector<int64_t> s{r};
    sub->allreduce_sum(std::span<int64_t>(s));
    int64_t expect = 0;
    for (int q = r % 2; q < P; q += 2) expect += q;
    EXPECT_EQ(s[0], expect);

    auto only_zero = w.split(r == 0 ? 0 : -1, 0);
    EXPECT_EQ(only_zero == nullptr, r != 0);

    auto node = w.split_shared();  // one machine: everybody
    EXPECT_EQ(node->size(), P);
    EXPECT_EQ(node->rank(), r);
    EXPECT_EQ(w.threads_serialized(), true);
    // Debian's OpenMPI 4.1 provides MPI_THREAD_MULTIPLE (gradient-reduction overlap needs it)
    EXPECT_TRUE(w.threads_multiple());
    EXPECT_TRUE(sub->threads_multiple());
}

TEST(Comm, SendrecvAroundTheRing) {
    Comm& w     = test_world();
    const int P = w.size();
    const int r = w.rank();
    std::vector<float> out(300000, static_cast<float>(r)), in(300000, -1.0f);
    w.sendrecv(out.data(), out.size() * sizeof(float), (r + 1) % P, in.data(),
               in.size() * sizeof(float), (r - 1 + P) % P);
    EXPECT_EQ(in, std::vector<float>(300000, static_cast<float>((r - 1 + P) % P)));
}

TEST(Comm, MpiErrorsComeBackAsExceptions) {
    if (!launched_by_mpi()) GTEST_SKIP() << "needs MpiComm";
    Comm& w = test_world();
    int x   = 0;
    try {
        w.sendrecv(nullptr, 0, 0, &x, sizeof(x), w.size() + 5);
        FAIL() << "no exception";
    } catch (const InternalError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("MPI_Irecv"), std::string::npos) << msg;
        EXPECT_NE(msg.find("on rank " + std::to_string(w.rank())), std::string::npos) << msg;
    }
    w.barrier();
}

// The benchmark runs under MPI too (small sizes; the numbers are not checked).
TEST(Comm, BenchRuns) {
    bench::CommBenchOptions o;
    o.max_bytes = 16 << 10;
    o.repeats   = 2;
    testing::internal::CaptureStdout();
    EXPECT_EQ(bench::run_comm_bench(test_world(), o), 0);
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(out.find("comm bench") != std::string::npos, test_world().rank() == 0) << out;
}

}  // namespace
}  // namespace bagualu::dist

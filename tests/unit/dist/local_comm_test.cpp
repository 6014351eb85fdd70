// LocalComm: the one-process Comm behaves as a world of size 1 (copies and identities), and every
// algorithm built on Comm runs on it unchanged. Also: init_world without a launcher gives it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "dist/comm/alltoallv.h"
#include "dist/comm/checks.h"
#include "dist/comm/collectives.h"
#include "dist/comm/comm.h"

namespace bagualu::dist {
namespace {

// parallel.a2a_grid's rows tile both the exchange and the switch groups: gcd, and no grid when
// that leaves a single phase.
TEST(GridRows, TileTheExchangeAndTheSwitchGroups) {
    EXPECT_EQ(grid_rows(256, 19200), 256);
    EXPECT_EQ(grid_rows(256, 24000), 64);
    EXPECT_EQ(grid_rows(256, 9600), 128);
    EXPECT_EQ(grid_rows(2, 4), 2);
    EXPECT_EQ(grid_rows(7, 19200), 0);  // rows of one rank
    EXPECT_EQ(grid_rows(256, 128), 0);  // one row holds every rank
    EXPECT_EQ(grid_rows(0, 19200), 0);  // off
    EXPECT_EQ(grid_rows(256, 1), 0);
}

TEST(LocalComm, IsOneRank) {
    auto c = make_local_comm();
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->size(), 1);
    EXPECT_TRUE(c->threads_serialized());
    EXPECT_TRUE(c->threads_multiple());
    c->barrier();
}

TEST(LocalComm, ReductionsAreIdentities) {
    auto c = make_local_comm();
    std::vector<float> f{1.5f, -2.0f};
    std::vector<double> d{3.0};
    std::vector<int64_t> i{7, -8};
    c->allreduce_sum(std::span<float>(f));
    c->allreduce_sum(std::span<double>(d));
    c->allreduce_sum(std::span<int64_t>(i));
    c->allreduce_max(std::span<double>(d));
    c->allreduce_max(std::span<int64_t>(i));
    EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f}));
    EXPECT_EQ(d, (std::vector<double>{3.0}));
    EXPECT_EQ(i, (std::vector<int64_t>{7, -8}));
    int x = 42;
    c->broadcast(&x, sizeof(x), 0);
    EXPECT_EQ(x, 42);
}

TEST(LocalComm, GathersAndAllToAllsCopy) {
    auto c      = make_local_comm();
    const int v = 17;
    int out     = 0;
    c->allgather(&v, sizeof(v), &out);
    EXPECT_EQ(out, 17);
    int scattered = 0;
    c->scatter(&v, sizeof(v), &scattered, 0);
    EXPECT_EQ(scattered, 17);
    int started = 0;
    c->scatter_start(&v, sizeof(v), &started, 0);
    c->scatter_wait();
    EXPECT_EQ(started, 17);

    std::vector<int64_t> sc{5}, rc{0};
    c->alltoall(sc, rc);
    EXPECT_EQ(rc[0], 5);

    std::vector<int32_t> send{0, 1, 2, 3, 4, 5};
    std::vector<int32_t> recv(8, -1);
    const std::vector<int64_t> counts{3}, sd{2}, rd{4};
    c->alltoallv<int32_t>(send, counts, sd, recv, counts, rd);
    EXPECT_EQ(recv, (std::vector<int32_t>{-1, -1, -1, -1, 2, 3, 4, -1}));

    std::vector<int32_t> recv2(8, -1);
    alltoallv_pairwise(*c, send.data(), counts, sd, recv2.data(), counts, rd, sizeof(int32_t));
    EXPECT_EQ(recv2, recv);

    std::vector<int32_t> recv3(8, -1);
    auto groups = make_node_groups(*c);
    alltoallv_hierarchical(*c, groups, send.data(), counts, sd, recv3.data(), counts, rd,
                           sizeof(int32_t));
    EXPECT_EQ(recv3, recv);
}

TEST(LocalComm, SendrecvToItselfAndSplit) {
    auto c         = make_local_comm();
    const double a = 2.5;
    double b       = 0;
    c->sendrecv(&a, sizeof(a), 0, &b, sizeof(b), 0);
    EXPECT_EQ(b, 2.5);
    EXPECT_THROW(c->sendrecv(&a, sizeof(a), 1, &b, sizeof(b), 1), InternalError);
    EXPECT_EQ(c->split(-1, 0), nullptr);
    auto sub = c->split(3, 0);
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), 1);
    EXPECT_EQ(c->split_shared()->size(), 1);
}

TEST(LocalComm, OwnCollectivesAreIdentities) {
    auto c = make_local_comm();
    std::vector<float> data(37);
    std::iota(data.begin(), data.end(), -5.0f);
    const auto orig = data;
    allreduce_mean(*c, data);
    EXPECT_EQ(data, orig);
    std::vector<float> out(37);
    reduce_scatter_mean(*c, orig, out);
    EXPECT_EQ(out, orig);
    std::vector<float> native(37);
    c->reduce_scatter_sum_native(orig, native);
    EXPECT_EQ(native, orig);
    std::vector<uint16_t> h{1, 2, 3};
    allreduce_mean_bf16(*c, h);
    allreduce_mean_fp16(*c, h);
    EXPECT_EQ(h, (std::vector<uint16_t>{1, 2, 3}));
}

TEST(LocalComm, ChecksPassOnOneRank) {
    auto c = make_local_comm();
    check_same_everywhere(*c, 0x1234, "config");
    check_all_ok(*c, true, "unused");
}

TEST(LocalCommDeathTest, CheckAllOkExitsWithStatus2) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto c = make_local_comm();
    EXPECT_EXIT(check_all_ok(*c, false, "bad config: lr < 0"), testing::ExitedWithCode(2),
                "error: bad config: lr < 0");
}

TEST(InitWorld, WithoutLauncherIsLocal) {
    if (launched_by_mpi()) GTEST_SKIP() << "started by a launcher";
    int argc    = 0;
    char** argv = nullptr;
    auto world  = init_world(&argc, &argv);
    EXPECT_EQ(world->size(), 1);
    EXPECT_EQ(world->rank(), 0);
    finalize_world();
}

}  // namespace
}  // namespace bagualu::dist

// TokenDispatcher's half-precision payloads (moe/token_dispatcher.h) on every rank count: rows
// that already hold bf16 / fp16 values arrive exactly as with the float32 payload, in both
// directions; other rows arrive rounded to the payload type.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "dist/parallel.h"
#include "moe/token_dispatcher.h"
#include "mpi_world.h"

namespace bagualu::moe {
namespace {

TEST(DispatcherHalf, HalfPayloadIsExactOnHalfValues) {
    dist::Comm& world = dist::test_world();
    const int P = world.size(), E = 2 * P, C = 5;
    dist::ParallelContext par(world, P, false);
    // rank r sends e + r + 1 rows to global expert e
    std::vector<int32_t> tpe(static_cast<size_t>(E));
    int rows = 0;
    for (int e = 0; e < E; ++e) rows += tpe[static_cast<size_t>(e)] = e + world.rank() + 1;
    TokenDispatcher d(par, E, C, rows, int64_t{P} * rows, 1);  // unbounded: one round
    d.dispatch_preprocess(tpe.data());
    for (const Dtype dt : {Dtype::bfloat16, Dtype::float16}) {
        std::vector<float> x(static_cast<size_t>(rows) * C), xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            x[i]  = 0.1f * static_cast<float>(i) + 0.37f * static_cast<float>(world.rank()) - 3.0f;
            xr[i] = round_to(dt, x[i]);
        }
        const size_t local = static_cast<size_t>(d.local_rows()) * C;
        std::vector<float> a(local), b(local), back_a(x.size()), back_b(x.size()), c(local);
        d.dispatch(a.data(), xr.data(), Dtype::float32);
        d.dispatch(b.data(), xr.data(), dt);
        EXPECT_EQ(a, b) << dtype_name(dt);
        d.combine(back_a.data(), a.data(), Dtype::float32);
        d.combine(back_b.data(), b.data(), dt);
        EXPECT_EQ(back_a, xr) << dtype_name(dt);
        EXPECT_EQ(back_b, xr) << dtype_name(dt);
        // unrounded rows: the payload rounds them
        d.dispatch(c.data(), x.data(), dt);
        EXPECT_EQ(c, a) << dtype_name(dt);
    }
}

// Rounds (token_dispatcher.h): with a budget of 7 rows and blocks of 3, every local expert
// receives, over the rounds, its rows from source 0, then source 1, ... each in order (the order
// one round gives), never more than 7 rows a round, and combine brings every row back home.
TEST(DispatcherRounds, RoundsDeliverEachExpertsRowsInSourceOrder) {
    dist::Comm& world = dist::test_world();
    const int P = world.size(), El = 2, E = El * P, C = 2, rank = world.rank();
    dist::ParallelContext par(world, P, false);
    // rank r sends (e * 3 + r) % 5 rows to global expert e: some zero, skewed by rank
    auto count = [](int e, int r) { return (e * 3 + r) % 5; };
    std::vector<int32_t> tpe(static_cast<size_t>(E));
    int rows = 0, max_rows = 0;
    for (int r = 0; r < P; ++r) {
        int n = 0;
        for (int e = 0; e < E; ++e) n += count(e, r);
        max_rows = std::max(max_rows, n);
        if (r == rank) rows = n;
    }
    for (int e = 0; e < E; ++e) tpe[static_cast<size_t>(e)] = count(e, rank);
    TokenDispatcher d(par, E, C, max_rows, 7, 3);
    d.dispatch_preprocess(tpe.data());
    // row i of rank r holds (r, i)
    std::vector<float> x(static_cast<size_t>(rows) * C), back(x.size(), -1.0f);
    for (int i = 0; i < rows; ++i) {
        x[static_cast<size_t>(i) * C]     = static_cast<float>(rank);
        x[static_cast<size_t>(i) * C + 1] = static_cast<float>(i);
    }
    std::vector<std::vector<std::pair<int, int>>> got(static_cast<size_t>(El));
    std::vector<float> local(7 * C);
    for (int r = 0; r < d.rounds(); ++r) {
        d.set_round(r);
        ASSERT_LE(d.local_rows(), 7);
        d.dispatch(local.data(), x.data());
        for (int e = 0; e < El; ++e) {
            for (int i = d.local_offsets()[e]; i < d.local_offsets()[e + 1]; ++i) {
                const float* row = local.data() + static_cast<size_t>(i) * C;
                got[static_cast<size_t>(e)].emplace_back(static_cast<int>(row[0]),
                                                         static_cast<int>(row[1]));
            }
        }
        d.combine(back.data(), local.data());
    }
    EXPECT_EQ(back, x);
    for (int e = 0; e < El; ++e) {
        const int g = rank * El + e;
        std::vector<std::pair<int, int>> want;
        for (int s = 0; s < P; ++s) {
            int first = 0;  // source s's rows of expert g start after its rows of experts < g
            for (int e2 = 0; e2 < g; ++e2) first += count(e2, s);
            for (int i = 0; i < count(g, s); ++i) want.emplace_back(s, first + i);
        }
        EXPECT_EQ(got[static_cast<size_t>(e)], want) << "local expert " << e;
    }
    // every rank derived the same number of rounds from the exchanged counts
    int64_t rounds = d.rounds(), max_rounds = rounds;
    world.allreduce_max(std::span<int64_t>(&max_rounds, 1));
    EXPECT_EQ(rounds, max_rounds);
}

}  // namespace
}  // namespace bagualu::moe

// TokenDispatcher's pieces (token_dispatcher.h chunks()): one round cut into pieces delivers
// each local expert's rows in the order the round does, every piece in its own region of the
// local buffer, and the pieces' combines bring every row home; exchanged on a helper thread
// (as moe_layer.cpp overlaps them), the result is the same.
#include <gtest/gtest.h>

#include <span>
#include <utility>
#include <vector>

#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "moe/token_dispatcher.h"
#include "mpi_world.h"

namespace bagualu::moe {
namespace {

TEST(DispatcherChunks, PiecesDeliverTheRoundsRowsInOrder) {
    dist::Comm& world = dist::test_world();
    const int P = world.size(), El = 2, E = El * P, C = 2, rank = world.rank();
    if (P < 2) GTEST_SKIP() << "needs an expert-parallel group of 2 or more ranks";
    dist::ParallelContext par(world, P, false);
    // rank r sends 3 + (e * 7 + r) % 11 rows to global expert e: skewed, none empty
    auto count = [](int e, int r) { return 3 + (e * 7 + r) % 11; };
    std::vector<int32_t> tpe(static_cast<size_t>(E));
    int rows = 0;
    for (int e = 0; e < E; ++e) rows += tpe[static_cast<size_t>(e)] = count(e, rank);
    const int max_rows   = 3 * E + 10 * E;         // above any rank's rows
    const int64_t budget = int64_t{P} * max_rows;  // unbounded: one round
    TokenDispatcher one(par, E, C, max_rows, budget, 2);
    TokenDispatcher cut(par, E, C, max_rows, budget, 2, 3);
    one.dispatch_preprocess(tpe.data());
    cut.dispatch_preprocess(tpe.data());
    ASSERT_EQ(one.rounds(), 1);
    ASSERT_EQ(cut.rounds(), 1);
    EXPECT_EQ(one.chunks(), 1);
    EXPECT_GE(cut.chunks(), 3) << "about a third of the largest receipt per piece";
    std::vector<float> x(static_cast<size_t>(rows) * C);  // row i of rank r holds (r, i)
    for (int i = 0; i < rows; ++i) {
        x[static_cast<size_t>(i) * C]     = static_cast<float>(rank);
        x[static_cast<size_t>(i) * C + 1] = static_cast<float>(i);
    }
    std::vector<float> whole(static_cast<size_t>(budget) * C);
    one.dispatch(whole.data(), x.data());
    for (const bool on_helper : {false, true}) {
        std::vector<float> local(whole.size(), -1.0f), back(x.size(), -1.0f);
        HelperThread helper;
        auto run = [&](auto&& job) {  // on the helper, or here
            if (on_helper) {
                helper.wait(helper.submit(job));
            } else {
                job();
            }
        };
        for (int c = 0; c < cut.chunks(); ++c) {
            run([&] { cut.dispatch_chunk(c, local.data(), x.data(), Dtype::float32); });
        }
        // expert e's rows: the pieces' rows of e in piece order are the round's rows of e
        for (int e = 0; e < El; ++e) {
            std::vector<float> got;
            for (int c = 0; c < cut.chunks(); ++c) {
                const int32_t* o    = cut.chunk_offsets(c);
                const float* region = local.data() + cut.chunk_base(c) * C;
                got.insert(got.end(), region + o[e] * C, region + o[e + 1] * C);
            }
            const std::vector<float> want(whole.data() + one.local_offsets()[e] * C,
                                          whole.data() + one.local_offsets()[e + 1] * C);
            EXPECT_EQ(got, want) << "local expert " << e << (on_helper ? ", on the helper" : "");
        }
        for (int c = 0; c < cut.chunks(); ++c) {
            run([&] { cut.combine_chunk(c, back.data(), local.data(), Dtype::float32); });
        }
        EXPECT_EQ(back, x) << "every row home" << (on_helper ? ", on the helper" : "");
    }
    // every rank derived the same number of pieces
    int64_t n = cut.chunks(), most = n;
    world.allreduce_max(std::span<int64_t>(&most, 1));
    EXPECT_EQ(n, most);
}

}  // namespace
}  // namespace bagualu::moe

// TokenDispatcher's half-precision payloads (moe/token_dispatcher.h) on every rank count: rows
// that already hold bf16 / fp16 values arrive exactly as with the float32 payload, in both
// directions; other rows arrive rounded to the payload type.
#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"
#include "dist/parallel.h"
#include "moe/token_dispatcher.h"
#include "mpi_world.h"

namespace bagualu::moe {
namespace {

TEST(DispatcherHalf, HalfPayloadIsExactOnHalfValues) {
    dist::Comm&           world = dist::test_world();
    const int             P = world.size(), E = 2 * P, C = 5;
    dist::ParallelContext par(world, P, false);
    // rank r sends e + r + 1 rows to global expert e
    std::vector<int32_t> tpe(static_cast<size_t>(E));
    int                  rows = 0;
    for (int e = 0; e < E; ++e) rows += tpe[static_cast<size_t>(e)] = e + world.rank() + 1;
    TokenDispatcher d(par, E, C, rows);
    d.dispatch_preprocess(tpe.data());
    for (const Dtype dt : {Dtype::bfloat16, Dtype::float16}) {
        std::vector<float> x(static_cast<size_t>(rows) * C), xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            x[i]  = 0.1f * static_cast<float>(i) + 0.37f * static_cast<float>(world.rank()) - 3.0f;
            xr[i] = round_to(dt, x[i]);
        }
        const size_t       local = static_cast<size_t>(d.local_rows()) * C;
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

}  // namespace
}  // namespace bagualu::moe

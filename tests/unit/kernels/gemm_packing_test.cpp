// The packing buffers our GEMMs keep (gemm/driver.h): packing_bound, which the planner counts per
// compute thread, against what fresh threads really grow and keep (pack_buffer_bytes) over every
// product no larger than the bound's dimensions: plain and grouped (joined), float32 and bf16,
// ragged and full-size, blocked for small, this CPU's and large caches, on 1, 2 and 3 threads (3:
// the shared op(B) of narrow products), on each of our packed paths this CPU has. The bound must
// hold, and must not be loose by more than a factor of 2 on the full-size products (a bound that
// ignored the caches or the threads would fail one or the other).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../common/fresh_threads.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/grouped_gemm.h"

namespace bagualu::kernels::gemm {
namespace {

// Every product of at most D x D x D the training step has the forms of: forward (NT), input
// gradient (NN), weight gradient (TN), float32 and bf16, at ragged and full sizes, and the
// grouped products of the experts (forward and weight gradient) over 8 uneven groups.
void run_products(int D) {
    std::vector<float> A(size_t(D) * D, 0.5f), B(size_t(D) * D, 0.25f), C(size_t(D) * D);
    std::vector<bf16> Ah(A.size(), bf16_from_float(0.5f)), Bh(B.size(), bf16_from_float(0.25f));
    const int sizes[] = {1, 7, D / 3 + 1, D / 2, D - 5, D};
    for (int M : sizes) {
        for (int N : sizes) {
            for (int K : {D / 4 + 3, D}) {
                if (M < 1 || N < 1 || K < 1) continue;
                gemm_f32(Trans::N, Trans::T, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(),
                         N);
                gemm_f32(Trans::T, Trans::N, M, N, K, 1.f, A.data(), M, B.data(), N, 0.f, C.data(),
                         N);
                gemm_bf16(Trans::N, Trans::N, M, N, K, 1.f, Ah.data(), K, Bh.data(), N, 0.f,
                          C.data(), N);
            }
        }
    }
    const int G = 8;
    std::vector<int32_t> offsets(G + 1, 0);
    for (int g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + D * (g % 3 + 1) / 6;
    const int rows = offsets[G];
    std::vector<float> X(size_t(rows) * D, 0.5f), W(size_t(G) * D * D, 0.25f),
        Y(size_t(std::max(rows, G * D)) * D);
    std::vector<bf16> Xh(X.size(), bf16_from_float(0.5f)), Wh(W.size(), bf16_from_float(0.25f));
    grouped_gemm_f32(Trans::N, Trans::T, G, offsets.data(), D, D, 1.f, X.data(), D, W.data(), D,
                     size_t(D) * D, 0.f, Y.data(), D);
    grouped_gemm_tn_f32(G, offsets.data(), D, D, 1.f, X.data(), D, X.data(), D, 0.f, W.data(), D,
                        size_t(D) * D);
    grouped_gemm_bf16(Trans::N, Trans::T, G, offsets.data(), D, D, 1.f, Xh.data(), D, Wh.data(), D,
                      size_t(D) * D, 0.f, Y.data(), D);
    grouped_gemm_tn_bf16(G, offsets.data(), D, D, 1.f, Xh.data(), D, Xh.data(), D, 0.f, W.data(), D,
                         size_t(D) * D);
}

// The bound of every product run_products(D) makes: float32 and bf16, plain and grouped.
PackingBound bound_of_products(Path p, const CacheSizes& caches, int threads, int D) {
    PackingBound b;
    for (const bool bf16 : {false, true}) {
        for (const PackDriver d :
             {PackDriver::packed, PackDriver::grouped, PackDriver::grouped_tn}) {
            b.join(packing_bound(p, caches, threads, D, D, D, bf16, d, cpu_features().avx512_bf16));
        }
    }
    return b;
}

TEST(GemmPacking, TheBoundHoldsWhatFreshThreadsKeepAndIsReached) {
    const CacheSizes small{8 << 10, 64 << 10, 1 << 20};
    const CacheSizes large{64 << 10, 4 << 20, size_t(256) << 20};
    const CacheSizes cpu = cache_sizes();
    const Path saved     = active_path();
    int ran              = 0;
    for (Path p : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!path_supported(p)) continue;
        set_active_path(p);
        for (const CacheSizes* caches : {&small, &cpu, &large}) {
            set_blocking_caches(caches);
            for (int threads : {1, 2, 3}) {
                for (int D : {64, 600}) {
                    SCOPED_TRACE(::testing::Message()
                                 << path_name(p) << " L2 " << caches->l2 << " L3 " << caches->l3
                                 << " threads " << threads << " D " << D);
                    const size_t grown = bagualu::testing::packing_growth_on_fresh_threads(
                        threads, [&] { run_products(D); });
                    const PackingBound b = bound_of_products(p, *caches, threads, D);
                    EXPECT_LE(grown, b.total(threads));
                    if (D == 600) {
                        EXPECT_GE(2 * grown, b.total(threads));
                    }
                    ++ran;
                }
            }
        }
    }
    set_blocking_caches(nullptr);
    set_active_path(saved);
    set_compute_threads(0);
    EXPECT_GT(ran, 0);
}

TEST(GemmPacking, PathsOutsideOursKeepNothingAndNamesRoundTrip) {
    const CacheSizes c = cache_sizes();
    for (Path p : {Path::ref, Path::openblas, Path::onednn}) {
        EXPECT_EQ(packing_bound(p, c, 4, 1000, 1000, 1000, false).total(4), 0u) << path_name(p);
    }
    EXPECT_GT(packing_bound(Path::generic, c, 4, 1000, 1000, 1000, false).total(4), 0u);
    EXPECT_EQ(packing_bound(Path::automatic, c, 2, 900, 900, 900, true).total(2),
              packing_bound(best_path(), c, 2, 900, 900, 900, true).total(2));
    // the grouped products run ours under onednn
    EXPECT_EQ(packing_bound(Path::onednn, c, 2, 900, 900, 900, false, PackDriver::grouped).total(2),
              packing_bound(best_path(), c, 2, 900, 900, 900, false, PackDriver::grouped).total(2));
    for (Path p : {Path::ref, Path::generic, Path::avx2, Path::avx512, Path::amx, Path::openblas,
                   Path::onednn, Path::automatic}) {
        EXPECT_EQ(path_of_name(path_name(p)), p);
    }
    EXPECT_FALSE(path_of_name("avx1024").has_value());
    // more threads keep more; the per-thread share shrinks with the L3 each one gets
    const PackingBound one  = packing_bound(Path::generic, c, 1, 4096, 4096, 4096, false);
    const PackingBound many = packing_bound(Path::generic, c, 64, 4096, 4096, 4096, false);
    EXPECT_GT(many.total(64), one.total(1));
    EXPECT_LE(many.b, one.b);
    EXPECT_EQ(one.shared_b, 0u);  // one thread never packs op(B) for others
    EXPECT_GT(many.shared_b, 0u);
}

}  // namespace
}  // namespace bagualu::kernels::gemm

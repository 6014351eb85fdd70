// gemm_packed blocked for other caches (gemm/driver.h set_blocking_caches): small, the CPU's and
// large L2/L3 give other MC and strip widths; KC stays the spec's, so every element is summed in
// the same order and the results are bit for bit those of the CPU's blocking, and within the
// float32 rounding bound of the double-accumulating reference, on ragged shapes, on each of our
// packed paths this CPU has, float32 and bf16, on 1 and 3 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/gemm/kernels.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels::gemm {
namespace {

struct Shape {
    int M, N, K;
};

// Normal operands of shape s (A M x K, B K x N, both by row) and their bf16 roundings.
struct Operands {
    std::vector<float> A, B;
    std::vector<bf16> Ah, Bh;
};
Operands random_operands(const Shape& s, uint64_t seed) {
    Rng rng(seed);
    Operands o;
    o.A.resize(size_t(s.M) * s.K);
    o.B.resize(size_t(s.K) * s.N);
    for (auto& x : o.A) x = static_cast<float>(rng.normal());
    for (auto& x : o.B) x = static_cast<float>(rng.normal());
    o.Ah.resize(o.A.size());
    o.Bh.resize(o.B.size());
    for (size_t i = 0; i < o.A.size(); ++i) o.Ah[i] = bf16_from_float(o.A[i]);
    for (size_t i = 0; i < o.B.size(); ++i) o.Bh[i] = bf16_from_float(o.B[i]);
    return o;
}

// C (M x N, every element c0) = op(A) B + beta * C, NN, on the float operands or their bf16 ones.
std::vector<float> nn_product(const Shape& s, const Operands& o, bool bf, float c0, float beta) {
    std::vector<float> C(size_t(s.M) * s.N, c0);
    if (bf) {
        gemm_bf16(Trans::N, Trans::N, s.M, s.N, s.K, 1.f, o.Ah.data(), s.K, o.Bh.data(), s.N, beta,
                  C.data(), s.N);
    } else {
        gemm_f32(Trans::N, Trans::N, s.M, s.N, s.K, 1.f, o.A.data(), s.K, o.B.data(), s.N, beta,
                 C.data(), s.N);
    }
    return C;
}

TEST(GemmBlockingTest, EveryBlockingGivesTheSameBitsAndMatchesTheReference) {
    const CacheSizes small{8 << 10, 64 << 10, 1 << 20};
    const CacheSizes large{64 << 10, 8 << 20, size_t(1) << 30};
    const CacheSizes cpu = cache_sizes();
    EXPECT_GT(cpu.l1d, 0u);
    EXPECT_GE(cpu.l2, cpu.l1d);
    const Path saved = active_path();
    for (Path p : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!path_supported(p)) continue;
        set_active_path(p);
        for (int threads : {1, 3}) {
            set_compute_threads(threads);
            for (const Shape s :
                 {Shape{1, 1, 1}, Shape{7, 129, 257}, Shape{129, 7, 1000}, Shape{257, 1025, 200},
                  Shape{700, 300, 450}, Shape{50, 1100, 1100}}) {
                for (const bool bf : {false, true}) {
                    SCOPED_TRACE(::testing::Message()
                                 << path_name(p) << " threads " << threads << " " << s.M << "x"
                                 << s.N << "x" << s.K << (bf ? " bf16" : " f32"));
                    const Operands ops =
                        random_operands(s, static_cast<uint64_t>(s.M * 131 + s.N * 7 + s.K));
                    const auto& [A, B, Ah, Bh] = ops;
                    auto run                   = [&](const CacheSizes* c) {
                        set_blocking_caches(c);
                        std::vector<float> C = nn_product(s, ops, bf, 0.5f, 1.f);
                        set_blocking_caches(nullptr);
                        return C;
                    };
                    const std::vector<float> c_cpu = run(nullptr);
                    EXPECT_EQ(run(&small), c_cpu);
                    EXPECT_EQ(run(&large), c_cpu);
                    // the reference, in double, on the same (rounded for bf16) operands
                    std::vector<float> R(c_cpu.size(), 0.5f);
                    if (bf) {
                        ref::gemm_bf16(Trans::N, Trans::N, s.M, s.N, s.K, 1.f, Ah.data(), s.K,
                                       Bh.data(), s.N, 1.f, R.data(), s.N);
                    } else {
                        ref::gemm_f32(Trans::N, Trans::N, s.M, s.N, s.K, 1.f, A.data(), s.K,
                                      B.data(), s.N, 1.f, R.data(), s.N);
                    }
                    // float32 sums of K products of N(0,1) values: the error is at most about
                    // K * 2^-24 * sum |a b| <= K * 6e-8 * K (|a b| ~ 1), far below 1e-4 * K here
                    for (size_t i = 0; i < R.size(); ++i) {
                        ASSERT_NEAR(c_cpu[i], R[i], 1e-5 * s.K + 1e-5) << "element " << i;
                    }
                }
            }
        }
    }
    set_blocking_caches(nullptr);
    set_compute_threads(0);
    set_active_path(saved);
}

// Two threads on rows of C under a page each (N * 4 bytes < two pages) take runs of row blocks
// over every strip instead of runs of strips (driver.cpp Plan::by_rows): the same units, so the
// bits of one thread, on each of our packed paths this CPU has, float32 and bf16, with the CPU's
// caches and with small ones (many strips); and the plan does take row runs where it should.
TEST(GemmBlockingTest, RowRangesGiveTheBitsOfOneThread) {
    const CacheSizes small{8 << 10, 64 << 10, 1 << 20};
    const Path saved = active_path();
    int by_rows      = 0;
    for (Path p : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!path_supported(p)) continue;
        set_active_path(p);
        for (const Shape s : {Shape{600, 1000, 300}, Shape{1030, 700, 257}, Shape{513, 2040, 64}}) {
            for (const bool bf : {false, true}) {
                for (const CacheSizes* caches : {static_cast<const CacheSizes*>(nullptr), &small}) {
                    SCOPED_TRACE(::testing::Message()
                                 << path_name(p) << " " << s.M << "x" << s.N << "x" << s.K
                                 << (bf ? " bf16" : " f32") << (caches ? " small caches" : ""));
                    const Operands ops =
                        random_operands(s, static_cast<uint64_t>(s.M * 31 + s.N * 5 + s.K));
                    set_blocking_caches(caches);
                    const KernelSpec& spec = bf ? bf16_spec(p) : f32_spec(p);
                    by_rows += ranges_by_rows(spec, s.M, s.N, s.K, 2) ? 1 : 0;
                    EXPECT_FALSE(ranges_by_rows(spec, s.M, s.N, s.K, 1));
                    auto run = [&](int threads) {
                        set_compute_threads(threads);
                        return nn_product(s, ops, bf, 0.25f, 0.5f);
                    };
                    EXPECT_EQ(run(2), run(1));
                    set_blocking_caches(nullptr);
                }
            }
        }
    }
    set_compute_threads(0);
    set_active_path(saved);
    // the float32 kernels walk their tiles row by row: with small caches they split every shape
    EXPECT_GT(by_rows, 0);
}

// The register tiles of a k block row by row or column by column (KernelSpec::column_tiles_outer,
// driver.cpp for_tiles): only which tile runs first changes, so every kernel this CPU runs gives
// the same bits either way, in gemm_packed (one strip a thread, and the shared-B scheme of more
// threads than strips) and gemm_rect (the grouped GEMM's rectangles), with op(A) packed (NN) and
// read in place (TN, the float kernels' micro_cols).
TEST(GemmBlockingTest, EitherTileOrderGivesTheSameBits) {
    struct Kernel {
        Path path;
        const KernelSpec* spec;
        bool half;
    };
    const std::vector<Kernel> kernels = {
        {Path::generic, &generic::f32_kernel(), false},
        {Path::generic, &generic::bf16_kernel(), true},
        {Path::avx2, &avx2::f32_kernel(), false},
        {Path::avx2, &avx2::bf16_kernel(), true},
        {Path::avx512, &avx512::f32_kernel(), false},
        {Path::avx512, &avx512::bf16_kernel(), true},
        {Path::avx512, cpu_features().avx512_bf16 ? &avx512::bf16_dot_kernel() : nullptr, true},
        {Path::amx, &avx512::bf16_amx_kernel(), true},
    };
    int ran = 0;
    for (const Kernel& k : kernels) {
        if (!k.spec || !path_supported(k.path)) continue;
        KernelSpec flipped         = *k.spec;
        flipped.column_tiles_outer = !k.spec->column_tiles_outer;
        for (int threads : {1, 2, 5}) {
            set_compute_threads(threads);
            for (const Shape s : {Shape{37, 70, 300}, Shape{250, 130, 1000}, Shape{7, 129, 257}}) {
                for (const Trans ta : {Trans::N, Trans::T}) {
                    SCOPED_TRACE(::testing::Message()
                                 << path_name(k.path) << (k.half ? " bf16" : " f32") << " threads "
                                 << threads << " " << s.M << "x" << s.N << "x" << s.K
                                 << (ta == Trans::T ? " TN" : " NN"));
                    const auto [A, B, Ah, Bh] =
                        random_operands(s, static_cast<uint64_t>(s.M * 31 + s.N * 17 + s.K));
                    const void* a = k.half ? static_cast<const void*>(Ah.data()) : A.data();
                    const void* b = k.half ? static_cast<const void*>(Bh.data()) : B.data();
                    const int lda = ta == Trans::N ? s.K : s.M;
                    auto packed   = [&](const KernelSpec& spec) {
                        std::vector<float> C(size_t(s.M) * s.N, 0.25f);
                        gemm_packed(spec, ta, Trans::N, s.M, s.N, s.K, 1.5f, a, lda, b, s.N, 1.f,
                                      C.data(), s.N);
                        return C;
                    };
                    auto rect = [&](const KernelSpec& spec) {
                        std::vector<float> C(size_t(s.M) * s.N, 0.25f);
                        const PackSrc pa{a, lda, ta == Trans::N};
                        const PackSrc pb{b, s.N, false};
                        gemm_rect(spec, pa, pb, 0, s.M, 0, s.N, s.K, 1.5f, 1.f, C.data(), s.N);
                        return C;
                    };
                    const std::vector<float> c = packed(*k.spec);
                    EXPECT_EQ(packed(flipped), c);
                    EXPECT_EQ(rect(*k.spec), c);
                    EXPECT_EQ(rect(flipped), c);
                    ++ran;
                }
            }
        }
    }
    EXPECT_GT(ran, 0);
    set_compute_threads(0);
}

}  // namespace
}  // namespace bagualu::kernels::gemm

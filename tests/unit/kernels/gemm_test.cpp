// gemm_f32 / gemm_bf16 on every implementation this CPU supports, forced in turn, against the
// double-accumulating reference: random ragged shapes (1..300, edge tiles), all four transposes,
// alpha/beta (beta = 0 over a NaN-filled C), padded leading dimensions, degenerate sizes, and
// bit-identical results for 1, 2 and 3 threads.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "gemm_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/grouped_gemm.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels {
namespace {

using gemm::Path;

constexpr float kSentinel = -12345.0f;  // fills C beyond N: must never be written

using testing::PathGuard;
using testing::supported_paths;

struct Case {
    Trans ta, tb;
    int M, N, K;
    float alpha, beta;
    int pad_a, pad_b, pad_c;  // leading dimension minus the stored row width
};

struct Problem {
    Case c;
    int lda, ldb, ldc;
    std::vector<float> A, B, C0;  // C0 is all NaN inside (M, N) when beta == 0
    std::vector<bf16> A16, B16;
    std::vector<float> A_rounded, B_rounded;  // the bf16 inputs, widened back to float
};

std::vector<float> random_matrix(Rng& rng, int rows, int ld) {
    std::vector<float> m(size_t(rows) * size_t(ld));
    for (float& x : m) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
    return m;
}

Problem make_problem(const Case& c, uint64_t seed) {
    Rng rng(seed);
    Problem p{c, 0, 0, 0, {}, {}, {}, {}, {}, {}, {}};
    const int a_rows = c.ta == Trans::N ? c.M : c.K, a_cols = c.ta == Trans::N ? c.K : c.M;
    const int b_rows = c.tb == Trans::N ? c.K : c.N, b_cols = c.tb == Trans::N ? c.N : c.K;
    p.lda = std::max(a_cols, 1) + c.pad_a;
    p.ldb = std::max(b_cols, 1) + c.pad_b;
    p.ldc = std::max(c.N, 1) + c.pad_c;
    p.A   = random_matrix(rng, a_rows, p.lda);
    p.B   = random_matrix(rng, b_rows, p.ldb);
    p.C0  = random_matrix(rng, c.M, p.ldc);
    for (int i = 0; i < c.M; ++i) {
        for (int j = 0; j < p.ldc; ++j) {
            float& x = p.C0[size_t(i) * size_t(p.ldc) + size_t(j)];
            if (j >= c.N)
                x = kSentinel;
            else if (c.beta == 0.0f)
                x = std::numeric_limits<float>::quiet_NaN();
        }
    }
    for (float x : p.A) p.A16.push_back(bf16_from_float(x));
    for (float x : p.B) p.B16.push_back(bf16_from_float(x));
    for (bf16 x : p.A16) p.A_rounded.push_back(bf16_to_float(x));
    for (bf16 x : p.B16) p.B_rounded.push_back(bf16_to_float(x));
    return p;
}

std::vector<float> abs_of(std::vector<float> v) {
    for (float& x : v) x = std::isnan(x) ? 0.0f : std::fabs(x);
    return v;
}

// Checks C against the reference on inputs A, B (float or bf16-rounded). Tolerance: the
// classical worst-case bound for a float dot product of length K plus the alpha/beta update,
// |err| <= (K + 4) u * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|), u = 2^-24; the magnitudes come
// from the same reference run on absolute values. It never fails for a correct kernel, whatever
// its summation order or FMA use, while a wrong or missing term costs ~1/K of the magnitude.
void expect_matches(const Problem& p, const std::vector<float>& A, const std::vector<float>& B,
                    const std::vector<float>& C, const char* what) {
    const Case& c          = p.c;
    std::vector<float> ref = p.C0;
    ref::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), p.lda, B.data(), p.ldb, c.beta,
                  ref.data(), p.ldc);
    std::vector<float> mag = abs_of(p.C0);
    ref::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, std::fabs(c.alpha), abs_of(A).data(), p.lda,
                  abs_of(B).data(), p.ldb, std::fabs(c.beta), mag.data(), p.ldc);
    const double u = std::ldexp(1.0, -24);
    int bad        = 0;
    for (int i = 0; i < c.M && bad < 5; ++i) {
        for (int j = 0; j < p.ldc && bad < 5; ++j) {
            const size_t k   = size_t(i) * size_t(p.ldc) + size_t(j);
            const double tol = (c.K + 4) * u * mag[k] + 1e-30;
            const bool ok =
                j >= c.N ? C[k] == kSentinel : std::fabs(double(C[k]) - double(ref[k])) <= tol;
            if (!ok) {
                ++bad;
                ADD_FAILURE() << what << " ta=" << int(c.ta) << " tb=" << int(c.tb) << " M=" << c.M
                              << " N=" << c.N << " K=" << c.K << " alpha=" << c.alpha
                              << " beta=" << c.beta << " at (" << i << "," << j << "): got " << C[k]
                              << " want " << ref[k] << " tol " << tol;
            }
        }
    }
}

void run_f32(const Problem& p, std::vector<float>& C) {
    const Case& c = p.c;
    C             = p.C0;
    gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, c.beta,
             C.data(), p.ldc);
}

void run_bf16(const Problem& p, std::vector<float>& C) {
    const Case& c = p.c;
    C             = p.C0;
    gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, p.A16.data(), p.lda, p.B16.data(), p.ldb, c.beta,
              C.data(), p.ldc);
}

void check_all_paths(const Case& c, uint64_t seed) {
    const Problem p = make_problem(c, seed);
    PathGuard guard;
    std::vector<float> C;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        run_f32(p, C);
        expect_matches(p, p.A, p.B, C, (std::string("f32 ") + gemm::path_name(path)).c_str());
        run_bf16(p, C);
        expect_matches(p, p.A_rounded, p.B_rounded, C,
                       (std::string("bf16 ") + gemm::path_name(path)).c_str());
    }
}

int random_dim(Rng& rng) {
    return rng.uniform() < 0.5 ? 1 + int(rng.below(40)) : 1 + int(rng.below(300));
}

TEST(Gemm, RandomShapesAllTransposesAllPaths) {
    Rng rng(2024);
    for (int t = 0; t < 48; ++t) {
        Case c;
        c.ta                 = (t & 1) ? Trans::T : Trans::N;
        c.tb                 = (t & 2) ? Trans::T : Trans::N;
        c.M                  = random_dim(rng);
        c.N                  = random_dim(rng);
        c.K                  = random_dim(rng);
        const float alphas[] = {1.0f, -0.5f, 2.0f};
        const float betas[]  = {0.0f, 1.0f, 0.75f};
        c.alpha              = alphas[rng.below(3)];
        c.beta               = betas[rng.below(3)];
        c.pad_a              = int(rng.below(3)) * 7;
        c.pad_b              = int(rng.below(3)) * 5;
        c.pad_c              = int(rng.below(3)) * 3;
        check_all_paths(c, 100 + uint64_t(t));
    }
}

// Transpose case t (bit 0: A, bit 1: B) of shape d = {M, N, K}, alpha 1.5, padded rows.
Case transposes_case(int t, const int (&d)[3], float beta, int pad_b) {
    return Case{(t & 1) ? Trans::T : Trans::N,
                (t & 2) ? Trans::T : Trans::N,
                d[0],
                d[1],
                d[2],
                1.5f,
                beta,
                3,
                pad_b,
                1};
}

TEST(Gemm, EdgeTilesAroundRegisterAndCacheBlocks) {
    // Sizes one off the tile widths (4/6/12 rows, 8/16/32 columns) and the k blocks (192/256/384).
    const int dims[][3] = {{5, 15, 255},
                           {7, 17, 257},
                           {11, 31, 193},
                           {13, 33, 385},
                           {25, 47, 129},
                           {289, 65, 513},
                           {1, 300, 3},
                           {300, 1, 2},
                           // deep enough that a packed column strip is narrowed to fit its cap
                           {2, 100, 21000}};
    int seed            = 0;
    for (const auto& d : dims) {
        for (int t = 0; t < 4; ++t) {
            check_all_paths(transposes_case(t, d, 0.5f, 0), 500 + uint64_t(seed++));
        }
    }
}

TEST(Gemm, DegenerateSizesAndScalars) {
    const Case cases[] = {
        {Trans::N, Trans::N, 1, 1, 1, 1.0f, 0.0f, 0, 0, 0},
        {Trans::T, Trans::T, 1, 1, 1, -2.0f, 3.0f, 2, 2, 2},
        {Trans::N, Trans::T, 1, 37, 1, 1.0f, 1.0f, 0, 0, 0},
        {Trans::T, Trans::N, 37, 1, 19, 1.0f, 0.0f, 0, 4, 4},
        {Trans::N, Trans::N, 9, 21, 0, 1.0f, 0.0f, 1, 1, 1},    // K = 0, beta = 0: C = 0
        {Trans::N, Trans::N, 9, 21, 0, 1.0f, 0.5f, 1, 1, 1},    // K = 0: C = beta C
        {Trans::T, Trans::N, 33, 17, 40, 0.0f, 2.0f, 0, 0, 0},  // alpha = 0: C = beta C
    };
    int seed = 0;
    for (const Case& c : cases) check_all_paths(c, 900 + uint64_t(seed++));
}

TEST(Gemm, ZeroRowsOrColumnsTouchNothing) {
    PathGuard guard;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        std::vector<float> A(64, 1.0f), B(64, 1.0f), C(64, kSentinel);
        std::vector<bf16> A16(64, bf16_from_float(1.0f)), B16 = A16;
        gemm_f32(Trans::N, Trans::N, 0, 8, 8, 1.0f, A.data(), 8, B.data(), 8, 0.0f, C.data(), 8);
        gemm_f32(Trans::N, Trans::N, 8, 0, 8, 1.0f, A.data(), 8, B.data(), 8, 0.0f, C.data(), 8);
        gemm_bf16(Trans::N, Trans::N, 0, 8, 8, 1.0f, A16.data(), 8, B16.data(), 8, 0.0f, C.data(),
                  8);
        for (float x : C) EXPECT_EQ(x, kSentinel) << gemm::path_name(path);
    }
}

// Work is split over M and N only, so each element is summed in the same order whatever the
// thread count and whichever thread takes which part: results must be bitwise equal.
TEST(Gemm, BitIdenticalForAnyThreadCount) {
    PathGuard guard;
    const Case cases[] = {{Trans::N, Trans::T, 256, 200, 300, 1.0f, 0.0f, 0, 0, 0},
                          {Trans::T, Trans::N, 37, 500, 129, 0.5f, 1.0f, 3, 0, 5},
                          {Trans::N, Trans::N, 611, 45, 260, 1.0f, 0.25f, 0, 1, 0},
                          // one strip, several k blocks: a range of units per thread (2
                          // threads), B packed once for all threads (3: more than 2 a strip)
                          {Trans::N, Trans::N, 150, 600, 700, 1.0f, 0.0f, 0, 0, 0},
                          // few rows, two strips: the ranges are whole strips
                          {Trans::N, Trans::T, 40, 1100, 1000, 1.0f, 0.0f, 0, 0, 0},
                          // one unit, deep: fewer ranges than threads (2 threads)
                          {Trans::N, Trans::N, 12, 40, 3000, 1.0f, 0.0f, 0, 0, 0}};
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        for (const Case& c : cases) {
            const Problem p = make_problem(c, 77);
            std::vector<float> f32[3], b16[3];
            for (int t = 1; t <= 3; ++t) {
                set_compute_threads(t);
                run_f32(p, f32[t - 1]);
                run_bf16(p, b16[t - 1]);
            }
            for (int t = 1; t < 3; ++t) {
                EXPECT_EQ(0, std::memcmp(f32[0].data(), f32[t].data(), f32[0].size() * 4))
                    << gemm::path_name(path) << " f32, " << t + 1 << " threads, M=" << c.M;
                EXPECT_EQ(0, std::memcmp(b16[0].data(), b16[t].data(), b16[0].size() * 4))
                    << gemm::path_name(path) << " bf16, " << t + 1 << " threads, M=" << c.M;
            }
        }
    }
    set_compute_threads(0);
}

// Where gemm_bf16_widens() says so, gemm_f32 on the bf16 values widened to float is gemm_bf16
// itself (the half linears of kernels/mixed.h then skip the 16-bit copies): bitwise, on our
// kernels and OpenBLAS. Where it does not (AVX512_BF16 dot products, oneDNN's bf16 matmul), the
// two differ in rounding, and the claim would be wrong for them.
TEST(Gemm, Bf16WideningPathsEqualFloatOnWidenedValues) {
    PathGuard guard;
    const Case cases[] = {{Trans::N, Trans::T, 256, 200, 300, 1.0f, 0.0f, 0, 0, 0},
                          {Trans::T, Trans::N, 37, 500, 129, 0.5f, 1.0f, 3, 0, 5},
                          {Trans::N, Trans::N, 150, 600, 700, 1.0f, 0.0f, 0, 0, 0}};
    int widening       = 0;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        // onednn / auto: gemm_f32 may run oneDNN's float matmul where gemm_bf16 runs ours
        if (!gemm_bf16_widens() || path == Path::onednn || path == Path::automatic) continue;
        ++widening;
        for (const Case& c : cases) {
            const Problem p = make_problem(c, 78);
            std::vector<float> b16, f32 = p.C0;
            run_bf16(p, b16);
            gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, p.A_rounded.data(), p.lda,
                     p.B_rounded.data(), p.ldb, c.beta, f32.data(), p.ldc);
            EXPECT_EQ(0, std::memcmp(b16.data(), f32.data(), f32.size() * 4))
                << gemm::path_name(path) << " M=" << c.M << " N=" << c.N << " K=" << c.K;
        }
    }
    EXPECT_GT(widening, 0) << "the generic path widens on every CPU";
    if (gemm::path_supported(Path::avx2)) {
        gemm::set_active_path(Path::avx2);
        EXPECT_TRUE(gemm_bf16_widens());
    }
}

// f(path, M, N, K) with each of our packed paths this CPU has made active, over widths on both
// sides of the threshold for reading A in place, several k blocks, and rows that end in a short
// tile.
template <typename F>
void over_in_place_shapes(F&& f) {
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        for (const int M : {5, 29, 203}) {
            for (const int N : {16, 40, 100, 300}) {
                for (const int K : {7, 300}) f(path, M, N, K);
            }
        }
    }
}

// op(A) stored by k (ta = T) is read in place by our packed paths when few column tiles read it
// (KernelSpec::micro_cols): bitwise the product on A stored by row (ta = N).
TEST(Gemm, TransposedAReadInPlaceGivesThePackedBits) {
    PathGuard guard;
    Rng rng(17);
    over_in_place_shapes([&](Path path, int M, int N, int K) {
        std::vector<float> a(size_t(M) * K), at(a.size()), b(size_t(K) * N);
        for (float& v : a) v = float(rng.normal());
        for (float& v : b) v = float(rng.normal());
        for (int i = 0; i < M; ++i) {
            for (int k = 0; k < K; ++k) at[size_t(k) * M + i] = a[size_t(i) * K + k];
        }
        std::vector<float> c1(size_t(M) * N, 0.5f), c2 = c1;
        gemm_f32(Trans::N, Trans::N, M, N, K, 1.5f, a.data(), K, b.data(), N, 0.25f, c1.data(), N);
        gemm_f32(Trans::T, Trans::N, M, N, K, 1.5f, at.data(), M, b.data(), N, 0.25f, c2.data(), N);
        ASSERT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)))
            << gemm::path_name(path) << " M=" << M << " N=" << N << " K=" << K;
    });
}

// op(A) stored by row (ta = N) is read in place by our float packed paths when few column tiles
// read it (KernelSpec::micro_rows): bitwise the same columns of a product wide enough to pack A.
TEST(Gemm, RowsOfAReadInPlaceGiveThePackedBits) {
    PathGuard guard;
    Rng rng(23);
    constexpr int kWide = 600;  // columns enough for every kernel to pack A
    over_in_place_shapes([&](Path path, int M, int N, int K) {
        std::vector<float> a(size_t(M) * K), b(size_t(K) * kWide);
        for (float& v : a) v = float(rng.normal());
        for (float& v : b) v = float(rng.normal());
        std::vector<float> wide(size_t(M) * kWide, 0.5f), narrow(size_t(M) * N, 0.5f);
        gemm_f32(Trans::N, Trans::N, M, kWide, K, 1.5f, a.data(), K, b.data(), kWide, 0.25f,
                 wide.data(), kWide);
        gemm_f32(Trans::N, Trans::N, M, N, K, 1.5f, a.data(), K, b.data(), kWide, 0.25f,
                 narrow.data(), N);
        for (int i = 0; i < M; ++i) {
            ASSERT_EQ(0, std::memcmp(narrow.data() + size_t(i) * N, wide.data() + size_t(i) * kWide,
                                     size_t(N) * sizeof(float)))
                << gemm::path_name(path) << " M=" << M << " N=" << N << " K=" << K << " row " << i;
        }
    });
}

// A product's last row tile may hold fewer rows than the kernel's register tile (kernels/gemm/
// microkernel.h runs it on a shorter tile then): each of its rows has the bits of the same row
// in a product of more rows, for every height up to two tiles, op(A) stored by row or by k,
// float32 and bf16, alpha and beta; and so in the grouped products, A gathered by row (the
// experts' forward) and the weight-gradient form (its rows are the weight's).
TEST(Gemm, ShortRowTilesGiveTheRowsOfATallProduct) {
    PathGuard guard;
    Rng rng(29);
    constexpr int kTall = 48, N = 40, K = 37;  // 48: whole tiles of every kernel's rows
    std::vector<float> a(size_t(kTall) * K), at(a.size()), b(size_t(K) * N), c0(size_t(kTall) * N);
    for (float& v : a) v = float(rng.normal());
    for (float& v : b) v = float(rng.normal());
    for (float& v : c0) v = float(rng.normal());
    for (int i = 0; i < kTall; ++i) {
        for (int k = 0; k < K; ++k) at[size_t(k) * kTall + i] = a[size_t(i) * K + k];
    }
    std::vector<bf16> a16(a.size()), at16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = bf16_from_float(a[i]);
    for (size_t i = 0; i < at.size(); ++i) at16[i] = bf16_from_float(at[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = bf16_from_float(b[i]);
    std::vector<int32_t> rows(kTall);
    for (int i = 0; i < kTall; ++i) rows[size_t(i)] = (i * 7) % kTall;  // a permutation
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        // every form at M rows of C, from c0's
        auto products = [&](int M) {
            std::vector<std::vector<float>> out;
            for (const Trans ta : {Trans::N, Trans::T}) {
                const float* af = ta == Trans::N ? a.data() : at.data();
                const bf16* ah  = ta == Trans::N ? a16.data() : at16.data();
                const int lda   = ta == Trans::N ? K : kTall;
                std::vector<float> c(c0.begin(), c0.begin() + ptrdiff_t(M) * N);
                gemm_f32(ta, Trans::N, M, N, K, 1.5f, af, lda, b.data(), N, 0.25f, c.data(), N);
                out.push_back(c);
                c.assign(c0.begin(), c0.begin() + ptrdiff_t(M) * N);
                gemm_bf16(ta, Trans::N, M, N, K, 1.5f, ah, lda, b16.data(), N, 0.25f, c.data(), N);
                out.push_back(c);
            }
            const int32_t offsets[2] = {0, M};
            std::vector<float> c(c0.begin(), c0.begin() + ptrdiff_t(M) * N);
            grouped_gemm_f32(Trans::N, Trans::N, 1, offsets, N, K, 1.0f, a.data(), K, b.data(), N,
                             0, 0.25f, c.data(), N, rows.data());
            out.push_back(c);
            // C (M, N) = A^T (M, K rows) B (K rows, N): M of at's kTall columns
            const int32_t depth[2] = {0, K};
            c.assign(c0.begin(), c0.begin() + ptrdiff_t(M) * N);
            grouped_gemm_tn_f32(1, depth, M, N, 1.0f, at.data(), kTall, b.data(), N, 0.25f,
                                c.data(), N, 0);
            out.push_back(c);
            return out;
        };
        const auto tall = products(kTall);
        for (int M = 1; M <= 26; ++M) {
            const auto short_ = products(M);
            for (size_t f = 0; f < tall.size(); ++f) {
                ASSERT_EQ(
                    0, std::memcmp(short_[f].data(), tall[f].data(), size_t(M) * N * sizeof(float)))
                    << gemm::path_name(path) << " form " << f << " M=" << M;
            }
        }
    }
}

// The AMX-BF16 tile kernel, the default for bf16 where the CPU has it: every transpose against
// the float64 reference on shapes ragged around its 32 x 32 tile, its 32-deep k step and its
// k block (384; 192 for the experts' weight-gradient form), and through the float-B overload (B
// rounded as it is packed) bitwise the product on B's rounded copy.
TEST(Gemm, AmxTilesMatchTheReferenceOnRaggedShapes) {
    if (!gemm::path_supported(Path::amx)) {
        GTEST_SKIP()
            << "needs AMX-BF16 (CPUID amx_bf16 and amx_tile, tile state enabled by the OS)";
    }
    EXPECT_EQ(gemm::best_path(), Path::amx);
    PathGuard guard;
    gemm::set_active_path(Path::amx);
    EXPECT_FALSE(gemm_bf16_widens());
    ASSERT_TRUE(gemm_bf16_float_b());
    EXPECT_TRUE(gemm_bf16_float_b_rows());
    const int dims[][3] = {{1, 1, 1},     {31, 33, 31},  {32, 32, 32},    {33, 31, 33},
                           {17, 70, 383}, {65, 47, 385}, {100, 96, 1030}, {7, 5, 2}};
    int seed            = 0;
    for (const auto& d : dims) {
        for (int t = 0; t < 4; ++t) {
            const Case c    = transposes_case(t, d, t == 3 ? 0.0f : 0.5f, 2);
            const Problem p = make_problem(c, 900 + uint64_t(seed++));
            std::vector<float> C;
            run_bf16(p, C);
            expect_matches(p, p.A_rounded, p.B_rounded, C, "bf16 amx");
            std::vector<float> Cf = p.C0;
            gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, p.A16.data(), p.lda, p.B.data(), p.ldb,
                      c.beta, Cf.data(), p.ldc);
            EXPECT_EQ(0, std::memcmp(C.data(), Cf.data(), C.size() * sizeof(float)))
                << "float B, M=" << c.M << " N=" << c.N << " K=" << c.K;
        }
    }
}

// Where A is stored by row on 64-byte aligned rows and K is whole 32-deep k steps, the AMX kernel
// loads A's tiles where they lie instead of packing them (KernelSpec::micro_strided): bitwise the
// products on the packed rows, which the same A one element off its line alignment still gets
// (test above against the reference). Ragged M (a last short tile is packed), N, K past one k
// block (768), padded rows, alpha and beta, both B overloads.
TEST(Gemm, AmxReadsAlignedRowsOfAInPlaceWithThePackedBits) {
    if (!gemm::path_supported(Path::amx)) {
        GTEST_SKIP()
            << "needs AMX-BF16 (CPUID amx_bf16 and amx_tile, tile state enabled by the OS)";
    }
    PathGuard guard;
    gemm::set_active_path(Path::amx);
    Rng rng(31);
    const int dims[][4] = {{32, 32, 32, 0},  {33, 47, 64, 32},   {70, 100, 96, 0},
                           {100, 1, 800, 0}, {64, 96, 1536, 64}, {5, 33, 32, 0}};
    for (const auto& d : dims) {
        const int M = d[0], N = d[1], K = d[2], lda = d[2] + d[3];
        for (Trans tb : {Trans::N, Trans::T}) {
            const int ldb = tb == Trans::N ? N : K;
            std::vector<float> b(size_t(tb == Trans::N ? K : N) * size_t(ldb));
            for (float& v : b) v = float(rng.normal());
            std::vector<bf16> b16;
            for (float v : b) b16.push_back(bf16_from_float(v));
            // the same A on an aligned line (in place) and one element off it (packed)
            AlignedVector<bf16> lined(size_t(M) * size_t(lda) + 32);
            for (bf16& v : lined) v = bf16_from_float(float(rng.normal()));
            const bf16* a_in = lined.data();
            AlignedVector<bf16> off(lined.size() + 1);
            std::memcpy(off.data() + 1, lined.data(), lined.size() * sizeof(bf16));
            const bf16* a_packed = off.data() + 1;
            for (const float beta : {0.0f, 1.0f, 0.25f}) {
                const float alpha = beta == 0.25f ? 1.5f : 1.0f;
                std::vector<float> c0(size_t(M) * size_t(N));
                for (float& v : c0) v = float(rng.normal());
                std::vector<float> c1 = c0, c2 = c0, c3 = c0, c4 = c0;
                gemm_bf16(Trans::N, tb, M, N, K, alpha, a_in, lda, b16.data(), ldb, beta, c1.data(),
                          N);
                gemm_bf16(Trans::N, tb, M, N, K, alpha, a_packed, lda, b16.data(), ldb, beta,
                          c2.data(), N);
                gemm_bf16(Trans::N, tb, M, N, K, alpha, a_in, lda, b.data(), ldb, beta, c3.data(),
                          N);
                gemm_bf16(Trans::N, tb, M, N, K, alpha, a_packed, lda, b.data(), ldb, beta,
                          c4.data(), N);
                EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)))
                    << "M=" << M << " N=" << N << " K=" << K << " lda=" << lda << " tb=" << int(tb)
                    << " beta=" << beta;
                EXPECT_EQ(0, std::memcmp(c3.data(), c4.data(), c3.size() * sizeof(float)))
                    << "float B, M=" << M << " N=" << N << " K=" << K << " tb=" << int(tb);
                EXPECT_EQ(0, std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)))
                    << "bf16 B against float B, M=" << M << " N=" << N << " K=" << K;
            }
        }
    }
}

TEST(Gemm, SetActivePathRejectsUnsupported) {
    PathGuard guard;
    // a float B stored by row is packed from its floats by the AMX kernel and the kernels that
    // widen bf16 to float (AVX2; AVX-512 without AVX512_BF16), not by the AVX512_BF16 pairs nor
    // the generic one: gemm_bf16 on those paths, the grouped products wherever they run on them
    // (onednn and auto: the best of ours)
    const auto packs_float_rows = [](Path p) {
        return p == Path::amx || p == Path::avx2 ||
               (p == Path::avx512 && !cpu_features().avx512_bf16);
    };
    for (Path p : supported_paths()) {
        gemm::set_active_path(p);
        EXPECT_EQ(gemm_bf16_float_b_rows(), packs_float_rows(p)) << gemm::path_name(p);
        const bool grouped_on_best = p == Path::onednn || p == Path::automatic;
        EXPECT_EQ(grouped_gemm_bf16_float_b_rows(),
                  packs_float_rows(grouped_on_best ? gemm::best_path() : p))
            << gemm::path_name(p);
    }
    for (Path p : {Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(p)) {
            EXPECT_ANY_THROW(gemm::set_active_path(p));
        }
    }
    EXPECT_EQ(gemm_backend_name(), gemm::path_name(gemm::active_path()));
}

}  // namespace
}  // namespace bagualu::kernels

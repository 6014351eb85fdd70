// grouped_gemm_f32 / grouped_gemm_tn_f32 on every implementation this CPU supports: bitwise
// equal to calling gemm_f32 once per group, and within the float dot-product error bound of the
// double-accumulating reference per group. Group sizes are random, 0 and 1, and one group with
// all rows; shapes are the four products and two weight gradients of the experts. Also checks
// bit-identical results for 1, 2 and 3 threads, and that beta == 0 never reads C. The bf16 forward
// form (grouped_gemm_bf16) the same way against gemm_bf16 per group; the bf16 weight-gradient
// form (grouped_gemm_tn_bf16) against the reference, and split at the depth block.
#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "gemm_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/mixed.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels {
namespace {

using gemm::Path;

constexpr float kSentinel = -12345.0f;  // fills C's padding columns: must never be written

using testing::PathGuard;
using testing::supported_paths;

std::vector<int32_t> offsets_of(const std::vector<int>& sizes) {
    std::vector<int32_t> off(sizes.size() + 1, 0);
    for (size_t g = 0; g < sizes.size(); ++g) off[g + 1] = off[g] + sizes[g];
    return off;
}

std::vector<float> random_vector(Rng& rng, size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
    return v;
}

std::vector<float> abs_of(std::vector<float> v) {
    for (float& x : v) x = std::isnan(x) ? 0.0f : std::fabs(x);
    return v;
}

// (rows, ld) output whose columns [cols, ld) hold kSentinel and the rest NaN when beta == 0.
std::vector<float> initial_c(Rng& rng, size_t rows, int cols, int ld, float beta) {
    std::vector<float> c = random_vector(rng, rows * size_t(ld));
    for (size_t i = 0; i < c.size(); ++i) {
        if (int(i % size_t(ld)) >= cols)
            c[i] = kSentinel;
        else if (beta == 0.0f)
            c[i] = std::numeric_limits<float>::quiet_NaN();
    }
    return c;
}

// got vs want within (depth(row) + 4) u |magnitude|, the bound gemm_test.cpp explains; padding
// columns must still hold the sentinel.
template <typename DepthOfRow>
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& mag, int cols, int ld, DepthOfRow depth,
                  const std::string& what) {
    const double u = std::ldexp(1.0, -24);
    int bad        = 0;
    for (size_t k = 0; k < got.size() && bad < 5; ++k) {
        const size_t row = k / size_t(ld);
        const bool pad   = int(k % size_t(ld)) >= cols;
        const double tol = (depth(row) + 4) * u * mag[k] + 1e-30;
        const bool ok =
            pad ? got[k] == kSentinel : std::fabs(double(got[k]) - double(want[k])) <= tol;
        if (!ok) {
            ++bad;
            ADD_FAILURE() << what << " at row " << row << " col " << k % size_t(ld) << ": got "
                          << got[k] << " want " << want[k] << " tol " << tol;
        }
    }
}

// ---- forward form: C_g = alpha op(A_g) op(B_g) + beta C_g ----

struct Forward {
    Trans ta, tb;
    int N, K;
    float alpha, beta;
    std::vector<int32_t> off;
    int lda, ldb, ldc;
    size_t stride_b;
    std::vector<float> A, B, C0;
};

Forward make_forward(const std::vector<int>& sizes, Trans ta, Trans tb, int N, int K, float alpha,
                     float beta, uint64_t seed) {
    Rng rng(seed);
    Forward f{ta, tb, N, K, alpha, beta, offsets_of(sizes), 0, 0, 0, 0, {}, {}, {}};
    const int R = f.off.back();
    f.lda       = (ta == Trans::N ? K : R) + 1;
    f.ldb       = (tb == Trans::N ? N : K) + 2;
    f.ldc       = N + 3;
    f.stride_b  = size_t(tb == Trans::N ? K : N) * size_t(f.ldb) + 5;
    f.A         = random_vector(rng, size_t(ta == Trans::N ? R : K) * size_t(f.lda) + 1);
    f.B         = random_vector(rng, f.stride_b * sizes.size() + 1);
    f.C0        = initial_c(rng, size_t(R), N, f.ldc, beta);
    return f;
}

size_t a_offset(const Forward& f, int g) {
    return size_t(f.off[size_t(g)]) * (f.ta == Trans::N ? size_t(f.lda) : 1);
}

// Bitwise equality. memcmp on an empty vector's data() (null) is undefined even for 0 bytes.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> run_grouped(const Forward& f) {
    std::vector<float> c = f.C0;
    grouped_gemm_f32(f.ta, f.tb, int(f.off.size()) - 1, f.off.data(), f.N, f.K, f.alpha, f.A.data(),
                     f.lda, f.B.data(), f.ldb, f.stride_b, f.beta, c.data(), f.ldc);
    return c;
}

// One gemm (gemm_f32 or the reference) per group.
template <typename Gemm>
std::vector<float> run_per_group(const Forward& f, const std::vector<float>& A,
                                 const std::vector<float>& B, std::vector<float> c, float alpha,
                                 float beta, Gemm gemm) {
    for (size_t g = 0; g + 1 < f.off.size(); ++g) {
        gemm(f.ta, f.tb, f.off[g + 1] - f.off[g], f.N, f.K, alpha, A.data() + a_offset(f, int(g)),
             f.lda, B.data() + g * f.stride_b, f.ldb, beta,
             c.data() + size_t(f.off[g]) * size_t(f.ldc), f.ldc);
    }
    return c;
}

// The path whose gemm_f32 the grouped GEMM equals bitwise: itself, except under onednn and auto,
// where the grouped GEMM runs the best of our kernels.
Path loop_path(Path p) { return p == Path::onednn || p == Path::automatic ? gemm::best_path() : p; }

void check_forward(const std::vector<int>& sizes, Trans ta, Trans tb, int N, int K, float alpha,
                   float beta, uint64_t seed) {
    const Forward f = make_forward(sizes, ta, tb, N, K, alpha, beta, seed);
    const auto want = run_per_group(f, f.A, f.B, f.C0, alpha, beta, ref::gemm_f32);
    const auto mag  = run_per_group(f, abs_of(f.A), abs_of(f.B), abs_of(f.C0), std::fabs(alpha),
                                    std::fabs(beta), ref::gemm_f32);
    PathGuard guard;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        const std::string what = std::string(gemm::path_name(path)) + " N=" + std::to_string(N) +
                                 " K=" + std::to_string(K) + " G=" + std::to_string(sizes.size()) +
                                 " ta=" + std::to_string(int(ta)) +
                                 " tb=" + std::to_string(int(tb));
        const auto got = run_grouped(f);
        gemm::set_active_path(loop_path(path));
        const auto loop = run_per_group(f, f.A, f.B, f.C0, alpha, beta, gemm_f32);
        gemm::set_active_path(path);
        EXPECT_TRUE(same_bits(got, loop)) << what;
        expect_close(
            got, want, mag, N, f.ldc, [&](size_t) { return K; }, what);
    }
}

std::vector<std::vector<int>> size_patterns(Rng& rng, int G, int max_rows);

// ---- the bf16 forward form: the same problem with A and B rounded to bf16 ----

std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_from_float(v[i]);
    return out;
}

std::vector<float> widened(const std::vector<bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
    return out;
}

// Bitwise gemm_bf16 per group on the same path (the best of ours under onednn and auto), and
// within the float bound of the reference on the widened operands (products of bf16 values are
// exact in float32, so the bound is the float one).
void check_forward_bf16(const std::vector<int>& sizes, Trans ta, Trans tb, int N, int K,
                        float alpha, float beta, uint64_t seed) {
    const Forward f             = make_forward(sizes, ta, tb, N, K, alpha, beta, seed);
    const std::vector<bf16> A16 = to_bf16(f.A), B16 = to_bf16(f.B);
    const std::vector<float> A32 = widened(A16), B32 = widened(B16);
    const auto want = run_per_group(f, A32, B32, f.C0, alpha, beta, ref::gemm_f32);
    const auto mag  = run_per_group(f, abs_of(A32), abs_of(B32), abs_of(f.C0), std::fabs(alpha),
                                    std::fabs(beta), ref::gemm_f32);
    PathGuard guard;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        const std::string what = std::string(gemm::path_name(path)) +
                                 " bf16 N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                 " G=" + std::to_string(sizes.size());
        std::vector<float> got = f.C0;
        grouped_gemm_bf16(ta, tb, int(f.off.size()) - 1, f.off.data(), N, K, alpha, A16.data(),
                          f.lda, B16.data(), f.ldb, f.stride_b, beta, got.data(), f.ldc);
        gemm::set_active_path(loop_path(path));
        std::vector<float> loop = f.C0;
        for (size_t g = 0; g + 1 < f.off.size(); ++g) {
            gemm_bf16(ta, tb, f.off[g + 1] - f.off[g], N, K, alpha,
                      A16.data() + a_offset(f, int(g)), f.lda, B16.data() + g * f.stride_b, f.ldb,
                      beta, loop.data() + size_t(f.off[g]) * size_t(f.ldc), f.ldc);
        }
        gemm::set_active_path(path);
        EXPECT_TRUE(same_bits(got, loop)) << what;
        expect_close(
            got, want, mag, N, f.ldc, [&](size_t) { return K; }, what);
    }
}

TEST(GroupedGemm, Bf16ExpertShapesMatchPerGroupGemmBf16) {
    Rng rng(7);
    for (const auto& [C, F, G, rows] : {std::tuple{12, 20, 5, 37}, std::tuple{40, 136, 9, 70}}) {
        for (const std::vector<int>& sizes : size_patterns(rng, G, rows)) {
            check_forward_bf16(sizes, Trans::N, Trans::T, F, C, 1.0f, 0.0f, 51);
            check_forward_bf16(sizes, Trans::N, Trans::T, C, F, 1.0f, 0.0f, 52);
            check_forward_bf16(sizes, Trans::N, Trans::N, F, C, 1.0f, 0.0f, 53);
            check_forward_bf16(sizes, Trans::N, Trans::N, C, F, 1.0f, 0.0f, 54);
            check_forward_bf16(sizes, Trans::T, Trans::N, 33, 29, 0.5f, 0.25f, 55);
        }
    }
}

// ---- weight-gradient form: C_g = alpha A_g^T B_g + beta C_g over group g's rows ----

struct Tn {
    int M, N;
    float alpha, beta;
    std::vector<int32_t> off;
    int lda, ldb, ldc;
    size_t stride_c;
    std::vector<float> A, B, C0;
};

Tn make_tn(const std::vector<int>& sizes, int M, int N, float alpha, float beta, uint64_t seed) {
    Rng rng(seed);
    Tn t{M, N, alpha, beta, offsets_of(sizes), M + 1, N + 2, N + 3, 0, {}, {}, {}};
    const int R = t.off.back();
    t.stride_c  = size_t(M) * size_t(t.ldc);
    t.A         = random_vector(rng, size_t(R) * size_t(t.lda) + 1);
    t.B         = random_vector(rng, size_t(R) * size_t(t.ldb) + 1);
    t.C0        = initial_c(rng, sizes.size() * size_t(M), N, t.ldc, beta);
    return t;
}

template <typename Gemm>
std::vector<float> run_tn_per_group(const Tn& t, const std::vector<float>& A,
                                    const std::vector<float>& B, std::vector<float> c, float alpha,
                                    float beta, Gemm gemm) {
    for (size_t g = 0; g + 1 < t.off.size(); ++g) {
        gemm(Trans::T, Trans::N, t.M, t.N, t.off[g + 1] - t.off[g], alpha,
             A.data() + size_t(t.off[g]) * size_t(t.lda), t.lda,
             B.data() + size_t(t.off[g]) * size_t(t.ldb), t.ldb, beta, c.data() + g * t.stride_c,
             t.ldc);
    }
    return c;
}

std::vector<float> run_tn_grouped(const Tn& t) {
    std::vector<float> c = t.C0;
    grouped_gemm_tn_f32(int(t.off.size()) - 1, t.off.data(), t.M, t.N, t.alpha, t.A.data(), t.lda,
                        t.B.data(), t.ldb, t.beta, c.data(), t.ldc, t.stride_c);
    return c;
}

void check_tn(const std::vector<int>& sizes, int M, int N, float alpha, float beta, uint64_t seed) {
    const Tn t       = make_tn(sizes, M, N, alpha, beta, seed);
    const auto want  = run_tn_per_group(t, t.A, t.B, t.C0, alpha, beta, ref::gemm_f32);
    const auto mag   = run_tn_per_group(t, abs_of(t.A), abs_of(t.B), abs_of(t.C0), std::fabs(alpha),
                                        std::fabs(beta), ref::gemm_f32);
    const auto depth = [&](size_t row) {
        const size_t g = row / size_t(M);
        return t.off[g + 1] - t.off[g];
    };
    PathGuard guard;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        const std::string what = std::string(gemm::path_name(path)) + " tn M=" + std::to_string(M) +
                                 " N=" + std::to_string(N) + " G=" + std::to_string(sizes.size());
        const auto got = run_tn_grouped(t);
        gemm::set_active_path(loop_path(path));
        const auto loop = run_tn_per_group(t, t.A, t.B, t.C0, alpha, beta, gemm_f32);
        gemm::set_active_path(path);
        EXPECT_TRUE(same_bits(got, loop)) << what;
        expect_close(got, want, mag, N, t.ldc, depth, what);
    }
}

// Group sizes: random (with 0 and 1 forced in), one group holding every row, ones and zeros.
std::vector<std::vector<int>> size_patterns(Rng& rng, int G, int max_rows) {
    std::vector<int> random(size_t(G), 0);
    for (int& s : random) s = int(rng.below(uint64_t(max_rows) + 1));
    random[0]             = 0;
    random[size_t(G) / 2] = 1;
    std::vector<int> all_in_one(size_t(G), 0);
    all_in_one[size_t(G) - 2] = max_rows * 2;
    std::vector<int> tiny(size_t(G), 0);
    for (int g = 0; g < G; g += 2) tiny[size_t(g)] = 1;
    return {random, all_in_one, tiny, std::vector<int>(size_t(G), 0), {7}};
}

// The experts' products with C = d_model, F = d_ff: forward x W1^T, g W2^T; backward dy W2,
// dh W1; weight gradients dy^T g, dh^T x.
void check_expert_shapes(int C, int F, int G, int max_rows, uint64_t seed) {
    Rng rng(seed);
    for (const std::vector<int>& sizes : size_patterns(rng, G, max_rows)) {
        check_forward(sizes, Trans::N, Trans::T, F, C, 1.0f, 0.0f, seed + 1);
        check_forward(sizes, Trans::N, Trans::T, C, F, 1.0f, 0.0f, seed + 2);
        check_forward(sizes, Trans::N, Trans::N, F, C, 1.0f, 0.0f, seed + 3);
        check_forward(sizes, Trans::N, Trans::N, C, F, 1.0f, 0.0f, seed + 4);
        check_tn(sizes, C, F, 1.0f, 1.0f, seed + 5);
        check_tn(sizes, F, C, 1.0f, 1.0f, seed + 6);
    }
}

TEST(GroupedGemm, ExpertShapesMatchPerGroupGemmAndReference) {
    check_expert_shapes(12, 20, 5, 37, 1);     // tests/unit/moe
    check_expert_shapes(16, 24, 4, 24, 11);    // tests/unit/model tiny_config
    check_expert_shapes(40, 136, 9, 70, 21);   // edge tiles in every direction
    check_expert_shapes(256, 768, 8, 12, 31);  // the default model, few rows (reference is slow)
}

// The bf16 weight-gradient form: within the float bound of the reference on the widened
// operands per group (products of bf16 values are exact in float32), on every path; and, where
// the path sums the depth in blocks, a group's rows split at grouped_gemm_tn_depth_block() over
// two calls (the second with beta = 1) give bitwise the one call's result, for the bf16 form as
// for the float one (rounds and all-to-all pieces of the experts split them there).
void check_tn_bf16(const std::vector<int>& sizes, int M, int N, float alpha, float beta,
                   uint64_t seed) {
    const Tn t                  = make_tn(sizes, M, N, alpha, beta, seed);
    const std::vector<bf16> A16 = to_bf16(t.A), B16 = to_bf16(t.B);
    const std::vector<float> A32 = widened(A16), B32 = widened(B16);
    const auto want  = run_tn_per_group(t, A32, B32, t.C0, alpha, beta, ref::gemm_f32);
    const auto mag   = run_tn_per_group(t, abs_of(A32), abs_of(B32), abs_of(t.C0), std::fabs(alpha),
                                        std::fabs(beta), ref::gemm_f32);
    const auto depth = [&](size_t row) {
        const size_t g = row / size_t(M);
        return t.off[g + 1] - t.off[g];
    };
    const int G = int(t.off.size()) - 1;
    PathGuard guard;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        const std::string what = std::string(gemm::path_name(path)) +
                                 " tn bf16 M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                 " G=" + std::to_string(G);
        std::vector<float> got = t.C0;
        grouped_gemm_tn_bf16(G, t.off.data(), M, N, alpha, A16.data(), t.lda, B16.data(), t.ldb,
                             beta, got.data(), t.ldc, t.stride_c);
        expect_close(got, want, mag, N, t.ldc, depth, what);
        const int blk = grouped_gemm_tn_depth_block();
        if (blk == 0) continue;  // ref, openblas: the whole depth at once
        // each group's rows cut at its first block boundary: [start, start + blk), then the rest
        std::vector<float> split = t.C0;
        for (int g = 0; g < G; ++g) {
            const int32_t start = t.off[size_t(g)], end = t.off[size_t(g) + 1];
            const int32_t cut     = std::min(start + blk, end);
            const int32_t head[2] = {start, cut}, tail[2] = {cut, end};
            float* cg = split.data() + size_t(g) * t.stride_c;
            grouped_gemm_tn_bf16(1, head, M, N, alpha, A16.data(), t.lda, B16.data(), t.ldb, beta,
                                 cg, t.ldc, t.stride_c);
            grouped_gemm_tn_bf16(1, tail, M, N, alpha, A16.data(), t.lda, B16.data(), t.ldb, 1.0f,
                                 cg, t.ldc, t.stride_c);
        }
        EXPECT_TRUE(same_bits(got, split)) << what << " split at " << blk;
    }
}

TEST(GroupedGemm, Bf16WeightGradientMatchesReferenceAndSplitsExactlyAtTheDepthBlock) {
    Rng rng(9);
    for (const auto& [C, F, G, rows] :
         {std::tuple{12, 20, 5, 37}, std::tuple{40, 136, 4, 300}, std::tuple{33, 17, 3, 700}}) {
        for (const std::vector<int>& sizes : size_patterns(rng, G, rows)) {
            check_tn_bf16(sizes, C, F, 1.0f, 1.0f, 61);
            check_tn_bf16(sizes, F, C, 1.0f, 1.0f, 62);
            check_tn_bf16(sizes, C, F, 0.5f, 0.0f, 63);
        }
    }
}

TEST(GroupedGemm, OtherTransposesAndScalars) {
    Rng rng(5);
    for (const std::vector<int>& sizes : size_patterns(rng, 6, 50)) {
        check_forward(sizes, Trans::T, Trans::N, 33, 29, 0.5f, 0.25f, 41);
        check_forward(sizes, Trans::T, Trans::T, 17, 70, -1.5f, 1.0f, 42);
        check_forward(sizes, Trans::N, Trans::T, 20, 0, 1.0f, 0.5f, 43);  // K == 0: C = beta C
        check_forward(sizes, Trans::N, Trans::N, 20, 9, 0.0f, 0.0f, 44);  // alpha == 0
        check_tn(sizes, 31, 18, 2.0f, 0.0f, 45);
        check_tn(sizes, 9, 40, 0.5f, -1.0f, 46);
    }
}

// A stored by k and read in place by the weight-gradient form and ta = T (KernelSpec::micro_cols,
// when few column tiles read it): bitwise the packed per-group gemm_f32 over depths of several
// k blocks (the in-place reads start at each block), row counts with a short last tile (packed
// instead) and fewer rows than a tile.
TEST(GroupedGemm, OperandReadInPlaceGivesThePackedBits) {
    const std::vector<int> sizes = {301, 0, 250, 13};
    check_tn(sizes, 29, 40, 1.0f, 0.5f, 47);
    check_tn(sizes, 5, 40, 1.0f, 0.0f, 48);
    check_forward({7, 0, 40}, Trans::T, Trans::N, 40, 600, 1.0f, 0.0f, 49);
}

// Zipf-like skewed groups large enough to spread over threads: results must be bitwise equal for
// any thread count, since no thread ever splits a sum. The groups are taken largest first, and
// the weight-gradient form's 300 columns are cut into strips as narrow as A read in place allows.
TEST(GroupedGemm, BitIdenticalForAnyThreadCount) {
    PathGuard guard;
    const std::vector<int> sizes = {75, 150, 0, 301, 60, 1, 43, 37};
    const Forward f              = make_forward(sizes, Trans::N, Trans::T, 96, 64, 1.0f, 0.0f, 3);
    const Tn t                   = make_tn(sizes, 96, 300, 1.0f, 1.0f, 4);
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        std::vector<float> fwd[3], tn[3];
        for (int n = 1; n <= 3; ++n) {
            set_compute_threads(n);
            fwd[n - 1] = run_grouped(f);
            tn[n - 1]  = run_tn_grouped(t);
        }
        for (int n = 1; n < 3; ++n) {
            EXPECT_EQ(0, std::memcmp(fwd[0].data(), fwd[n].data(), fwd[0].size() * 4))
                << gemm::path_name(path) << " forward, " << n + 1 << " threads";
            EXPECT_EQ(0, std::memcmp(tn[0].data(), tn[n].data(), tn[0].size() * 4))
                << gemm::path_name(path) << " tn, " << n + 1 << " threads";
        }
    }
    set_compute_threads(0);
}

// Runs a product twice from c0, through run(out, epilogue): without an epilogue, then with one
// that counts and doubles every element it is handed (at(g, i, j): the index in out of C_g's
// element (i, j)). covered(k): whether element k of out must be handed over. Returns what went
// wrong, empty when every covered element was handed over once, at the value the run without an
// epilogue leaves there, no other element was, and what the epilogue wrote stayed.
template <typename Run, typename At, typename Covered>
std::string check_epilogue(const std::vector<float>& c0, Run run, At at, Covered covered) {
    std::vector<float> plain = c0, c = c0;
    std::vector<int> seen(c.size(), 0), stale(c.size(), 0);
    run(plain, GroupEpilogue{});
    const auto epi = [&](int g, int i0, int i1, int j0, int j1) {
        for (int i = i0; i < i1; ++i) {
            for (int j = j0; j < j1; ++j) {
                const size_t k = at(g, i, j);
                ++seen[k];  // rectangles are disjoint: no two threads share k
                stale[k] += std::memcmp(&c[k], &plain[k], sizeof(float)) != 0;
                c[k] = 2.0f * c[k];
            }
        }
    };
    run(c, GroupEpilogue{epi});
    int twice = 0, missed = 0, extra = 0, early = 0, lost = 0;
    for (size_t k = 0; k < c.size(); ++k) {
        const bool want = covered(k);
        extra += !want && seen[k] != 0;
        missed += want && seen[k] == 0;
        twice += seen[k] > 1;
        early += stale[k];
        lost += want && c[k] != 2.0f * plain[k];
    }
    if (twice + missed + extra + early + lost == 0) return "";
    return std::to_string(twice) + " twice, " + std::to_string(missed) + " missed, " +
           std::to_string(extra) + " outside C's groups, " + std::to_string(early) +
           " before their final value, " + std::to_string(lost) + " not as the epilogue left them";
}

// The forward form's epilogue: on every path, 1 to 3 threads, in float32 and bf16 and with K = 0,
// it is called once for every element of C (no element twice, none of the padding columns, no
// row of an empty group), and each element it sees already holds its final value, which is what
// the same call without an epilogue leaves there; what the epilogue writes stays.
TEST(GroupedGemm, EpilogueSeesEveryElementOnceAtItsFinalValue) {
    PathGuard guard;
    const std::vector<int> sizes = {75, 150, 0, 301, 1, 12};
    for (int K : {0, 40}) {
        const Forward f = make_forward(sizes, Trans::N, Trans::T, 101, K, 1.0f, 0.0f, 61);
        const int G     = int(f.off.size()) - 1;
        const std::vector<bf16> A16 = to_bf16(f.A), B16 = to_bf16(f.B);
        const auto at = [&](int g, int i, int j) {
            return size_t(f.off[size_t(g)] + i) * size_t(f.ldc) + size_t(j);
        };
        const auto covered = [&](size_t k) { return int(k % size_t(f.ldc)) < f.N; };
        for (Path path : supported_paths()) {
            gemm::set_active_path(path);
            for (int n = 1; n <= 3; ++n) {
                set_compute_threads(n);
                for (bool half : {false, true}) {
                    const auto run = [&](std::vector<float>& out, GroupEpilogue epi) {
                        if (half) {
                            grouped_gemm_bf16(f.ta, f.tb, G, f.off.data(), f.N, f.K, f.alpha,
                                              A16.data(), f.lda, B16.data(), f.ldb, f.stride_b,
                                              f.beta, out.data(), f.ldc, nullptr, epi);
                        } else {
                            grouped_gemm_f32(f.ta, f.tb, G, f.off.data(), f.N, f.K, f.alpha,
                                             f.A.data(), f.lda, f.B.data(), f.ldb, f.stride_b,
                                             f.beta, out.data(), f.ldc, nullptr, epi);
                        }
                    };
                    EXPECT_EQ(check_epilogue(f.C0, run, at, covered), "")
                        << gemm::path_name(path) << " K=" << K << (half ? " bf16 " : " f32 ") << n
                        << " threads";
                }
            }
        }
    }
    set_compute_threads(0);
}

// The weight-gradient form's epilogue, the same way: once for every element of every C_g whose
// group has rows, at its final value (beta = 1, the depth over several k blocks and strips of
// 300 columns), never for a group without rows (its C_g is only scaled), float32 and bf16.
TEST(GroupedGemm, TnEpilogueSeesEveryElementOnceAtItsFinalValue) {
    PathGuard guard;
    const std::vector<int> sizes = {301, 0, 250, 13, 1};
    const Tn t                   = make_tn(sizes, 29, 300, 1.0f, 1.0f, 62);
    const int G                  = int(t.off.size()) - 1;
    const std::vector<bf16> A16 = to_bf16(t.A), B16 = to_bf16(t.B);
    const auto at = [&](int g, int i, int j) {
        return size_t(g) * t.stride_c + size_t(i) * size_t(t.ldc) + size_t(j);
    };
    const auto covered = [&](size_t k) {
        return int(k % size_t(t.ldc)) < t.N && sizes[k / t.stride_c] != 0;
    };
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        for (int n = 1; n <= 3; ++n) {
            set_compute_threads(n);
            for (bool half : {false, true}) {
                const auto run = [&](std::vector<float>& out, GroupEpilogue epi) {
                    if (half) {
                        grouped_gemm_tn_bf16(G, t.off.data(), t.M, t.N, t.alpha, A16.data(), t.lda,
                                             B16.data(), t.ldb, t.beta, out.data(), t.ldc,
                                             t.stride_c, nullptr, epi);
                    } else {
                        grouped_gemm_tn_f32(G, t.off.data(), t.M, t.N, t.alpha, t.A.data(), t.lda,
                                            t.B.data(), t.ldb, t.beta, out.data(), t.ldc,
                                            t.stride_c, nullptr, epi);
                    }
                };
                EXPECT_EQ(check_epilogue(t.C0, run, at, covered), "")
                    << gemm::path_name(path) << (half ? " bf16 " : " f32 ") << n << " threads";
            }
        }
    }
    set_compute_threads(0);
}

// Gathered operands (a_rows / b_rows): each stacked row i is source row rows[i], as an MoE's
// permuted rows are its tokens' (a token in up to K groups, some tokens in none). On every path,
// in float32 and bf16, and through the mixed-precision entry points on 16-bit copies: the bits
// of the same call on the gathered copy, with offsets starting past 0 and empty groups.
TEST(GroupedGemm, GatheredOperandsGiveTheBitsOfThePermutedCopy) {
    PathGuard guard;
    Rng rng(77);
    const int src_rows = 97, N = 40, K = 36, M = 13;
    const std::vector<int> sizes = {0, 31, 1, 0, 57, 12, 44};
    std::vector<int32_t> off     = offsets_of(sizes);
    for (int32_t& o : off) o += 5;  // rows [0, 5) are before the first group
    const int G = int(sizes.size()), rows = off[size_t(G)];
    std::vector<int32_t> idx(static_cast<size_t>(rows));
    for (auto& r : idx) r = int32_t(rng.below(uint64_t(src_rows - 3)));  // the last rows unread
    const auto X = random_vector(rng, size_t(src_rows) * K);             // (src_rows, K)
    const auto Y = random_vector(rng, size_t(src_rows) * N);             // (src_rows, N)
    const auto A = random_vector(rng, size_t(rows) * M);                 // tn's A (rows, M)
    const auto W = random_vector(rng, size_t(G) * N * K);                // (G, N, K)
    std::vector<float> Xp(size_t(rows) * K), Yp(size_t(rows) * N);
    for (int i = 0; i < rows; ++i) {
        std::copy_n(X.data() + size_t(idx[size_t(i)]) * K, K, Xp.data() + size_t(i) * K);
        std::copy_n(Y.data() + size_t(idx[size_t(i)]) * N, N, Yp.data() + size_t(i) * N);
    }
    const auto X16 = to_bf16(X), Xp16 = to_bf16(Xp), Y16 = to_bf16(Y), Yp16 = to_bf16(Yp),
               W16 = to_bf16(W), A16 = to_bf16(A);
    const size_t fwd_n = size_t(rows) * N, tn_n = size_t(G) * M * N;
    for (Path path : supported_paths()) {
        gemm::set_active_path(path);
        for (int threads : {1, 2}) {
            set_compute_threads(threads);
            const std::string what =
                std::string(gemm::path_name(path)) + ", " + std::to_string(threads) + " threads";
            std::vector<float> c1(fwd_n, 0.5f), c2 = c1, t1(tn_n, 0.25f), t2 = t1;
            grouped_gemm_f32(Trans::N, Trans::T, G, off.data(), N, K, 1.0f, X.data(), K, W.data(),
                             K, size_t(N) * K, 0.0f, c1.data(), N, idx.data());
            grouped_gemm_f32(Trans::N, Trans::T, G, off.data(), N, K, 1.0f, Xp.data(), K, W.data(),
                             K, size_t(N) * K, 0.0f, c2.data(), N);
            EXPECT_TRUE(same_bits(c1, c2)) << what << " f32 forward";
            grouped_gemm_tn_f32(G, off.data(), M, N, 1.0f, A.data(), M, Y.data(), N, 1.0f,
                                t1.data(), N, size_t(M) * N, idx.data());
            grouped_gemm_tn_f32(G, off.data(), M, N, 1.0f, A.data(), M, Yp.data(), N, 1.0f,
                                t2.data(), N, size_t(M) * N);
            EXPECT_TRUE(same_bits(t1, t2)) << what << " f32 tn";
            std::fill(c1.begin(), c1.end(), 0.5f);
            c2 = c1;
            grouped_gemm_bf16(Trans::N, Trans::T, G, off.data(), N, K, 1.0f, X16.data(), K,
                              W16.data(), K, size_t(N) * K, 0.0f, c1.data(), N, idx.data());
            grouped_gemm_bf16(Trans::N, Trans::T, G, off.data(), N, K, 1.0f, Xp16.data(), K,
                              W16.data(), K, size_t(N) * K, 0.0f, c2.data(), N);
            EXPECT_TRUE(same_bits(c1, c2)) << what << " bf16 forward";
            std::fill(t1.begin(), t1.end(), 0.25f);
            t2 = t1;
            grouped_gemm_tn_bf16(G, off.data(), M, N, 1.0f, A16.data(), M, Y16.data(), N, 1.0f,
                                 t1.data(), N, size_t(M) * N, idx.data());
            grouped_gemm_tn_bf16(G, off.data(), M, N, 1.0f, A16.data(), M, Yp16.data(), N, 1.0f,
                                 t2.data(), N, size_t(M) * N);
            EXPECT_TRUE(same_bits(t1, t2)) << what << " bf16 tn";
            // the mixed-precision entry points, on 16-bit copies or the rounded floats (bf16
            // values)
            const auto Xr = widened(X16), Xpr = widened(Xp16), Yr = widened(Y16),
                       Ypr = widened(Yp16);
            for (bool force : {false, true}) {
                bf16_float_operands(!force);
                std::fill(c1.begin(), c1.end(), 0.5f);
                c2 = c1;
                grouped_gemm_half(Dtype::bfloat16, Trans::T, G, off.data(), N, K, Xr.data(), K,
                                  W.data(), K, size_t(N) * K, c1.data(), N, idx.data());
                grouped_gemm_half(Dtype::bfloat16, Trans::T, G, off.data(), N, K, Xpr.data(), K,
                                  W.data(), K, size_t(N) * K, c2.data(), N);
                EXPECT_TRUE(same_bits(c1, c2)) << what << " half forward, forced " << force;
                std::fill(t1.begin(), t1.end(), 0.25f);
                t2 = t1;
                grouped_gemm_tn_half(Dtype::bfloat16, G, off.data(), M, N, A.data(), M, Yr.data(),
                                     N, t1.data(), N, size_t(M) * N, idx.data());
                grouped_gemm_tn_half(Dtype::bfloat16, G, off.data(), M, N, A.data(), M, Ypr.data(),
                                     N, t2.data(), N, size_t(M) * N);
                EXPECT_TRUE(same_bits(t1, t2)) << what << " half tn, forced " << force;
            }
            bf16_float_operands(false);
        }
    }
    set_compute_threads(0);
}

// A grouped layer's backward in one call (dout narrowed once, or given as its 16 bits) against
// its two products, for every dtype, 16-bit copies forced or not, inputs read directly, gathered
// or as 16 bits, and an empty group, on rows from a non-zero offset: the same bits, dweight
// formed before dinp.
TEST(GroupedGemm, LinearBackwardIsItsTwoProducts) {
    Rng rng(31);
    const int OUT = 37, IN = 52, G = 4;
    const std::vector<int32_t> off = {3, 20, 20, 61, 90};  // rows before 3 are not the groups'
    const size_t rows = 90, src_rows = 120;
    const std::vector<float> dout0 = random_vector(rng, rows * OUT),
                             inp0  = random_vector(rng, rows * IN),
                             src0  = random_vector(rng, src_rows * IN),
                             w0    = random_vector(rng, size_t(G) * OUT * IN);
    std::vector<int32_t> gather(rows);
    for (size_t i = 0; i < rows; ++i) gather[i] = int32_t((i * 7 + 5) % src_rows);
    const size_t stride_w = size_t(OUT) * IN;
    for (const Dtype d : {Dtype::float32, Dtype::bfloat16, Dtype::float16}) {
        auto dout = dout0, inp = inp0, src = src0, w = w0;
        for (auto* v : {&dout, &inp, &src, &w}) round_inplace(v->data(), v->size(), d);
        for (const bool force : {false, true}) {
            for (const int form : {0, 1, 2}) {  // inp direct, gathered, as 16 bits
                bf16_float_operands(!force);
                if (form == 2 && !half_products_convert(d)) continue;
                SCOPED_TRACE(::testing::Message()
                             << dtype_name(d) << " force " << force << " form " << form);
                std::vector<float> dx1(rows * IN, 0.5f), dw1(size_t(G) * stride_w, 0.25f);
                auto dx2 = dx1, dw2 = dw1;
                const float* x    = form == 1 ? src.data() : inp.data();
                const int32_t* xr = form == 1 ? gather.data() : nullptr;
                grouped_gemm_tn_half(d, G, off.data(), OUT, IN, dout.data(), OUT, x, IN, dw1.data(),
                                     IN, stride_w, xr);
                grouped_gemm_half(d, Trans::N, G, off.data(), IN, OUT, dout.data(), OUT, w.data(),
                                  IN, stride_w, dx1.data(), IN);
                if (form == 2) {
                    std::vector<uint16_t> x16(inp.size());
                    narrow_half(d, x16.data(), inp.data(), inp.size());
                    grouped_linear_backward_dout16(
                        d, G, off.data(), OUT, IN, dx2.data(), dw2.data(), stride_w,
                        narrow_dout(d, dout.data(), dout.size()), nullptr, nullptr, x16.data(),
                        w.data(), stride_w);
                } else if (half_products_convert(d) && force) {
                    // the 16-bit dout form on float inputs, direct or gathered
                    grouped_linear_backward_dout16(d, G, off.data(), OUT, IN, dx2.data(),
                                                   dw2.data(), stride_w,
                                                   narrow_dout(d, dout.data(), dout.size()), x, xr,
                                                   nullptr, w.data(), stride_w);
                } else {
                    grouped_linear_backward_half(d, G, off.data(), OUT, IN, dx2.data(), dw2.data(),
                                                 stride_w, dout.data(), x, xr, w.data(), stride_w);
                }
                EXPECT_TRUE(same_bits(dx1, dx2));
                EXPECT_TRUE(same_bits(dw1, dw2));
                // the rows before offsets[0] are not written
                EXPECT_EQ(dx2[0], 0.5f);
            }
        }
        bf16_float_operands(false);
    }
    // dinp over its own input's 16 bits (the experts' second layer: g16 in dh's storage)
    bf16_float_operands(false);
    auto dout = dout0, inp = inp0, w = w0;
    for (auto* v : {&dout, &inp, &w}) round_inplace(v->data(), v->size(), Dtype::bfloat16);
    std::vector<float> dx1(rows * IN), dw1(size_t(G) * stride_w, 0.25f), dw2 = dw1;
    grouped_linear_backward_half(Dtype::bfloat16, G, off.data(), OUT, IN, dx1.data(), dw1.data(),
                                 stride_w, dout.data(), inp.data(), nullptr, w.data(), stride_w);
    std::vector<float> shared(rows * IN);
    auto* s16 = reinterpret_cast<uint16_t*>(shared.data());
    narrow_half(Dtype::bfloat16, s16, inp.data(), inp.size());
    grouped_linear_backward_dout16(Dtype::bfloat16, G, off.data(), OUT, IN, shared.data(),
                                   dw2.data(), stride_w,
                                   narrow_dout(Dtype::bfloat16, dout.data(), dout.size()), nullptr,
                                   nullptr, s16, w.data(), stride_w);
    bf16_float_operands(false);
    EXPECT_TRUE(same_bits(dw1, dw2));
    EXPECT_TRUE(std::equal(dx1.begin() + off[0] * IN, dx1.end(), shared.begin() + off[0] * IN));
}

// A group's row block packs the group's strip of B again, so where the groups give the threads
// units enough, none is cut (64 experts of 200-312 rows, one strip: one call of the epilogue a
// group on 2 threads), and a group that holds most rows still is, so the threads share it.
TEST(GroupedGemm, GroupsAreCutOnlyWhereTheThreadsNeedIt) {
    PathGuard guard;
    set_compute_threads(2);
    Rng rng(41);
    const int N = 96, K = 256;
    auto calls = [&](const std::vector<int>& sizes) {
        const auto off = offsets_of(sizes);
        const int R = off.back(), G = int(sizes.size());
        std::vector<float> A(size_t(R) * K), B(size_t(G) * N * K), C(size_t(R) * N);
        for (float& v : A) v = float(rng.normal());
        for (float& v : B) v = float(rng.normal());
        std::atomic<int> n{0};
        auto count = [&](int, int, int, int, int) { n.fetch_add(1); };
        grouped_gemm_f32(Trans::N, Trans::T, G, off.data(), N, K, 1.0f, A.data(), K, B.data(), K,
                         size_t(N) * K, 0.0f, C.data(), N, nullptr, count);
        return n.load();
    };
    std::vector<int> many(64);
    for (int& r : many) r = 200 + int(rng.next_u64() % 113);
    const std::vector<int> skewed = {3000, 100, 100, 100, 100, 100, 100, 100};
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        EXPECT_EQ(calls(many), 64) << gemm::path_name(path);
        EXPECT_GT(calls(skewed), 8) << gemm::path_name(path);
    }
    set_compute_threads(0);
}

// Whole groups, one thread each (for_each_group running group_gemm_f32 / group_gemm_tn_f32 and
// their bf16 forms per group): on every packed path, 1 and 2 threads, and for the CPU's caches and
// small ones (several strips and k blocks a product), the bits of the grouped forms: the forward
// form for op(B) = B and B^T, gathered A or not, with alpha and beta; the weight-gradient form
// gathered or not. Offsets start past 0, some groups are empty (their weight gradients scaled by
// beta), and every group is run exactly once.
TEST(GroupedGemm, WholeGroupsGiveTheGroupedFormsBits) {
    PathGuard guard;
    Rng rng(53);
    const int src_rows = 120, N = 150, K = 300, M = 70;
    const std::vector<int> sizes = {17, 0, 29, 1, 40, 0, 23, 12, 35, 8};
    std::vector<int32_t> off     = offsets_of(sizes);
    for (int32_t& o : off) o += 3;
    const int G = int(sizes.size()), rows = off[size_t(G)];
    std::vector<int32_t> idx(static_cast<size_t>(rows));
    for (auto& r : idx) r = int32_t(rng.below(uint64_t(src_rows)));
    const auto X   = random_vector(rng, size_t(src_rows) * K);  // gathered A (src_rows, K)
    const auto A   = random_vector(rng, size_t(rows) * K);      // A (rows, K)
    const auto W   = random_vector(rng, size_t(G) * N * K);     // (G, N, K) or (G, K, N)
    const auto At  = random_vector(rng, size_t(rows) * M);      // tn's A (rows, M)
    const auto Y   = random_vector(rng, size_t(src_rows) * N);  // tn's gathered B
    const auto Yd  = random_vector(rng, size_t(rows) * N);      // tn's B
    const auto C0  = random_vector(rng, size_t(rows) * N),
               T0  = random_vector(rng, size_t(G) * M * N);
    const auto X16 = to_bf16(X), A16 = to_bf16(A), W16 = to_bf16(W), At16 = to_bf16(At),
               Y16 = to_bf16(Y), Yd16 = to_bf16(Yd);
    CacheSizes small{32 << 10, 128 << 10, 1 << 20};
    for (Path path : supported_paths()) {
        if (path == Path::ref || path == Path::openblas) {
            gemm::set_active_path(path);
            EXPECT_FALSE(whole_groups_suit(G, off.data())) << gemm::path_name(path);
            continue;
        }
        gemm::set_active_path(path);
        for (const CacheSizes* caches :
             {static_cast<const CacheSizes*>(nullptr), static_cast<const CacheSizes*>(&small)}) {
            gemm::set_blocking_caches(caches);
            for (int threads : {1, 2}) {
                set_compute_threads(threads);
                const std::string what = std::string(gemm::path_name(path)) + ", " +
                                         std::to_string(threads) + " threads" +
                                         (caches ? ", small caches" : "");
                for (const bool gathered : {false, true}) {
                    for (const Trans tb : {Trans::T, Trans::N}) {
                        const float* a          = gathered ? X.data() : A.data();
                        const int32_t* r        = gathered ? idx.data() : nullptr;
                        const int ldb           = tb == Trans::T ? K : N;
                        std::vector<float> want = C0, got = C0;
                        grouped_gemm_f32(Trans::N, tb, G, off.data(), N, K, 0.75f, a, K, W.data(),
                                         ldb, size_t(N) * K, 0.5f, want.data(), N, r);
                        std::vector<std::atomic<int>> runs(static_cast<size_t>(G));
                        std::atomic<bool> thread_ok{true};
                        for_each_group(G, off.data(), double(N) * K, [&](int g, int thread) {
                            runs[size_t(g)].fetch_add(1);
                            if (thread < 0 || thread >= threads) thread_ok = false;
                            const size_t r0 = size_t(off[size_t(g)]);
                            group_gemm_f32(Trans::N, tb, sizes[size_t(g)], N, K, 0.75f,
                                           gathered ? a : a + r0 * K, K, r ? r + r0 : nullptr,
                                           W.data() + size_t(g) * N * K, ldb, 0.5f,
                                           got.data() + r0 * N, N);
                        });
                        const std::string form = what + (gathered ? ", gathered" : "") + ", tb " +
                                                 (tb == Trans::T ? "T" : "N");
                        EXPECT_TRUE(same_bits(got, want)) << form;
                        for (int g = 0; g < G; ++g) EXPECT_EQ(runs[size_t(g)].load(), 1) << g;
                        EXPECT_TRUE(thread_ok.load()) << form;
                        // bf16: B in bf16, and in float rounded as it is packed
                        const bf16* a16 = gathered ? X16.data() : A16.data();
                        want = got = C0;
                        grouped_gemm_bf16(Trans::N, tb, G, off.data(), N, K, 0.75f, a16, K,
                                          W16.data(), ldb, size_t(N) * K, 0.5f, want.data(), N, r);
                        auto whole16 = [&](const auto* B, std::vector<float>& c) {
                            for_each_group(G, off.data(), double(N) * K, [&](int g, int) {
                                const size_t r0 = size_t(off[size_t(g)]);
                                group_gemm_bf16(Trans::N, tb, sizes[size_t(g)], N, K, 0.75f,
                                                gathered ? a16 : a16 + r0 * K, K,
                                                r ? r + r0 : nullptr, B + size_t(g) * N * K, ldb,
                                                0.5f, c.data() + r0 * N, N);
                            });
                        };
                        whole16(W16.data(), got);
                        EXPECT_TRUE(same_bits(got, want)) << form << ", bf16";
                        if (!grouped_gemm_bf16_float_b()) continue;
                        got = C0;
                        whole16(W.data(), got);
                        EXPECT_TRUE(same_bits(got, want)) << form << ", bf16, float B";
                    }
                    const float* b          = gathered ? Y.data() : Yd.data();
                    const int32_t* r        = gathered ? idx.data() : nullptr;
                    std::vector<float> want = T0, got = T0;
                    grouped_gemm_tn_f32(G, off.data(), M, N, 0.75f, At.data(), M, b, N, 0.5f,
                                        want.data(), N, size_t(M) * N, r);
                    for_each_group(G, off.data(), double(M) * N, [&](int g, int) {
                        const size_t r0 = size_t(off[size_t(g)]);
                        group_gemm_tn_f32(M, N, sizes[size_t(g)], 0.75f, At.data() + r0 * M, M,
                                          gathered ? b : b + r0 * N, N, r ? r + r0 : nullptr, 0.5f,
                                          got.data() + size_t(g) * M * N, N);
                    });
                    EXPECT_TRUE(same_bits(got, want))
                        << what << (gathered ? ", gathered" : "") << ", tn";
                    const bf16* b16 = gathered ? Y16.data() : Yd16.data();
                    want = got = T0;
                    grouped_gemm_tn_bf16(G, off.data(), M, N, 0.75f, At16.data(), M, b16, N, 0.5f,
                                         want.data(), N, size_t(M) * N, r);
                    for_each_group(G, off.data(), double(M) * N, [&](int g, int) {
                        const size_t r0 = size_t(off[size_t(g)]);
                        group_gemm_tn_bf16(M, N, sizes[size_t(g)], 0.75f, At16.data() + r0 * M, M,
                                           gathered ? b16 : b16 + r0 * N, N, r ? r + r0 : nullptr,
                                           0.5f, got.data() + size_t(g) * M * N, N);
                    });
                    EXPECT_TRUE(same_bits(got, want))
                        << what << (gathered ? ", gathered" : "") << ", tn bf16";
                }
            }
            gemm::set_blocking_caches(nullptr);
        }
    }
    set_compute_threads(0);
}

// Whole groups suit many groups of which none is large, on a packed path.
TEST(GroupedGemm, WholeGroupsSuitManyGroupsNoneLarge) {
    PathGuard guard;
    set_compute_threads(2);
    for (Path path : {Path::generic, Path::avx2, Path::avx512, Path::amx}) {
        if (!gemm::path_supported(path)) continue;
        gemm::set_active_path(path);
        std::vector<int> many(64, 256);
        many[3] = 0;
        EXPECT_TRUE(whole_groups_suit(64, offsets_of(many).data())) << gemm::path_name(path);
        // a group above half a thread's share of the rows (1,000 > 3,700 / 4)
        EXPECT_FALSE(
            whole_groups_suit(8, offsets_of({1000, 400, 400, 400, 400, 400, 400, 300}).data()));
        EXPECT_TRUE(
            whole_groups_suit(8, offsets_of({900, 400, 400, 400, 400, 400, 400, 800}).data()));
        EXPECT_FALSE(whole_groups_suit(1, offsets_of({2048}).data()));  // one group
        EXPECT_FALSE(whole_groups_suit(3, offsets_of({0, 2048, 0}).data()));
    }
    set_compute_threads(0);
}

TEST(GroupedGemm, RejectsDecreasingOffsets) {
    const std::vector<int32_t> off = {0, 5, 3};
    std::vector<float> a(64), b(64), c(64);
    EXPECT_ANY_THROW(grouped_gemm_f32(Trans::N, Trans::T, 2, off.data(), 2, 2, 1.0f, a.data(), 2,
                                      b.data(), 2, 4, 0.0f, c.data(), 2));
    EXPECT_ANY_THROW(grouped_gemm_tn_f32(2, off.data(), 2, 2, 1.0f, a.data(), 2, b.data(), 2, 1.0f,
                                         c.data(), 2, 4));
}

}  // namespace
}  // namespace bagualu::kernels

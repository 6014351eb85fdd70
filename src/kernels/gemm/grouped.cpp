// grouped_gemm_f32 / grouped_gemm_tn_f32 (kernels/grouped_gemm.h) on the packed driver: every
// thread gets one rectangle of the groups' concatenated work and runs gemm_rect on each group's
// part of it, with the same packing and micro-kernel as gemm_f32, so each element is summed in
// the same order as there. The ref and openblas paths loop over gemm_f32 instead.
// Packing buffers are reserved for the call's largest rectangle up front, so the row counts
// changing from call to call (routing) do not make them grow again.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/grouped_gemm.h"

namespace bagualu::kernels {

namespace gemm {

namespace {

void check_offsets(int G, const int32_t* offsets) {
    BGL_CHECK(G >= 0 && (G == 0 || offsets != nullptr), "G={}", G);
    for (int g = 0; g < G; ++g) {
        BGL_CHECK(offsets[g] >= 0 && offsets[g] <= offsets[g + 1], "offsets[{}..{}] = {}, {}", g,
                  g + 1, offsets[g], offsets[g + 1]);
    }
}

// Runs body(tid) on tm * tn threads of the compute pool (on the caller alone for one).
template <typename F>
void run_grid(const Grid& grid, F&& body) {
    if (grid.tm * grid.tn == 1) {
        body(0);
        return;
    }
    compute_pool().run([&](int tid) {
        if (tid < grid.tm * grid.tn) body(tid);
    });
}

// Forward form: the groups' rows are one range [offsets[0], offsets[G]) of A and C, so threads
// split that range (and N) exactly as gemm_packed splits one matrix; a thread's rows may cross
// group boundaries, and it runs one gemm_rect per group it touches.
void grouped_packed(const KernelSpec& s, Trans ta, Trans tb, int G, const int32_t* offsets, int N,
                    int K, float alpha, const float* A, int lda, const float* B, int ldb,
                    size_t stride_b, float beta, float* C, int ldc) {
    const int row0 = offsets[0], R = offsets[G] - offsets[0];
    if (R == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        scale_c(R, N, beta, C + size_t(row0) * size_t(ldc), ldc);
        return;
    }
    const size_t a_step = ta == Trans::N ? size_t(lda) : 1;
    const Grid grid     = choose_grid(s, R, N, K, compute_pool().size());
    run_grid(grid, [&](int tid) {
        const Range rows = split(R, s.mr, grid.tm, tid / grid.tn);
        const Range cols = split(N, s.nr, grid.tn, tid % grid.tn);
        if (rows.begin >= rows.end || cols.begin >= cols.end) return;
        reserve_pack_buffers(s, s.mc, N, K);
        const int lo = row0 + rows.begin, hi = row0 + rows.end;
        // the last group starting at or before lo: the first with a row in [lo, hi)
        int g = static_cast<int>(std::upper_bound(offsets, offsets + G + 1, lo) - offsets) - 1;
        for (; g < G && offsets[g] < hi; ++g) {
            const int b = std::max(lo, offsets[g]), e = std::min(hi, offsets[g + 1]);
            if (b >= e) continue;
            const PackSrc a{A + size_t(offsets[g]) * a_step, lda, ta == Trans::N};
            const PackSrc w{B + size_t(g) * stride_b, ldb, tb == Trans::T};
            gemm_rect(s, a, w, b - offsets[g], e - offsets[g], cols.begin, cols.end, K, alpha, beta,
                      C + size_t(offsets[g]) * size_t(ldc), ldc);
        }
    });
}

// A place in the TN form's concatenated output rows: row r of group g.
struct Pos {
    int g, r;
};

// The first row, in whole register tiles of a group, before which the rows weigh at least
// `target`; row r of group g weighs K_g (its products' depth), so equal weights are equal work.
Pos locate(int64_t target, int G, const int32_t* offsets, int M, int mr) {
    int64_t cum = 0;
    for (int g = 0; g < G; ++g) {
        const int64_t kg = offsets[g + 1] - offsets[g];
        if (kg == 0) continue;
        if (cum + kg * M > target) {
            const int64_t r = (target - cum + kg - 1) / kg;
            const int rr    = static_cast<int>((r + mr - 1) / mr * mr);
            return rr >= M ? Pos{g + 1, 0} : Pos{g, rr};
        }
        cum += kg * M;
    }
    return Pos{G, 0};
}

// Weight-gradient form: group g's output is its own (M, N) matrix with depth K_g. Threads split
// the groups' concatenated output rows by weight (and N), never a group's depth.
void grouped_tn_packed(const KernelSpec& s, int G, const int32_t* offsets, int M, int N,
                       float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                       float* C, int ldc, size_t stride_c) {
    int64_t depth = 0;  // sum of K_g over groups with work
    int busy      = 0;
    for (int g = 0; g < G; ++g) {
        const int kg = offsets[g + 1] - offsets[g];
        if (kg == 0 || alpha == 0.0f) {
            scale_c(M, N, beta, C + size_t(g) * stride_c, ldc);
        } else {
            depth += kg;
            ++busy;
        }
    }
    if (busy == 0) return;
    const int64_t rows   = std::min<int64_t>(int64_t(M) * busy, INT32_MAX);
    const Grid grid      = choose_grid(s, static_cast<int>(rows), N, static_cast<int>(depth / busy),
                                       compute_pool().size());
    const int64_t weight = depth * M;
    run_grid(grid, [&](int tid) {
        const int i      = tid / grid.tn;
        const Range cols = split(N, s.nr, grid.tn, tid % grid.tn);
        if (cols.begin >= cols.end) return;
        const Pos b = locate(weight * i / grid.tm, G, offsets, M, s.mr);
        const Pos e = locate(weight * (i + 1) / grid.tm, G, offsets, M, s.mr);
        reserve_pack_buffers(s, s.mc, N, s.kc);
        for (int g = b.g; g <= std::min(e.g, G - 1); ++g) {
            const int kg = offsets[g + 1] - offsets[g];
            const int r0 = g == b.g ? b.r : 0, r1 = g == e.g ? e.r : M;
            if (kg == 0 || r0 >= r1) continue;
            const PackSrc a{A + size_t(offsets[g]) * size_t(lda), lda, false};
            const PackSrc x{B + size_t(offsets[g]) * size_t(ldb), ldb, false};
            gemm_rect(s, a, x, r0, r1, cols.begin, cols.end, kg, alpha, beta,
                      C + size_t(g) * stride_c, ldc);
        }
    });
}

}  // namespace

}  // namespace gemm

void grouped_gemm_f32(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                      const float* A, int lda, const float* B, int ldb, size_t stride_b, float beta,
                      float* C, int ldc) {
    BGL_CHECK(N >= 0 && K >= 0, "N={} K={}", N, K);
    gemm::check_offsets(G, offsets);
    if (G == 0) return;
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref || p == gemm::Path::openblas) {
        const size_t a_step = ta == Trans::N ? size_t(lda) : 1;
        for (int g = 0; g < G; ++g) {
            gemm_f32(ta, tb, offsets[g + 1] - offsets[g], N, K, alpha,
                     A + size_t(offsets[g]) * a_step, lda, B + size_t(g) * stride_b, ldb, beta,
                     C + size_t(offsets[g]) * size_t(ldc), ldc);
        }
        return;
    }
    gemm::grouped_packed(gemm::f32_spec(p), ta, tb, G, offsets, N, K, alpha, A, lda, B, ldb,
                         stride_b, beta, C, ldc);
}

void grouped_gemm_tn_f32(int G, const int32_t* offsets, int M, int N, float alpha, const float* A,
                         int lda, const float* B, int ldb, float beta, float* C, int ldc,
                         size_t stride_c) {
    BGL_CHECK(M >= 0 && N >= 0, "M={} N={}", M, N);
    gemm::check_offsets(G, offsets);
    if (G == 0 || M == 0 || N == 0) return;
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref || p == gemm::Path::openblas) {
        for (int g = 0; g < G; ++g) {
            gemm_f32(Trans::T, Trans::N, M, N, offsets[g + 1] - offsets[g], alpha,
                     A + size_t(offsets[g]) * size_t(lda), lda,
                     B + size_t(offsets[g]) * size_t(ldb), ldb, beta, C + size_t(g) * stride_c,
                     ldc);
        }
        return;
    }
    gemm::grouped_tn_packed(gemm::f32_spec(p), G, offsets, M, N, alpha, A, lda, B, ldb, beta, C,
                            ldc, stride_c);
}

}  // namespace bagualu::kernels

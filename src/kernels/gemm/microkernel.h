// The register-blocked micro-kernel, written once over a small vector-ops interface (Ops) and
// compiled per ISA by including this header: an MR x (NV * Ops::width) tile of C is held in
// registers while the packed panels stream through, Ops::kstep k values per step.
// Internal linkage, like pack.h, so each ISA's copy stays with its own flags.
#pragma once
#include <cstddef>

#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm {
namespace {

// Ops provides: reg, packed_t, width, kstep, zero(), load_b(const packed_t*) (width * kstep
// packed values), bcast_a(const packed_t*) (kstep values to every lane), madd(acc, a, b),
// set1(float), mul(reg, reg), loadu/storeu(float*), fmadd(a, b, c) = a * b + c and its scalar
// twin fmadd_scalar, rounding exactly as one lane of fmadd does.
// The tile reads A's values of a k step from an ASrc: bcast(i) broadcasts row i's, next() moves
// to the next step, prefetch() asks for a later step's values where the hardware would not.
// StridedA: the MR * kstep values of a step together, the next step's `step` further on (a
// packed panel, micro_tile); ColsA: the same with A stored by k where it lies (micro_tile_cols),
// a row of A per step; RowsA: each row where it lies (A stored by row, micro_tile_rows).
template <typename Ops>
struct StridedA {
    const typename Ops::packed_t* a;
    size_t step;
    typename Ops::reg bcast(int i) const { return Ops::bcast_a(a + i * Ops::kstep); }
    void next() { a += step; }
    void prefetch() const {}
};
// A stored by k where it lies: StridedA whose steps lie a row of A apart, each on new cache
// lines, which the hardware prefetcher does not follow across pages; so fetched kAhead steps
// ahead (both lines an MR-value step may span; past A's end a prefetch reads nothing). The
// experts' weight gradients, which read it (kernels/gemm/grouped.cpp), with 64 experts of 96:
// 1.2-1.35x faster than without, 8 x 384 1.05-1.2x (4, 8 and 32 steps ahead: docs/results.md).
// Prefetching only: the sums are those of micro_tile on the packed rows.
template <typename Ops, int MR>
struct ColsA : StridedA<Ops> {
    static constexpr int kAhead = 16;
    void prefetch() const {
        const auto* p = reinterpret_cast<const char*>(this->a + size_t(kAhead) * this->step);
        __builtin_prefetch(p);
        __builtin_prefetch(p + MR * sizeof(typename Ops::packed_t) - 1);
    }
};
template <typename Ops>
struct RowsA {
    const float* const* rows;
    size_t k = 0;
    typename Ops::reg bcast(int i) const { return Ops::bcast_a(rows[i] + k); }
    void next() { ++k; }
    void prefetch() const {}
};

// C's first `rows` rows of the tile = alpha * acc + beta * C, each a full row of registers
// (inlined with rows == MR, the row check folds away).
template <typename Ops, int MR, int NV>
[[gnu::always_inline]] inline void store_rows(const typename Ops::reg (&acc)[MR][NV], int rows,
                                              float* c, int ldc, typename Ops::reg va, float beta) {
    constexpr int W            = Ops::width;
    const typename Ops::reg vb = Ops::set1(beta);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
        if (i == rows) break;
        float* ci = c + size_t(i) * size_t(ldc);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            typename Ops::reg t = Ops::mul(acc[i][v], va);
            if (beta != 0.0f) t = Ops::fmadd(vb, Ops::loadu(ci + v * W), t);
            Ops::storeu(ci + v * W, t);
        }
    }
}

template <typename Ops, int MR, int NV, typename ASrc>
[[gnu::always_inline]] inline void micro_tile_src(int kcp, ASrc a, const void* b_panel, float* c,
                                                  int ldc, float alpha, float beta, int m, int n) {
    // B is prefetched this many k steps ahead; past the panel's end that is the next panel,
    // which the next tile of the jr loop starts on (measured: +2-5% over none on Zen 3).
    constexpr int kPrefetchK = 32;
    using reg                = typename Ops::reg;
    using packed_t           = typename Ops::packed_t;
    constexpr int W          = Ops::width;
    constexpr int KS         = Ops::kstep;
    constexpr int NR         = NV * W;
    const auto* b            = static_cast<const packed_t*>(b_panel);

    reg acc[MR][NV];
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = Ops::zero();
    }
    // The C rows are read or written after the k loop: fetch both cache lines a row may span.
    for (int i = 0; i < (m < MR ? m : MR); ++i) {
        __builtin_prefetch(c + size_t(i) * size_t(ldc));
        __builtin_prefetch(c + size_t(i) * size_t(ldc) + (n < NR ? n : NR) - 1);
    }

#pragma GCC unroll 2
    for (int k = 0; k < kcp; k += KS) {
        reg bv[NV];
        const char* pb = reinterpret_cast<const char*>(b + NR * KS * kPrefetchK);
#pragma GCC unroll 4
        for (size_t off = 0; off < NR * KS * sizeof(packed_t); off += 64)
            __builtin_prefetch(pb + off);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) bv[v] = Ops::load_b(b + v * W * KS);
        a.prefetch();
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i) {
            const reg av = a.bcast(i);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[i][v] = Ops::madd(acc[i][v], av, bv[v]);
        }
        a.next();
        b += NR * KS;
    }

    const reg va = Ops::set1(alpha);
    if (n == NR) {
        if (m == MR) {
            store_rows<Ops, MR, NV>(acc, MR, c, ldc, va, beta);
        } else {
            store_rows<Ops, MR, NV>(acc, m, c, ldc, va, beta);
        }
        return;
    }
    alignas(64) float tile[MR * NR];
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) Ops::storeu(tile + i * NR + v * W, Ops::mul(acc[i][v], va));
    }
    for (int i = 0; i < m; ++i) {
        float* ci = c + size_t(i) * size_t(ldc);
        for (int j = 0; j < n; ++j) {
            const float t = tile[i * NR + j];
            ci[j]         = beta == 0.0f ? t : Ops::fmadd_scalar(beta, ci[j], t);
        }
    }
}

// A tile of m <= MR rows of C on the fewest registers that hold them: for MR a multiple of 3,
// a third or two thirds of MR rows where m fits, else all MR. The last row block of a product
// whose rows are not a multiple of MR (an expert's 256 rows are 21 tiles of 12 and one of 4)
// then spends no multiply-adds on its padding rows. Each row's sums are the same multiply-adds
// in the same order whatever the tile's height, so the results are bitwise those of the full
// tile.
template <typename Ops, int MR, int NV, typename ASrc>
[[gnu::always_inline]] inline void micro_tile_fitted(int kcp, ASrc a, const void* b_panel, float* c,
                                                     int ldc, float alpha, float beta, int m,
                                                     int n) {
    if constexpr (MR % 3 == 0 && MR >= 6) {
        if (m <= MR / 3) {
            micro_tile_src<Ops, MR / 3, NV>(kcp, a, b_panel, c, ldc, alpha, beta, m, n);
            return;
        }
        if (m <= 2 * MR / 3) {
            micro_tile_src<Ops, 2 * MR / 3, NV>(kcp, a, b_panel, c, ldc, alpha, beta, m, n);
            return;
        }
    }
    micro_tile_src<Ops, MR, NV>(kcp, a, b_panel, c, ldc, alpha, beta, m, n);
}

// The register tile over a packed A panel (kcp: the padded depth).
template <typename Ops, int MR, int NV>
void micro_tile(int kcp, const void* a_panel, const void* b_panel, float* c, int ldc, float alpha,
                float beta, int m, int n) {
    const StridedA<Ops> a{static_cast<const typename Ops::packed_t*>(a_panel),
                          size_t(MR) * Ops::kstep};
    micro_tile_fitted<Ops, MR, NV>(kcp, a, b_panel, c, ldc, alpha, beta, m, n);
}

// The same tile with A read where it lies instead of packed (kstep 1 only): element (i, k) of
// the tile is a[k * lda + i] (op(A) stored by k: the tile's MR values of a k lie together; all
// MR must be readable). The same multiply-adds in the same order as micro_tile on the packed
// rows, so bitwise its results, without copying an operand that few column tiles read.
template <typename Ops, int MR, int NV>
void micro_tile_cols(int kc, const float* a, int lda, const void* b_panel, float* c, int ldc,
                     float alpha, float beta, int m, int n) {
    static_assert(Ops::kstep == 1, "A in place: one k a step");
    micro_tile_fitted<Ops, MR, NV>(kc, ColsA<Ops, MR>{{a, size_t(lda)}}, b_panel, c, ldc, alpha,
                                   beta, m, n);
}

// The same tile with op(A) stored by row read where it lies (kstep 1 only): element (i, k) of
// the tile is rows[i][k], the MR rows' first values of the k block (all MR readable for kc
// values). The same multiply-adds in the same order as micro_tile on the packed rows, so bitwise
// its results, without packing an operand that few column tiles read.
template <typename Ops, int MR, int NV>
void micro_tile_rows(int kc, const float* const* rows, const void* b_panel, float* c, int ldc,
                     float alpha, float beta, int m, int n) {
    static_assert(Ops::kstep == 1, "A in place: one k a step");
    micro_tile_fitted<Ops, MR, NV>(kc, RowsA<Ops>{rows}, b_panel, c, ldc, alpha, beta, m, n);
}

// The spec of a float kernel (kstep 1, float panels) over this tile: micro_tile on packed
// panels, and micro_tile_cols / micro_tile_rows on A read in place, stored by k or by row.
template <typename Ops, int MR, int NV>
constexpr KernelSpec float_kernel_spec(int mc, int kc, int nc,
                                       void (*pack_a)(PackSrc, int, int, int, int, void*),
                                       void (*pack_b)(PackSrc, int, int, int, int, void*)) {
    static_assert(Ops::kstep == 1, "float panels: one k a step");
    static_assert(MR <= kMaxMicroRows, "micro_rows takes at most kMaxMicroRows row pointers");
    KernelSpec s{MR,
                 NV * Ops::width,
                 1,
                 4,
                 mc,
                 kc,
                 nc,
                 pack_a,
                 pack_b,
                 micro_tile<Ops, MR, NV>,
                 micro_tile_cols<Ops, MR, NV>};
    s.micro_rows = micro_tile_rows<Ops, MR, NV>;
    return s;
}

}  // namespace
}  // namespace bagualu::kernels::gemm

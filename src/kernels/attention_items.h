// The SIMD causal attention items, written once over a small vector-ops interface (V) and
// compiled per ISA by including this header (kernels/avx2/attention.cpp, kernels/avx512/
// attention.cpp), as kernels/gemm/microkernel.h is for the GEMM. Queries are taken in blocks of
// kQB = 16 rows, QV = 16 / V::width registers wide; every product is a register-blocked
// broadcast-FMA micro-kernel over operands read in place from qkv / dout, plus small transposed
// copies of the query block (and of its dout rows), so no (T, T) matrix and no per-row dot
// products:
//   scores    S^T (keys, 16) = K Q^T * scale       (and dP^T = V dout^T in the backward)
//   weighted  O (16, hs)     = P V                 (and dQ = dS K)
//   key-side  dK (keys, hs) += dS^T Q, dV += P^T dout, summed into per-head scratch.
// Scores of one query block against all its keys are kept (T, 16) key-major, so the softmax
// is exact (row max, then exponentials summed in double) with O(T) scratch per thread.
// Forward items are (batch, head, query block), backward items (batch, head) with the query
// blocks in order: each output element is summed in one fixed order whichever thread runs it,
// and in the same order whatever the vector width (tiles change which elements a register
// holds, not the order of any element's sums), so every ISA's items give the same bits.
// Internal linkage: each including source keeps the copy built with its own flags.
//
// V provides: reg, width (floats per register, 8 or 16), score_keys (keys per scores tile),
// col_vecs (most registers per row of a weighted / key-side tile), zero(), load / store
// (aligned to width floats), loadu / storeu, set1, fmadd(a, b, c) = a * b + c, mul, sub, max,
// exp (exp_ps of kernels/avx2/exp.h lane for lane), and widen_add(double* sums, reg p): sums[i]
// += double(p[i]) for the register's lanes.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace bagualu::kernels {
namespace {

namespace attn {

constexpr int kQB = 16;  // query rows per block (kernels/ops_avx2.h kAttentionQueryBlock)

template <int M>
struct Int {
    static constexpr int value = M;
};

inline int min_i(int a, int b) { return a < b ? a : b; }
inline int max_i(int a, int b) { return a > b ? a : b; }

// f(Int<m>, i) over [0, n) in tiles of M, then one tile of the remainder (m < M).
template <int M, typename F>
inline void tail_tile(int rem, int i, F& f) {
    if (rem == M) {
        f(Int<M>{}, i);
    } else if constexpr (M > 1) {
        tail_tile<M - 1>(rem, i, f);
    }
}
template <int M, typename F>
inline void tiles(int n, F&& f) {
    int i = 0;
    for (; i + M <= n; i += M) f(Int<M>{}, i);
    if constexpr (M > 1) {
        if (i < n) tail_tile<M - 1>(n - i, i, f);
    }
}

// Over columns [0, hs), hs a multiple of V::width, in tiles of V::col_vecs registers, then
// halving: f(Int<registers>, e).
template <typename V, int NV = V::col_vecs, typename F>
inline void col_tiles(int hs, int e, F&& f) {
    for (; e + NV * V::width <= hs; e += NV * V::width) f(Int<NV>{}, e);
    if constexpr (NV > 1) col_tiles<V, NV / 2>(hs, e, f);
}

// st[k * kQB + r] = sum_e x[k * ldx + e] * yt[e * kQB + r] for keys k in [0, MK): a key-major
// block of scores. yt is a transposed (hs, kQB) block, aligned; st too.
template <typename V, int MK>
inline void scores_tile(const float* x, int64_t ldx, const float* yt, int hs, float* st) {
    constexpr int QV = kQB / V::width;
    typename V::reg acc[MK][QV];
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 2
        for (int q = 0; q < QV; ++q) acc[i][q] = V::zero();
    }
    for (int e = 0; e < hs; ++e) {
        typename V::reg y[QV];
#pragma GCC unroll 2
        for (int q = 0; q < QV; ++q) y[q] = V::load(yt + e * kQB + q * V::width);
#pragma GCC unroll 16
        for (int i = 0; i < MK; ++i) {
            const typename V::reg xv = V::set1(x[i * ldx + e]);
#pragma GCC unroll 2
            for (int q = 0; q < QV; ++q) acc[i][q] = V::fmadd(xv, y[q], acc[i][q]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 2
        for (int q = 0; q < QV; ++q) V::store(st + i * kQB + q * V::width, acc[i][q]);
    }
}

template <typename V>
void scores(const float* x, int64_t ldx, const float* yt, int hs, int nk, float* st) {
    tiles<V::score_keys>(nk, [&](auto mk, int k) {
        scores_tile<V, decltype(mk)::value>(x + k * ldx, ldx, yt, hs, st + k * kQB);
    });
}

// o[r * ldo + e] = sum_{k < nk} p[k * kQB + r] * v[k * ldv + e] for rows r in [r0, r0 + 4) and
// columns [e0, e0 + width NV) (pointers already offset by r0 and e0): overwritten.
template <typename V, int NV>
inline void weighted_tile(const float* p, const float* v, int64_t ldv, int nk, float* o, int ldo) {
    typename V::reg acc[4][NV];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
    }
    for (int k = 0; k < nk; ++k) {
        typename V::reg vv[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) vv[j] = V::loadu(v + k * ldv + V::width * j);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const typename V::reg pb = V::set1(p[k * kQB + i]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = V::fmadd(pb, vv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) V::store(o + i * ldo + V::width * j, acc[i][j]);
    }
}

// o (kQB, hs) = p^T v over keys: row r uses keys [0, min(nk, t0 + r + 1)) only, the causal
// limit, since its later probabilities are 0. o is aligned with row stride hs.
template <typename V>
void weighted(const float* p, const float* v, int64_t ldv, int hs, int nk, int t0, float* o) {
    for (int r0 = 0; r0 < kQB; r0 += 4) {
        const int nkr = min_i(nk, t0 + r0 + 4);
        col_tiles<V>(hs, 0, [&](auto nv, int e) {
            weighted_tile<V, decltype(nv)::value>(p + r0, v + e, ldv, nkr, o + r0 * hs + e, hs);
        });
    }
}

// acc[k * ldacc + e] += sum_{r < nr} g[k * kQB + r] * y[r * ldy + e] for keys k in
// [k0, k0 + MK) and columns [e0, e0 + width NV) (pointers offset by k0 and e0; y by e0 only).
template <typename V, int MK, int NV>
inline void keyside_tile(const float* g, const float* y, int64_t ldy, int r_begin, int nr,
                         float* acc_out, int ldacc) {
    typename V::reg acc[MK][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = V::load(acc_out + i * ldacc + V::width * j);
    }
    for (int r = r_begin; r < nr; ++r) {
        typename V::reg yv[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) yv[j] = V::loadu(y + r * ldy + V::width * j);
#pragma GCC unroll 8
        for (int i = 0; i < MK; ++i) {
            const typename V::reg gb = V::set1(g[i * kQB + r]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = V::fmadd(gb, yv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) V::store(acc_out + i * ldacc + V::width * j, acc[i][j]);
    }
}

// acc (keys, hs) += g^T y for keys [0, nk) and query rows [0, nr) of the block at t0: key k
// takes rows r >= k - t0 only, the others' g being 0 (causal mask).
template <typename V>
void keyside(const float* g, const float* y, int64_t ldy, int hs, int nk, int nr, int t0,
             float* acc) {
    tiles<6>(nk, [&](auto mk, int k) {
        constexpr int MK  = decltype(mk)::value;
        const int r_begin = max_i(0, k - t0);
        col_tiles<V, (V::col_vecs < 2 ? V::col_vecs : 2)>(hs, 0, [&](auto nv, int e) {
            keyside_tile<V, MK, decltype(nv)::value>(g + k * kQB, y + e, ldy, r_begin, nr,
                                                     acc + k * hs + e, hs);
        });
    });
}

// yt[e * kQB + r] = s * y[r * ldy + e] for r < nr, 0 for the padding rows r in [nr, kQB).
inline void transpose_block(float* yt, const float* y, int64_t ldy, int nr, int hs, float s) {
    for (int e = 0; e < hs; ++e) {
        for (int r = 0; r < kQB; ++r) yt[e * kQB + r] = r < nr ? y[r * ldy + e] * s : 0.f;
    }
}

// Float dot product of hs (a multiple of 8) terms: 8 lanes, then lanes pairwise (AVX2
// instructions, which every including ISA has).
inline float dot(const float* a, const float* b, int hs) {
    __m256 acc = _mm256_setzero_ps();
    for (int e = 0; e < hs; e += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// scratch rounded up to 64 bytes (the scratch sizes below give 16 floats of slack).
inline float* align64(float* p) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    return p + ((64 - addr % 64) % 64) / sizeof(float);
}

inline size_t forward_scratch(int T, int hs) { return size_t(2 * hs * kQB) + size_t(T) * kQB + 16; }

template <typename V>
void forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH, int64_t begin,
                   int64_t end, float* scratch) {
    constexpr int QV  = kQB / V::width;
    using reg         = typename V::reg;
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const float scale = 1.f / __builtin_sqrtf(float(hs));
    const int nqb     = (T + kQB - 1) / kQB;
    float* qt         = align64(scratch);
    float* o          = qt + hs * kQB;  // (kQB, hs) weighted sums
    float* s          = o + hs * kQB;   // (T, kQB) scores, then probabilities, key-major
    for (int64_t idx = begin; idx < end; ++idx) {
        const int64_t bh = idx / nqb;
        const int j      = int(idx % nqb);
        const int qb     = (j % 2 == 0) ? j / 2 : nqb - 1 - j / 2;
        const int64_t b = bh / NH, h = bh % NH;
        const int t0 = qb * kQB, t1 = min_i(t0 + kQB, T);
        const int nr = t1 - t0;

        const float* qbase = qkv + b * T * C3 + h * hs;
        const float* kbase = qbase + C;
        const float* vbase = qbase + 2 * C;
        transpose_block(qt, qbase + t0 * C3, C3, nr, hs, scale);
        scores<V>(kbase, C3, qt, hs, t1, s);
        // Causal mask: key k > query t0 + r.
        for (int k = t0 + 1; k < t1; ++k) {
            for (int r = 0; r < k - t0; ++r) s[k * kQB + r] = -__builtin_inff();
        }
        // Row max, then exponentials and their sums in double, keys in order.
        reg m[QV];
        for (int q = 0; q < QV; ++q) m[q] = V::set1(-__builtin_inff());
        for (int k = 0; k < t1; ++k) {
            for (int q = 0; q < QV; ++q) m[q] = V::max(m[q], V::load(s + k * kQB + q * V::width));
        }
        alignas(64) double sums[kQB] = {};
        for (int k = 0; k < t1; ++k) {
            for (int q = 0; q < QV; ++q) {
                float* sk    = s + k * kQB + q * V::width;
                const reg pk = V::exp(V::sub(V::load(sk), m[q]));
                V::store(sk, pk);
                V::widen_add(sums + q * V::width, pk);
            }
        }
        alignas(64) float mx[kQB];
        for (int q = 0; q < QV; ++q) V::store(mx + q * V::width, m[q]);
        // out_t = sum_k p_tk v_k / sum_t.
        weighted<V>(s, vbase, C3, hs, t1, t0, o);
        for (int r = 0; r < nr; ++r) {
            float* dst    = out + (b * T + t0 + r) * C + h * hs;
            const reg inv = V::set1(float(1.0 / sums[r]));
            for (int e = 0; e < hs; e += V::width) {
                V::storeu(dst + e, V::mul(V::load(o + r * hs + e), inv));
            }
            lse[bh * T + t0 + r] = float(double(mx[r]) + __builtin_log(sums[r]));
        }
    }
}

inline size_t backward_scratch(int T, int hs) {
    return 3 * size_t(hs) * kQB + 2 * size_t(T) * kQB + 2 * size_t(T) * hs + 16;
}

template <typename V>
void backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                    const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                    float* scratch) {
    constexpr int QV   = kQB / V::width;
    using reg          = typename V::reg;
    const int hs       = C / NH;
    const int64_t C3   = int64_t{3} * C;
    const float scale  = 1.f / __builtin_sqrtf(float(hs));
    const size_t block = size_t(hs) * kQB, keys = size_t(T) * kQB, head = size_t(T) * hs;
    float* qt  = align64(scratch);
    float* dyt = qt + block;   // (hs, kQB) dout rows of the block, transposed
    float* dq  = dyt + block;  // (kQB, hs) dq of the block
    float* p   = dq + block;   // (T, kQB) probabilities, key-major
    float* ds  = p + keys;     // (T, kQB) dP, then scale * dL/dscore, key-major
    float* dk  = ds + keys;    // (T, hs)
    float* dv  = dk + head;    // (T, hs)
    for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        const float* qbase  = qkv + b * T * C3 + h * hs;
        const float* kbase  = qbase + C;
        const float* vbase  = qbase + 2 * C;
        float* dqbase       = dqkv + b * T * C3 + h * hs;
        const float* dybase = dout + b * T * C + h * hs;
        const float* ybase  = out + b * T * C + h * hs;
        std::memset(dk, 0, 2 * head * sizeof(float));
        for (int t0 = 0; t0 < T; t0 += kQB) {
            const int t1 = min_i(t0 + kQB, T);
            const int nr = t1 - t0;
            transpose_block(qt, qbase + t0 * C3, C3, nr, hs, scale);
            transpose_block(dyt, dybase + int64_t{t0} * C, C, nr, hs, 1.f);
            alignas(64) float l[kQB], D[kQB];
            for (int r = 0; r < kQB; ++r) {
                l[r] = r < nr ? lse[bh * T + t0 + r] : 0.f;
                D[r] = r < nr ? dot(dybase + int64_t(t0 + r) * C, ybase + int64_t(t0 + r) * C, hs)
                              : 0.f;
            }
            // The forward's scores, bit for bit; dP = dout . v.
            scores<V>(kbase, C3, qt, hs, t1, p);
            scores<V>(vbase, C3, dyt, hs, t1, ds);
            // p = exp(s - lse), ds = p (dP - D) * scale.
            const reg sc = V::set1(scale);
            for (int k = 0; k < t1; ++k) {
                for (int q = 0; q < QV; ++q) {
                    float* pk    = p + k * kQB + q * V::width;
                    float* dsk   = ds + k * kQB + q * V::width;
                    const reg pe = V::exp(V::sub(V::load(pk), V::load(l + q * V::width)));
                    V::store(pk, pe);
                    V::store(
                        dsk,
                        V::mul(V::mul(pe, V::sub(V::load(dsk), V::load(D + q * V::width))), sc));
                }
            }
            // Causal mask, key k > query t0 + r: p = ds = 0. (The padding rows r >= nr are
            // never read.)
            for (int k = t0 + 1; k < t1; ++k) {
                for (int r = 0; r < k - t0; ++r) p[k * kQB + r] = ds[k * kQB + r] = 0.f;
            }
            // dq_t = sum_k ds_tk k_k; dk_k += sum_t ds_tk q_t; dv_k += sum_t p_tk dout_t.
            weighted<V>(ds, kbase, C3, hs, t1, t0, dq);
            for (int r = 0; r < nr; ++r) {
                std::memcpy(dqbase + (t0 + r) * C3, dq + r * hs, size_t(hs) * sizeof(float));
            }
            keyside<V>(ds, qbase + t0 * C3, C3, hs, t1, nr, t0, dk);
            keyside<V>(p, dybase + int64_t{t0} * C, C, hs, t1, nr, t0, dv);
        }
        for (int t = 0; t < T; ++t) {
            std::memcpy(dqbase + t * C3 + C, dk + t * hs, size_t(hs) * sizeof(float));
            std::memcpy(dqbase + t * C3 + 2 * C, dv + t * hs, size_t(hs) * sizeof(float));
        }
    }
}

}  // namespace attn

}  // namespace
}  // namespace bagualu::kernels

// AVX2/FMA causal attention (kernels/ops_avx2.h). Queries are taken in blocks of kQB =
// 16 rows, two ymm registers wide; every product is a register-blocked broadcast-FMA
// micro-kernel over operands read in place from qkv / dout, plus small transposed copies of the
// query block (and of its dout rows), so no (T, T) matrix and no per-row dot products:
//   scores    S^T (keys, 16) = K Q^T * scale       (and dP^T = V dout^T in the backward)
//   weighted  O (16, hs)     = P V                 (and dQ = dS K)
//   key-side  dK (keys, hs) += dS^T Q, dV += P^T dout, summed into per-head scratch.
// Scores of one query block against all its keys are kept (T, 16) key-major, so the softmax
// is exact (row max, then exponentials summed in double) with O(T) scratch per thread.
// Forward items are (batch, head, query block), backward items (batch, head) with the query
// blocks in order: each output element is summed in one fixed order whichever thread runs it.
// Threads and scratch are ops.cpp's; everything here but the entry points has internal
// linkage and no library templates are instantiated, so no code built for AVX2 can stand in
// for a portable copy at link time.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/avx2/exp.h"
#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {

namespace {

constexpr int kQB = kAttentionQueryBlock;  // two ymm registers of a key-major score row

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

// Same over columns [0, hs), hs a multiple of 8, in tiles of 16 then 8: f(Int<vectors>, e).
template <typename F>
inline void col_tiles(int hs, F&& f) {
    int e = 0;
    for (; e + 16 <= hs; e += 16) f(Int<2>{}, e);
    if (e < hs) f(Int<1>{}, e);
}

// st[k * kQB + r] = sum_e x[k * ldx + e] * yt[e * kQB + r] for keys k in [0, nk): a key-major
// block of scores. yt is a transposed (hs, kQB) block, 32-byte aligned; st too.
template <int MK>
inline void scores_tile(const float* x, int64_t ldx, const float* yt, int hs, float* st) {
    __m256 acc[MK][2];
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int e = 0; e < hs; ++e) {
        const __m256 y0 = _mm256_load_ps(yt + e * kQB);
        const __m256 y1 = _mm256_load_ps(yt + e * kQB + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MK; ++i) {
            const __m256 xv = _mm256_broadcast_ss(x + i * ldx + e);
            acc[i][0]       = _mm256_fmadd_ps(xv, y0, acc[i][0]);
            acc[i][1]       = _mm256_fmadd_ps(xv, y1, acc[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
        _mm256_store_ps(st + i * kQB, acc[i][0]);
        _mm256_store_ps(st + i * kQB + 8, acc[i][1]);
    }
}

void scores(const float* x, int64_t ldx, const float* yt, int hs, int nk, float* st) {
    tiles<6>(nk, [&](auto mk, int k) {
        scores_tile<decltype(mk)::value>(x + k * ldx, ldx, yt, hs, st + k * kQB);
    });
}

// o[r * ldo + e] = sum_{k < nk} p[k * kQB + r] * v[k * ldv + e] for rows r in [r0, r0 + 4) and
// columns [e0, e0 + 8 NV) (pointers already offset by r0 and e0): overwritten.
template <int NV>
inline void weighted_tile(const float* p, const float* v, int64_t ldv, int nk, float* o, int ldo) {
    __m256 acc[4][NV];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
    }
    for (int k = 0; k < nk; ++k) {
        __m256 vv[NV];
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) vv[j] = _mm256_loadu_ps(v + k * ldv + 8 * j);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const __m256 pb = _mm256_broadcast_ss(p + k * kQB + i);
#pragma GCC unroll 2
            for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(pb, vv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) _mm256_store_ps(o + i * ldo + 8 * j, acc[i][j]);
    }
}

// o (kQB, hs) = p^T v over keys: row r uses keys [0, min(nk, t0 + r + 1)) only, the causal
// limit, since its later probabilities are 0. o is 32-byte aligned with row stride hs.
void weighted(const float* p, const float* v, int64_t ldv, int hs, int nk, int t0, float* o) {
    for (int r0 = 0; r0 < kQB; r0 += 4) {
        const int nkr = min_i(nk, t0 + r0 + 4);
        col_tiles(hs, [&](auto nv, int e) {
            weighted_tile<decltype(nv)::value>(p + r0, v + e, ldv, nkr, o + r0 * hs + e, hs);
        });
    }
}

// acc[k * ldacc + e] += sum_{r < nr} g[k * kQB + r] * y[r * ldy + e] for keys k in
// [k0, k0 + MK) and columns [e0, e0 + 8 NV) (pointers offset by k0 and e0; y by e0 only).
template <int MK, int NV>
inline void keyside_tile(const float* g, const float* y, int64_t ldy, int r_begin, int nr,
                         float* acc_out, int ldacc) {
    __m256 acc[MK][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_load_ps(acc_out + i * ldacc + 8 * j);
    }
    for (int r = r_begin; r < nr; ++r) {
        __m256 yv[NV];
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) yv[j] = _mm256_loadu_ps(y + r * ldy + 8 * j);
#pragma GCC unroll 8
        for (int i = 0; i < MK; ++i) {
            const __m256 gb = _mm256_broadcast_ss(g + i * kQB + r);
#pragma GCC unroll 2
            for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(gb, yv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 2
        for (int j = 0; j < NV; ++j) _mm256_store_ps(acc_out + i * ldacc + 8 * j, acc[i][j]);
    }
}

// acc (keys, hs) += g^T y for keys [0, nk) and query rows [0, nr) of the block at t0: key k
// takes rows r >= k - t0 only, the others' g being 0 (causal mask).
void keyside(const float* g, const float* y, int64_t ldy, int hs, int nk, int nr, int t0,
             float* acc) {
    tiles<6>(nk, [&](auto mk, int k) {
        constexpr int MK  = decltype(mk)::value;
        const int r_begin = max_i(0, k - t0);
        col_tiles(hs, [&](auto nv, int e) {
            keyside_tile<MK, decltype(nv)::value>(g + k * kQB, y + e, ldy, r_begin, nr,
                                                  acc + k * hs + e, hs);
        });
    });
}

// yt[e * kQB + r] = s * y[r * ldy + e] for r < nr, 0 for the padding rows r in [nr, kQB).
void transpose_block(float* yt, const float* y, int64_t ldy, int nr, int hs, float s) {
    for (int e = 0; e < hs; ++e) {
        for (int r = 0; r < kQB; ++r) yt[e * kQB + r] = r < nr ? y[r * ldy + e] * s : 0.f;
    }
}

// Float dot product of hs (a multiple of 8) terms: 8 lanes, then lanes pairwise.
inline float dot(const float* a, const float* b, int hs) {
    __m256 acc = _mm256_setzero_ps();
    for (int e = 0; e < hs; e += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// scratch rounded up to 32 bytes (the caller gives 8 floats of slack).
float* align32(float* p) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    return p + ((32 - addr % 32) % 32) / sizeof(float);
}

}  // namespace

size_t attention_forward_scratch(int T, int hs) {
    return size_t(2 * hs * kQB) + size_t(T) * kQB + 8;
}

void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch) {
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const float scale = 1.f / __builtin_sqrtf(float(hs));
    const int nqb     = (T + kQB - 1) / kQB;
    float* qt         = align32(scratch);
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
        scores(kbase, C3, qt, hs, t1, s);
        // Causal mask: key k > query t0 + r.
        for (int k = t0 + 1; k < t1; ++k) {
            for (int r = 0; r < k - t0; ++r) s[k * kQB + r] = -__builtin_inff();
        }
        // Row max, then exponentials and their sums in double, keys in order.
        __m256 m0 = _mm256_set1_ps(-__builtin_inff()), m1 = m0;
        for (int k = 0; k < t1; ++k) {
            m0 = _mm256_max_ps(m0, _mm256_load_ps(s + k * kQB));
            m1 = _mm256_max_ps(m1, _mm256_load_ps(s + k * kQB + 8));
        }
        __m256d sum[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                          _mm256_setzero_pd()};
        for (int k = 0; k < t1; ++k) {
            const __m256 p0 = exp_ps(_mm256_sub_ps(_mm256_load_ps(s + k * kQB), m0));
            const __m256 p1 = exp_ps(_mm256_sub_ps(_mm256_load_ps(s + k * kQB + 8), m1));
            _mm256_store_ps(s + k * kQB, p0);
            _mm256_store_ps(s + k * kQB + 8, p1);
            sum[0] = _mm256_add_pd(sum[0], _mm256_cvtps_pd(_mm256_castps256_ps128(p0)));
            sum[1] = _mm256_add_pd(sum[1], _mm256_cvtps_pd(_mm256_extractf128_ps(p0, 1)));
            sum[2] = _mm256_add_pd(sum[2], _mm256_cvtps_pd(_mm256_castps256_ps128(p1)));
            sum[3] = _mm256_add_pd(sum[3], _mm256_cvtps_pd(_mm256_extractf128_ps(p1, 1)));
        }
        alignas(32) float m[kQB];
        alignas(32) double sums[kQB];
        _mm256_store_ps(m, m0);
        _mm256_store_ps(m + 8, m1);
        for (int i = 0; i < 4; ++i) _mm256_store_pd(sums + 4 * i, sum[i]);
        // out_t = sum_k p_tk v_k / sum_t.
        weighted(s, vbase, C3, hs, t1, t0, o);
        for (int r = 0; r < nr; ++r) {
            float* dst       = out + (b * T + t0 + r) * C + h * hs;
            const __m256 inv = _mm256_set1_ps(float(1.0 / sums[r]));
            for (int e = 0; e < hs; e += 8) {
                _mm256_storeu_ps(dst + e, _mm256_mul_ps(_mm256_load_ps(o + r * hs + e), inv));
            }
            lse[bh * T + t0 + r] = float(double(m[r]) + __builtin_log(sums[r]));
        }
    }
}

size_t attention_backward_scratch(int T, int hs) {
    return 3 * size_t(hs) * kQB + 2 * size_t(T) * kQB + 2 * size_t(T) * hs + 8;
}

void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch) {
    const int hs       = C / NH;
    const int64_t C3   = int64_t{3} * C;
    const float scale  = 1.f / __builtin_sqrtf(float(hs));
    const size_t block = size_t(hs) * kQB, keys = size_t(T) * kQB, head = size_t(T) * hs;
    float* qt  = align32(scratch);
    float* dyt = qt + block;   // (hs, kQB) dout rows of the block, transposed
    float* dq  = dyt + block;  // (kQB, hs) dq of the block
    float* p   = dq + block;   // (T, kQB) probabilities, key-major
    float* ds  = p + keys;     // (T, kQB) dP, then scale * dL/dscore, key-major
    float* dk  = ds + keys;    // (T, hs)
    float* dv  = dk + head;    // (T, hs)
    static_assert(kQB % 8 == 0);
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
            alignas(32) float l[kQB], D[kQB];
            for (int r = 0; r < kQB; ++r) {
                l[r] = r < nr ? lse[bh * T + t0 + r] : 0.f;
                D[r] = r < nr ? dot(dybase + int64_t(t0 + r) * C, ybase + int64_t(t0 + r) * C, hs)
                              : 0.f;
            }
            // The forward's scores, bit for bit; dP = dout . v.
            scores(kbase, C3, qt, hs, t1, p);
            scores(vbase, C3, dyt, hs, t1, ds);
            // p = exp(s - lse), ds = p (dP - D) * scale.
            const __m256 l0 = _mm256_load_ps(l), l1 = _mm256_load_ps(l + 8);
            const __m256 D0 = _mm256_load_ps(D), D1 = _mm256_load_ps(D + 8);
            const __m256 sc = _mm256_set1_ps(scale);
            for (int k = 0; k < t1; ++k) {
                float* pk       = p + k * kQB;
                float* dsk      = ds + k * kQB;
                const __m256 p0 = exp_ps(_mm256_sub_ps(_mm256_load_ps(pk), l0));
                const __m256 p1 = exp_ps(_mm256_sub_ps(_mm256_load_ps(pk + 8), l1));
                _mm256_store_ps(pk, p0);
                _mm256_store_ps(pk + 8, p1);
                _mm256_store_ps(
                    dsk,
                    _mm256_mul_ps(_mm256_mul_ps(p0, _mm256_sub_ps(_mm256_load_ps(dsk), D0)), sc));
                _mm256_store_ps(
                    dsk + 8,
                    _mm256_mul_ps(_mm256_mul_ps(p1, _mm256_sub_ps(_mm256_load_ps(dsk + 8), D1)),
                                  sc));
            }
            // Causal mask, key k > query t0 + r: p = ds = 0. (The padding rows r >= nr are
            // never read.)
            for (int k = t0 + 1; k < t1; ++k) {
                for (int r = 0; r < k - t0; ++r) p[k * kQB + r] = ds[k * kQB + r] = 0.f;
            }
            // dq_t = sum_k ds_tk k_k; dk_k += sum_t ds_tk q_t; dv_k += sum_t p_tk dout_t.
            weighted(ds, kbase, C3, hs, t1, t0, dq);
            for (int r = 0; r < nr; ++r) {
                std::memcpy(dqbase + (t0 + r) * C3, dq + r * hs, size_t(hs) * sizeof(float));
            }
            keyside(ds, qbase + t0 * C3, C3, hs, t1, nr, t0, dk);
            keyside(p, dybase + int64_t{t0} * C, C, hs, t1, nr, t0, dv);
        }
        for (int t = 0; t < T; ++t) {
            std::memcpy(dqbase + t * C3 + C, dk + t * hs, size_t(hs) * sizeof(float));
            std::memcpy(dqbase + t * C3 + 2 * C, dv + t * hs, size_t(hs) * sizeof(float));
        }
    }
}

}  // namespace bagualu::kernels::avx2

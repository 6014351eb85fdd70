// AVX-512 causal attention (kernels/ops_avx512.h): the AVX2 kernel's method
// (kernels/avx2/attention.cpp) with the 16-row query block in one zmm register, for head sizes
// that are a multiple of 16. Every product is a register-blocked broadcast-FMA micro-kernel over
// operands read in place from qkv / dout, plus small transposed copies of the query block (and
// of its dout rows):
//   scores    S^T (keys, 16) = K Q^T * scale       (and dP^T = V dout^T in the backward)
//   weighted  O (16, hs)     = P V                 (and dQ = dS K)
//   key-side  dK (keys, hs) += dS^T Q, dV += P^T dout, summed into per-head scratch.
// Each output element is the same chain of operations as in the AVX2 kernel, lane for lane
// (the same FMAs in the same key or column order, the exponential's polynomial, the sums in
// double; neither file has a multiply followed by an add the compiler could fuse), so the two
// give the same bits (a test holds them to it). Forward items are (batch, head, query block),
// backward items (batch, head). Internal linkage except the entry points.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/ops_avx2.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

// The all-ones masked (maskz) forms below are the unmasked instructions: GCC 12 takes the
// unmasked intrinsics' undefined pass-through operand for an uninitialised read.
constexpr __mmask16 kAll = 0xffff;

constexpr int kQB = avx2::kAttentionQueryBlock;  // one zmm register of a key-major score row
static_assert(kQB == 16);

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

// Over columns [0, hs), hs a multiple of 16, in tiles of 64, 32 and 16: f(Int<vectors>, e).
template <typename F>
inline void col_tiles(int hs, F&& f) {
    int e = 0;
    for (; e + 64 <= hs; e += 64) f(Int<4>{}, e);
    if (e + 32 <= hs) {
        f(Int<2>{}, e);
        e += 32;
    }
    if (e < hs) f(Int<1>{}, e);
}

// exp(x), 16 lanes: avx2::exp_ps (kernels/avx2/exp.h) operation for operation.
inline __m512 exp_ps(__m512 x) {
    const __m512 lo       = _mm512_set1_ps(-87.3f);
    const __mmask16 below = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    // max/min return their second operand when either is NaN: NaN flows through.
    const __m512 xc =
        _mm512_maskz_min_ps(kAll, _mm512_set1_ps(88.f), _mm512_maskz_max_ps(kAll, lo, x));
    const __m512 magic = _mm512_set1_ps(12582912.f);
    const __m512 t     = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n     = _mm512_sub_ps(t, magic);
    __m512 r           = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r                  = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p           = _mm512_set1_ps(1.9875691500e-4f);
    p                  = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p                  = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p                  = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p                  = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p                  = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
    const __m512i ni   = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
    const __m512 two_n = _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(kAll, _mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~below), p, two_n);
}

// st[k * kQB + r] = sum_e x[k * ldx + e] * yt[e * kQB + r] for keys k in [0, MK): a key-major
// block of scores. yt is a transposed (hs, kQB) block, 64-byte aligned; st too.
template <int MK>
inline void scores_tile(const float* x, int64_t ldx, const float* yt, int hs, float* st) {
    __m512 acc[MK];
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) acc[i] = _mm512_setzero_ps();
    for (int e = 0; e < hs; ++e) {
        const __m512 y = _mm512_load_ps(yt + e * kQB);
#pragma GCC unroll 16
        for (int i = 0; i < MK; ++i) {
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + e]), y, acc[i]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) _mm512_store_ps(st + i * kQB, acc[i]);
}

void scores(const float* x, int64_t ldx, const float* yt, int hs, int nk, float* st) {
    tiles<12>(nk, [&](auto mk, int k) {
        scores_tile<decltype(mk)::value>(x + k * ldx, ldx, yt, hs, st + k * kQB);
    });
}

// o[r * ldo + e] = sum_{k < nk} p[k * kQB + r] * v[k * ldv + e] for rows r in [r0, r0 + 4) and
// columns [e0, e0 + 16 NV) (pointers already offset by r0 and e0): overwritten.
template <int NV>
inline void weighted_tile(const float* p, const float* v, int64_t ldv, int nk, float* o, int ldo) {
    __m512 acc[4][NV];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
    }
    for (int k = 0; k < nk; ++k) {
        __m512 vv[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) vv[j] = _mm512_loadu_ps(v + k * ldv + 16 * j);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const __m512 pb = _mm512_set1_ps(p[k * kQB + i]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(pb, vv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) _mm512_store_ps(o + i * ldo + 16 * j, acc[i][j]);
    }
}

// o (kQB, hs) = p^T v over keys: row r uses keys [0, min(nk, t0 + r + 1)) only, the causal
// limit, since its later probabilities are 0. o is 64-byte aligned with row stride hs.
void weighted(const float* p, const float* v, int64_t ldv, int hs, int nk, int t0, float* o) {
    for (int r0 = 0; r0 < kQB; r0 += 4) {
        const int nkr = min_i(nk, t0 + r0 + 4);
        col_tiles(hs, [&](auto nv, int e) {
            weighted_tile<decltype(nv)::value>(p + r0, v + e, ldv, nkr, o + r0 * hs + e, hs);
        });
    }
}

// acc[k * ldacc + e] += sum_{r < nr} g[k * kQB + r] * y[r * ldy + e] for keys k in
// [k0, k0 + MK) and columns [e0, e0 + 16 NV) (pointers offset by k0 and e0; y by e0 only).
template <int MK, int NV>
inline void keyside_tile(const float* g, const float* y, int64_t ldy, int r_begin, int nr,
                         float* acc_out, int ldacc) {
    __m512 acc[MK][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_load_ps(acc_out + i * ldacc + 16 * j);
    }
    for (int r = r_begin; r < nr; ++r) {
        __m512 yv[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) yv[j] = _mm512_loadu_ps(y + r * ldy + 16 * j);
#pragma GCC unroll 8
        for (int i = 0; i < MK; ++i) {
            const __m512 gb = _mm512_set1_ps(g[i * kQB + r]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(gb, yv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) _mm512_store_ps(acc_out + i * ldacc + 16 * j, acc[i][j]);
    }
}

// acc (keys, hs) += g^T y for keys [0, nk) and query rows [0, nr) of the block at t0: key k
// takes rows r >= k - t0 only, the others' g being 0 (causal mask).
void keyside(const float* g, const float* y, int64_t ldy, int hs, int nk, int nr, int t0,
             float* acc) {
    tiles<6>(nk, [&](auto mk, int k) {
        constexpr int MK  = decltype(mk)::value;
        const int r_begin = max_i(0, k - t0);
        int e             = 0;
        for (; e + 64 <= hs; e += 64) {
            keyside_tile<MK, 4>(g + k * kQB, y + e, ldy, r_begin, nr, acc + k * hs + e, hs);
        }
        for (; e < hs; e += 16) {
            keyside_tile<MK, 1>(g + k * kQB, y + e, ldy, r_begin, nr, acc + k * hs + e, hs);
        }
    });
}

// yt[e * kQB + r] = s * y[r * ldy + e] for r < nr, 0 for the padding rows r in [nr, kQB).
void transpose_block(float* yt, const float* y, int64_t ldy, int nr, int hs, float s) {
    for (int e = 0; e < hs; ++e) {
        for (int r = 0; r < kQB; ++r) yt[e * kQB + r] = r < nr ? y[r * ldy + e] * s : 0.f;
    }
}

// Float dot product of hs (a multiple of 8) terms: avx2's, 8 lanes, then lanes pairwise.
inline float dot(const float* a, const float* b, int hs) {
    __m256 acc = _mm256_setzero_ps();
    for (int e = 0; e < hs; e += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// scratch rounded up to 64 bytes (the caller gives 16 floats of slack).
float* align64(float* p) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    return p + ((64 - addr % 64) % 64) / sizeof(float);
}

// Lanes 0-7 and 8-15 of p, widened to double.
inline __m512d low_pd(__m512 p) {
    return _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, p, 0));
}
inline __m512d high_pd(__m512 p) {
    return _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, p, 1));
}

}  // namespace

size_t attention_forward_scratch(int T, int hs) {
    return size_t(2 * hs * kQB) + size_t(T) * kQB + 16;
}

void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch) {
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
        scores(kbase, C3, qt, hs, t1, s);
        // Causal mask: key k > query t0 + r.
        for (int k = t0 + 1; k < t1; ++k) {
            for (int r = 0; r < k - t0; ++r) s[k * kQB + r] = -__builtin_inff();
        }
        // Row max, then exponentials and their sums in double, keys in order.
        __m512 m = _mm512_set1_ps(-__builtin_inff());
        for (int k = 0; k < t1; ++k) m = _mm512_maskz_max_ps(kAll, m, _mm512_load_ps(s + k * kQB));
        __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
        for (int k = 0; k < t1; ++k) {
            const __m512 p = exp_ps(_mm512_sub_ps(_mm512_load_ps(s + k * kQB), m));
            _mm512_store_ps(s + k * kQB, p);
            sum_lo = _mm512_add_pd(sum_lo, low_pd(p));
            sum_hi = _mm512_add_pd(sum_hi, high_pd(p));
        }
        alignas(64) float mx[kQB];
        alignas(64) double sums[kQB];
        _mm512_store_ps(mx, m);
        _mm512_store_pd(sums, sum_lo);
        _mm512_store_pd(sums + 8, sum_hi);
        // out_t = sum_k p_tk v_k / sum_t.
        weighted(s, vbase, C3, hs, t1, t0, o);
        for (int r = 0; r < nr; ++r) {
            float* dst       = out + (b * T + t0 + r) * C + h * hs;
            const __m512 inv = _mm512_set1_ps(float(1.0 / sums[r]));
            for (int e = 0; e < hs; e += 16) {
                _mm512_storeu_ps(dst + e, _mm512_mul_ps(_mm512_load_ps(o + r * hs + e), inv));
            }
            lse[bh * T + t0 + r] = float(double(mx[r]) + __builtin_log(sums[r]));
        }
    }
}

size_t attention_backward_scratch(int T, int hs) {
    return 3 * size_t(hs) * kQB + 2 * size_t(T) * kQB + 2 * size_t(T) * hs + 16;
}

void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch) {
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
            scores(kbase, C3, qt, hs, t1, p);
            scores(vbase, C3, dyt, hs, t1, ds);
            // p = exp(s - lse), ds = p (dP - D) * scale.
            const __m512 lv = _mm512_load_ps(l), Dv = _mm512_load_ps(D);
            const __m512 sc = _mm512_set1_ps(scale);
            for (int k = 0; k < t1; ++k) {
                float* pk      = p + k * kQB;
                float* dsk     = ds + k * kQB;
                const __m512 e = exp_ps(_mm512_sub_ps(_mm512_load_ps(pk), lv));
                _mm512_store_ps(pk, e);
                _mm512_store_ps(
                    dsk,
                    _mm512_mul_ps(_mm512_mul_ps(e, _mm512_sub_ps(_mm512_load_ps(dsk), Dv)), sc));
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

}  // namespace bagualu::kernels::avx512

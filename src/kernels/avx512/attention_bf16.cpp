// Causal attention on bf16 operands (kernels/ops_avx512.h, attention_*_items_bf16): the
// attention core of a run whose attention products are in bf16 (kernels/mixed.h,
// attention_forward_half). Its six products take bf16 operands and sum in float, on AMX tiles
// (tdpbf16ps) or with AVX512_BF16 dot products (vdpbf16ps), the same layouts for both:
//   forward   S = (scale Q) K^T,  O = P V
//   backward  dP = dO V^T, dQ = dS K, dK = dS^T Q, dV = P^T dO
// with Q, K, V and dO rounded to bf16 (round to nearest even, denormals to zero: bf16x16 below),
// and the probabilities P and the scores' gradient dS rounded to bf16 where they are operands.
// The softmax stays as in the float kernels: the row max and the exponentials in float (the
// exp_ps of kernels/avx512/exp.h), their sums in double, the output divided by the sum of the
// unrounded exponentials, lse = max + log(sum); the backward recomputes P from S and lse in
// float, and D = dO . O is a float dot product.
// One item is one (batch, head): its K and V are rounded and laid out for the products once, then
// its queries are taken 32 rows at a time (two A tiles; 32 is also the depth of one tile step,
// which the key-side products dK and dV sum over). A block at t0 computes scores against keys
// [0, t0 + 32) only: the causal limit rounded up to the tile. The backward's dK and dV are summed
// over the query blocks in order in per-item scratch, so every output element is one fixed chain
// of steps whichever thread runs its item: bitwise the same for any thread count (the two
// product kinds sum in different orders, so they differ from each other).
// Layouts (bf16 unless said, strides in elements):
//   rows      x (r, c) at r * ld + c: the A operand of a product summing over c;
//   row pairs (r / 2, 2c + r % 2): the B operand of a product summing over r (tdpbf16ps' B
//             layout), two rows interleaved 16 bits at a time;
//   col pairs the row pairs of x^T, i.e. (c / 2, 2r + c % 2): B of a product summing over c,
//             a 16 x 16 transpose of 32-bit pairs.
// Built with this folder's AVX-512 flags (AVX512_BF16 included); the tile instructions by
// function attribute. The all-ones masked (maskz) forms are the plain instructions (GCC 12
// warns about the plain intrinsics' undefined pass-through operand).
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/avx512/exp.h"
#include "kernels/avx512/tile_config.h"
#include "kernels/avx512/transpose.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

constexpr int kRows = 32;  // query rows per block; tile step depth (32 bf16)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Floats to bf16 by vcvtneps2bf16 (AVX512_BF16, which every AMX CPU has): round to nearest
// even, one instruction for 16 or 32 values. Unlike bf16_from_float it flushes denormals to
// zero, below 1.2e-38: operands and probabilities that small add nothing to these sums anyway.
inline __m256i bf16x16(__m512 x) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)); }
inline __m512i bf16x32(const float* p) {
    return reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
}

// 32 values that are bf16 already: their bits as they are. Q, K, V and O kept in 16 bits
// (attention_*_items_bf16 on 16-bit arrays) hold bf16_narrow_range's bits, which keep the
// denormals that bf16x32 flushes: the products treat denormal operands as zero (tdpbf16ps and
// vdpbf16ps alike), so their sums are the same.
inline __m512i bf16x32(const bf16* p) { return _mm512_loadu_si512(p); }

// 16 values as floats: loaded, or bf16 widened (exactly).
inline __m512 f32x16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 f32x16(const bf16* p) {
    const __m512i w = _mm512_maskz_cvtepu16_epi32(
        __mmask16(0xffff), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), w, 16));
}

// dst[0, n) = src[0, n), n a multiple of 16.
inline void copy_row(float* dst, const float* src, int n) {
    for (int e = 0; e < n; e += 16) _mm512_storeu_ps(dst + e, _mm512_loadu_ps(src + e));
}

// dst (rows_pad x cols, stride ldd) = bf16(s * src) for the first `rows` rows of src (stride
// lds), zero below; cols a multiple of 16.
template <typename S>
void to_rows(const S* src, int64_t lds, int rows, int rows_pad, int cols, float s, bf16* dst,
             int64_t ldd) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int r = 0; r < rows_pad; ++r) {
        bf16* d = dst + r * ldd;
        if (r >= rows) {
            std::memset(d, 0, size_t(cols) * sizeof(bf16));
            continue;
        }
        const S* x = src + r * lds;
        for (int c = 0; c < cols; c += 16) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c),
                                bf16x16(_mm512_mul_ps(f32x16(x + c), vs)));
        }
    }
}

// Row pairs of src's first `rows` rows (zero past them) up to rows_pad (even): dst
// (rows_pad / 2 x 2 cols, stride ldd); cols a multiple of 32.
template <typename S>
void row_pairs(const S* src, int64_t lds, int rows, int rows_pad, int cols, bf16* dst,
               int64_t ldd) {
    const __m512i lo_idx = _mm512_load_si512(kInterleave.idx[0]);
    const __m512i hi_idx = _mm512_load_si512(kInterleave.idx[1]);
    for (int i = 0; i < rows_pad / 2; ++i) {
        bf16* d = dst + i * ldd;
        for (int c = 0; c < cols; c += 32) {
            const __m512i x =
                2 * i < rows ? bf16x32(src + 2 * i * lds + c) : _mm512_setzero_si512();
            const __m512i y =
                2 * i + 1 < rows ? bf16x32(src + (2 * i + 1) * lds + c) : _mm512_setzero_si512();
            _mm512_storeu_si512(d + 2 * c, _mm512_permutex2var_epi16(x, lo_idx, y));
            _mm512_storeu_si512(d + 2 * c + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
        }
    }
}

// Column pairs of src's first `rows` rows (zero past them) up to rows_pad (a multiple of 16):
// dst (cols / 2 x 2 rows_pad, stride ldd); cols a multiple of 32.
template <typename S>
void col_pairs(const S* src, int64_t lds, int rows, int rows_pad, int cols, bf16* dst,
               int64_t ldd) {
    for (int n0 = 0; n0 < rows_pad; n0 += 16) {
        for (int c = 0; c < cols; c += 32) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) {
                r[i] = n0 + i < rows ? bf16x32(src + (n0 + i) * lds + c) : _mm512_setzero_si512();
            }
            transpose16_epi32(r);  // r[i]: the pair (c + 2i, c + 2i + 1) of rows n0 .. n0 + 15
            for (int i = 0; i < 16; ++i)
                _mm512_storeu_si512(dst + (c / 2 + i) * ldd + 2 * n0, r[i]);
        }
    }
}

// dst (cols x kRows, stride kRows) = bf16(src^T) for src (kRows x cols, stride lds), cols a
// multiple of 16: the A operand of a product summing over src's rows.
void rows_transposed(const float* src, int64_t lds, int cols, bf16* dst) {
    for (int k0 = 0; k0 < cols; k0 += 16) {
        for (int h = 0; h < kRows / 16; ++h) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) {
                r[i] = _mm512_castps_si512(_mm512_loadu_ps(src + (16 * h + i) * lds + k0));
            }
            transpose16_epi32(r);  // r[j]: column k0 + j of rows 16h .. 16h + 15
            for (int j = 0; j < 16; ++j) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (k0 + j) * kRows + 16 * h),
                                    bf16x16(_mm512_castsi512_ps(r[j])));
            }
        }
    }
}

__attribute__((target("amx-tile"))) void enter_tiles() {
    static const TileConfig cfg = tiles_16x64();
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void leave_tiles() { _tile_release(); }

// c (m x n floats, stride ldc) = a b, or += a b when accumulate: a (m x k rows, stride lda), b
// (k / 2 x 2n row pairs, stride ldb); m, n and k multiples of 32. 32 x 32 blocks of c in tiles
// 0-3, a in 4-5, b in 6-7; each element sums its k steps in increasing k.
__attribute__((target("amx-tile,amx-bf16"))) void tile_product(const bf16* a, int64_t lda,
                                                               const bf16* b, int64_t ldb, float* c,
                                                               int64_t ldc, int m, int n, int k,
                                                               bool accumulate) {
    const size_t sa = size_t(lda) * 2, sb = size_t(ldb) * 2, sc = size_t(ldc) * 4;
    for (int i = 0; i < m; i += 32) {
        for (int j = 0; j < n; j += 32) {
            float* cb = c + i * ldc + j;
            if (accumulate) {
                load_c_tiles(cb, sc);
            } else {
                zero_c_tiles();
            }
            for (int p = 0; p < k; p += 32) {
                const bf16* ap = a + i * lda + p;
                const bf16* bp = b + (p / 2) * ldb + 2 * j;
                tile_step(ap, ap + 16 * lda, sa, bp, bp + 32, sb);
            }
            store_c_tiles(cb, sc);
        }
    }
}

// tile_product's c with vdpbf16ps (AVX512_BF16) instead of tiles: 8 rows x 32 columns of c in
// 16 registers, one pair of k values of a row broadcast against a row of b's pairs at a time;
// each element sums its k pairs in increasing k.
void dot_product(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float* c, int64_t ldc,
                 int m, int n, int k, bool accumulate) {
    for (int i = 0; i < m; i += 8) {
        for (int j = 0; j < n; j += 32) {
            __m512 c0[8], c1[8];
            for (int r = 0; r < 8; ++r) {
                float* cr = c + (i + r) * ldc + j;
                c0[r]     = accumulate ? _mm512_loadu_ps(cr) : _mm512_setzero_ps();
                c1[r]     = accumulate ? _mm512_loadu_ps(cr + 16) : _mm512_setzero_ps();
            }
            for (int p = 0; p < k / 2; ++p) {
                const bf16* bp    = b + p * ldb + 2 * j;
                const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(bp));
                const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(bp + 32));
                for (int r = 0; r < 8; ++r) {
                    int32_t pair;
                    std::memcpy(&pair, a + (i + r) * lda + 2 * p, sizeof pair);
                    const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
                    c0[r]             = _mm512_dpbf16_ps(c0[r], av, b0);
                    c1[r]             = _mm512_dpbf16_ps(c1[r], av, b1);
                }
            }
            for (int r = 0; r < 8; ++r) {
                float* cr = c + (i + r) * ldc + j;
                _mm512_storeu_ps(cr, c0[r]);
                _mm512_storeu_ps(cr + 16, c1[r]);
            }
        }
    }
}

// The two ways to run the products: AMX tiles, or AVX512_BF16 dot products.
struct Tiles {
    static void enter() { enter_tiles(); }
    static void leave() { leave_tiles(); }
    static void product(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float* c,
                        int64_t ldc, int m, int n, int k, bool accumulate) {
        tile_product(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
    }
};
struct Dots {
    static void enter() {}
    static void leave() {}
    static void product(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float* c,
                        int64_t ldc, int m, int n, int k, bool accumulate) {
        dot_product(a, lda, b, ldb, c, ldc, m, n, k, accumulate);
    }
};

// Lanes [k, k + 16) below nk.
inline __mmask16 below(int k, int nk) {
    const int w = nk - k;
    return w >= 16 ? __mmask16(0xffff) : w <= 0 ? __mmask16(0) : __mmask16((1u << w) - 1);
}

// Lane reductions in lane order, through memory (GCC 12's _mm512_reduce_* use plain
// intrinsics with an undefined operand).
template <typename T, typename V>
inline T lane_max(V v) {
    alignas(64) T t[sizeof(V) / sizeof(T)];
    std::memcpy(t, &v, sizeof v);
    T m = t[0];
    for (const T x : t) m = x > m ? x : m;
    return m;
}
template <typename T, typename V>
inline T lane_sum(V v) {
    alignas(64) T t[sizeof(V) / sizeof(T)];
    std::memcpy(t, &v, sizeof v);
    T s = 0;
    for (const T x : t) s += x;
    return s;
}

// Float dot product of hs (a multiple of 16) terms, b as floats or widened from bf16.
template <typename S>
inline float dot16(const float* a, const S* b, int hs) {
    __m512 acc = _mm512_setzero_ps();
    for (int e = 0; e < hs; e += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + e), f32x16(b + e), acc);
    }
    return lane_sum<float>(acc);
}

// Bump allocation of 64-byte aligned arrays from a scratch at `at`; `bytes` is what the arrays
// take wherever the scratch starts (each may lose up to 63 bytes to its alignment). Carving from
// 0 sizes a scratch: one list of arrays gives both its size and its layout.
struct Carve {
    uintptr_t at;
    size_t bytes = 0;
    template <typename T>
    T* take(size_t n) {
        at     = (at + 63) / 64 * 64;
        T* out = reinterpret_cast<T*>(at);
        at += n * sizeof(T);
        bytes += n * sizeof(T) + 63;
        return out;
    }
    size_t floats() const { return (bytes + sizeof(float) - 1) / sizeof(float); }
};

// A forward item's arrays (Tp: T rounded up to kRows).
struct ForwardScratch {
    bf16* kt;  // col pairs of K: (hs / 2, 2 Tp)
    bf16* vv;  // row pairs of V: (Tp / 2, 2 hs)
    bf16* qa;  // the block's scale Q: (32, hs)
    float* s;  // its scores: (32, Tp)
    bf16* p;   // its probabilities: (32, Tp)
    float* o;  // P V: (32, hs)
    ForwardScratch(Carve& cv, size_t Tp, size_t hs)
        : kt(cv.take<bf16>(hs * Tp)),
          vv(cv.take<bf16>(hs * Tp)),
          qa(cv.take<bf16>(kRows * hs)),
          s(cv.take<float>(kRows * Tp)),
          p(cv.take<bf16>(kRows * Tp)),
          o(cv.take<float>(kRows * hs)) {}
};

// A backward item's arrays.
struct BackwardScratch {
    bf16* kt;    // col pairs of K: (hs / 2, 2 Tp)
    bf16* vt;    // col pairs of V
    bf16* kv;    // row pairs of K: (Tp / 2, 2 hs)
    bf16* qa;    // the block's scale Q: (32, hs)
    bf16* doa;   // its dO: (32, hs)
    bf16* qv;    // row pairs of its Q: (16, 2 hs)
    bf16* dov;   // row pairs of its dO
    float* s;    // S, then P: (32, Tp)
    float* dp;   // dP, then dS
    bf16* ds16;  // dS: (32, Tp)
    bf16* pt;    // P^T: (nkp, 32)
    bf16* dsT;   // dS^T
    float* dq;   // (32, hs)
    float* dk;   // (Tp, hs)
    float* dv;   // (Tp, hs)
    BackwardScratch(Carve& cv, size_t Tp, size_t hs)
        : kt(cv.take<bf16>(hs * Tp)),
          vt(cv.take<bf16>(hs * Tp)),
          kv(cv.take<bf16>(hs * Tp)),
          qa(cv.take<bf16>(kRows * hs)),
          doa(cv.take<bf16>(kRows * hs)),
          qv(cv.take<bf16>(kRows * hs)),
          dov(cv.take<bf16>(kRows * hs)),
          s(cv.take<float>(kRows * Tp)),
          dp(cv.take<float>(kRows * Tp)),
          ds16(cv.take<bf16>(kRows * Tp)),
          pt(cv.take<bf16>(kRows * Tp)),
          dsT(cv.take<bf16>(kRows * Tp)),
          dq(cv.take<float>(kRows * hs)),
          dk(cv.take<float>(Tp * hs)),
          dv(cv.take<float>(Tp * hs)) {}
};

// Floats of scratch an item with arrays Scratch needs.
template <typename Scratch>
size_t scratch_floats(int T, int hs) {
    Carve cv{0};
    (void)Scratch(cv, size_t(round_up(T, kRows)), size_t(hs));
    return cv.floats();
}

// A row of the output: as floats, or as their bf16 bits (bitwise bf16_narrow_range of them).
inline void put_out(float* dst, const float* src, int n) { copy_row(dst, src, n); }
inline void put_out(bf16* dst, const float* src, int n) { bf16_narrow_range(dst, src, size_t(n)); }

// In: float, or bf16 (qkv kept in 16 bits); Out: the output's type, float or bf16.
template <typename P, typename In, typename Out>
void forward_items(Out* out, float* lse, const In* qkv, int T, int C, int NH, int64_t begin,
                   int64_t end, float* scratch) {
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const int Tp      = int(round_up(T, kRows));
    const float scale = 1.f / std::sqrt(float(hs));
    Carve cv{reinterpret_cast<uintptr_t>(scratch)};
    const auto [kt, vv, qa, s, p, o] = ForwardScratch(cv, size_t(Tp), size_t(hs));
    P::enter();
    for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        const In* qbase = qkv + b * T * C3 + h * hs;
        const In* kbase = qbase + C;
        const In* vbase = qbase + 2 * C;
        col_pairs(kbase, C3, T, Tp, hs, kt, 2 * int64_t{Tp});
        row_pairs(vbase, C3, T, Tp, hs, vv, 2 * int64_t{hs});
        for (int t0 = 0; t0 < T; t0 += kRows) {
            const int nr  = T - t0 < kRows ? T - t0 : kRows;
            const int nkp = t0 + kRows;  // keys of the block's scores, <= Tp
            to_rows(qbase + t0 * C3, C3, nr, kRows, hs, scale, qa, hs);
            P::product(qa, hs, kt, 2 * int64_t{Tp}, s, Tp, kRows, nkp, hs, false);
            alignas(64) double sums[kRows];
            alignas(64) float mx[kRows];
            for (int r = 0; r < kRows; ++r) {
                bf16* pr = p + int64_t{r} * Tp;
                if (r >= nr) {
                    std::memset(pr, 0, size_t(nkp) * sizeof(bf16));
                    continue;
                }
                const float* sr = s + int64_t{r} * Tp;
                const int nk    = t0 + r + 1;  // causal: keys [0, nk)
                __m512 m        = _mm512_set1_ps(-__builtin_inff());
                for (int k = 0; k < nk; k += 16) {
                    m = _mm512_maskz_max_ps(kAll, m,
                                            _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()),
                                                                 below(k, nk), sr + k));
                }
                const float mr  = lane_max<float>(m);
                const __m512 vm = _mm512_set1_ps(mr);
                __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
                for (int k = 0; k < nkp; k += 16) {
                    const __m512 e = _mm512_maskz_mov_ps(
                        below(k, nk), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + k), vm)));
                    lo = _mm512_add_pd(
                        lo, _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, e, 0)));
                    hi = _mm512_add_pd(
                        hi, _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, e, 1)));
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + k), bf16x16(e));
                }
                sums[r] = lane_sum<double>(_mm512_add_pd(lo, hi));
                mx[r]   = mr;
            }
            P::product(p, Tp, vv, 2 * int64_t{hs}, o, hs, kRows, hs, nkp, false);
            for (int r = 0; r < nr; ++r) {
                float* orow    = o + r * hs;
                const __m512 v = _mm512_set1_ps(float(1.0 / sums[r]));
                for (int e = 0; e < hs; e += 16) {
                    _mm512_storeu_ps(orow + e, _mm512_mul_ps(_mm512_loadu_ps(orow + e), v));
                }
                put_out(out + (b * T + t0 + r) * C + h * hs, orow, hs);
                lse[bh * T + t0 + r] = float(double(mx[r]) + std::log(sums[r]));
            }
        }
    }
    P::leave();
}

// A row of dq, dk or dv into dqkv: as floats, or (dqkv16) as their bf16 bits.
inline void put_row(float* dqkv, uint16_t* dqkv16, int64_t at, const float* src, int n) {
    if (dqkv16) {
        bf16_narrow_range(dqkv16 + at, src, size_t(n));
    } else {
        copy_row(dqkv + at, src, n);
    }
}

// In: the type of qkv and out, float or bf16 (kept in 16 bits).
template <typename P, typename In>
void backward_items(float* dqkv, uint16_t* dqkv16, const float* dout, const In* qkv, const In* out,
                    const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                    float* scratch) {
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const int Tp      = int(round_up(T, kRows));
    const float scale = 1.f / std::sqrt(float(hs));
    const int64_t ldk = 2 * int64_t{Tp}, ldv = 2 * int64_t{hs};
    Carve cv{reinterpret_cast<uintptr_t>(scratch)};
    const auto [kt, vt, kv, qa, doa, qv, dov, s, dp, ds16, pt, dsT, dq, dk, dv] =
        BackwardScratch(cv, size_t(Tp), size_t(hs));
    const __m512 vsc = _mm512_set1_ps(scale);
    P::enter();
    for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / NH, h = bh % NH;
        const In* qbase     = qkv + b * T * C3 + h * hs;
        const In* kbase     = qbase + C;
        const In* vbase     = qbase + 2 * C;
        const int64_t dq0   = b * T * C3 + h * hs;  // dq's first row in dqkv
        const float* dybase = dout + b * T * C + h * hs;
        const In* ybase     = out + b * T * C + h * hs;
        col_pairs(kbase, C3, T, Tp, hs, kt, ldk);
        col_pairs(vbase, C3, T, Tp, hs, vt, ldk);
        row_pairs(kbase, C3, T, Tp, hs, kv, ldv);
        std::memset(dk, 0, size_t(Tp) * hs * sizeof(float));
        std::memset(dv, 0, size_t(Tp) * hs * sizeof(float));
        for (int t0 = 0; t0 < T; t0 += kRows) {
            const int nr  = T - t0 < kRows ? T - t0 : kRows;
            const int nkp = t0 + kRows;
            to_rows(qbase + t0 * C3, C3, nr, kRows, hs, scale, qa, hs);
            to_rows(dybase + int64_t{t0} * C, C, nr, kRows, hs, 1.f, doa, hs);
            row_pairs(qbase + t0 * C3, C3, nr, kRows, hs, qv, ldv);
            row_pairs(dybase + int64_t{t0} * C, C, nr, kRows, hs, dov, ldv);
            // The forward's scores, bit for bit; dP = dO V^T.
            P::product(qa, hs, kt, ldk, s, Tp, kRows, nkp, hs, false);
            P::product(doa, hs, vt, ldk, dp, Tp, kRows, nkp, hs, false);
            // P = exp(S - lse), dS = P (dP - D) scale; 0 past the causal limit and on padding rows.
            for (int r = 0; r < kRows; ++r) {
                float* sr  = s + int64_t{r} * Tp;
                float* dpr = dp + int64_t{r} * Tp;
                if (r >= nr) {
                    std::memset(sr, 0, size_t(nkp) * sizeof(float));
                    std::memset(dpr, 0, size_t(nkp) * sizeof(float));
                    continue;
                }
                const int t    = t0 + r;
                const int nk   = t + 1;
                const __m512 l = _mm512_set1_ps(lse[bh * T + t]);
                const __m512 D =
                    _mm512_set1_ps(dot16(dybase + int64_t{t} * C, ybase + int64_t{t} * C, hs));
                for (int k = 0; k < nkp; k += 16) {
                    const __mmask16 in = below(k, nk);
                    const __m512 pe =
                        _mm512_maskz_mov_ps(in, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + k), l)));
                    const __m512 ds = _mm512_mul_ps(
                        _mm512_mul_ps(pe, _mm512_sub_ps(_mm512_loadu_ps(dpr + k), D)), vsc);
                    _mm512_storeu_ps(sr + k, pe);
                    _mm512_storeu_ps(dpr + k, _mm512_maskz_mov_ps(in, ds));
                }
            }
            // dQ = dS K for the block's rows.
            to_rows(dp, Tp, kRows, kRows, nkp, 1.f, ds16, Tp);
            P::product(ds16, Tp, kv, ldv, dq, hs, kRows, hs, nkp, false);
            for (int r = 0; r < nr; ++r)
                put_row(dqkv, dqkv16, dq0 + (t0 + r) * C3, dq + r * hs, hs);
            // dK += dS^T Q, dV += P^T dO over the block's 32 rows (one tile step).
            rows_transposed(dp, Tp, nkp, dsT);
            rows_transposed(s, Tp, nkp, pt);
            P::product(dsT, kRows, qv, ldv, dk, hs, nkp, hs, kRows, true);
            P::product(pt, kRows, dov, ldv, dv, hs, nkp, hs, kRows, true);
        }
        for (int t = 0; t < T; ++t) {
            put_row(dqkv, dqkv16, dq0 + t * C3 + C, dk + int64_t{t} * hs, hs);
            put_row(dqkv, dqkv16, dq0 + t * C3 + 2 * C, dv + int64_t{t} * hs, hs);
        }
    }
    P::leave();
}

}  // namespace

size_t attention_bf16_forward_scratch(int T, int hs) {
    return scratch_floats<ForwardScratch>(T, hs);
}
size_t attention_bf16_backward_scratch(int T, int hs) {
    return scratch_floats<BackwardScratch>(T, hs);
}

void attention_forward_items_bf16(bool tiles, float* out, float* lse, const float* qkv, int T,
                                  int C, int NH, int64_t begin, int64_t end, float* scratch) {
    if (tiles) {
        forward_items<Tiles>(out, lse, qkv, T, C, NH, begin, end, scratch);
    } else {
        forward_items<Dots>(out, lse, qkv, T, C, NH, begin, end, scratch);
    }
}

void attention_forward_items_bf16(bool tiles, uint16_t* out16, float* lse, const uint16_t* qkv16,
                                  int T, int C, int NH, int64_t begin, int64_t end,
                                  float* scratch) {
    if (tiles) {
        forward_items<Tiles>(out16, lse, qkv16, T, C, NH, begin, end, scratch);
    } else {
        forward_items<Dots>(out16, lse, qkv16, T, C, NH, begin, end, scratch);
    }
}

void attention_backward_items_bf16(bool tiles, float* dqkv, uint16_t* dqkv16, const float* dout,
                                   const float* qkv, const float* out, const float* lse, int T,
                                   int C, int NH, int64_t begin, int64_t end, float* scratch) {
    if (tiles) {
        backward_items<Tiles>(dqkv, dqkv16, dout, qkv, out, lse, T, C, NH, begin, end, scratch);
    } else {
        backward_items<Dots>(dqkv, dqkv16, dout, qkv, out, lse, T, C, NH, begin, end, scratch);
    }
}

void attention_backward_items_bf16(bool tiles, uint16_t* dqkv16, const float* dout,
                                   const uint16_t* qkv16, const uint16_t* out16, const float* lse,
                                   int T, int C, int NH, int64_t begin, int64_t end,
                                   float* scratch) {
    if (tiles) {
        backward_items<Tiles>(nullptr, dqkv16, dout, qkv16, out16, lse, T, C, NH, begin, end,
                              scratch);
    } else {
        backward_items<Dots>(nullptr, dqkv16, dout, qkv16, out16, lse, T, C, NH, begin, end,
                             scratch);
    }
}

}  // namespace bagualu::kernels::avx512

// AVX-512 packing of bf16 operands into the (k, k + 1) pair panels of the AVX512_BF16 kernel:
// the layout of pack_panels<R, 2, bf16, bf16> (kernels/gemm/pack.h), panels (kcp / 2, R, 2),
// zero-padded, written with vector loads and stores instead of one element at a time.
//   k contiguous (A in NN, B in NT): a pair is one 32-bit word of a row, so packing is a
//     transpose of 32-bit words, 8 x 8 in registers;
//   r contiguous (B in NN, A in TN): the panel's rows of k and k + 1 are interleaved 16 bits at
//     a time (vpermt2w), up to 32 rows per instruction.
// A float source (B of the products whose float operands hold bf16 values, kernels/mixed.h) is
// rounded to bf16 as it is loaded: the panels of its narrowed copy. Against narrowing first,
// weights from memory (`bench kernels`, float_b), it was faster with k contiguous and slower with
// r contiguous on the Zen 5 of docs/results.md (measured before the r-contiguous rows were read
// whole, pack_pairs_rows), so the AVX512_BF16 kernel uses it for B stored by k only; the AMX
// kernel for both (KernelSpec::pack_b_f32_rows).
// Internal linkage, like pack.h: included by the avx512 kernels only (needs AVX512BW and VL).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/avx512/bf16_round.h"
#include "kernels/avx512/transpose.h"
#include "kernels/gemm/avx2/pack.h"
#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm::avx512 {
namespace {

// Longest k block the transposing path accepts: rows past the panel's end read a zero row.
constexpr int kMaxPairK                               = 1024;
alignas(64) const bf16 kZeroPairRow[kMaxPairK + 32]   = {};
alignas(64) const float kZeroFloatRow[kMaxPairK + 32] = {};

// Floats rounded to bf16 (bf16_from_float): these packers serve only the kernels of a CPU with
// AVX512_BF16, so by its conversion instructions, one for 16 or 32 values; a vector holding a
// denormal, which they take for zero, in integer arithmetic instead (bf16_of). Against the
// integer arithmetic alone: docs/results.md.
inline __m256i bf16_of16(__m512 x) {
    if (__builtin_expect(kernels::avx512::denormals(x) != 0, 0)) return kernels::avx512::bf16_of(x);
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
}
inline __m512i bf16_of32(__m512 lo, __m512 hi) {
    if (__builtin_expect((kernels::avx512::denormals(lo) | kernels::avx512::denormals(hi)) != 0,
                         0)) {
        const __m512i low = _mm512_maskz_inserti64x4(__mmask8(0xff), _mm512_setzero_si512(),
                                                     kernels::avx512::bf16_of(lo), 0);
        return _mm512_maskz_inserti64x4(__mmask8(0xff), low, kernels::avx512::bf16_of(hi), 1);
    }
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// Eight (k, k + 1) pairs of a row from 16 values at p: of bf16 as they are, of float rounded
// to bf16 on the way.
inline __m256 pairs8(const bf16* p) {
    return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m256 pairs8(const float* p) { return _mm256_castsi256_ps(bf16_of16(_mm512_loadu_ps(p))); }
// 32 consecutive values of a row, the lanes of `in` only (the rest zero), as bf16.
inline __m512i row32(const bf16* p, __mmask32 in) { return _mm512_maskz_loadu_epi16(in, p); }
inline __m512i row32(const float* p, __mmask32 in) {
    return bf16_of32(_mm512_maskz_loadu_ps(__mmask16(in), p),
                     _mm512_maskz_loadu_ps(__mmask16(in >> 16), p + 16));
}
inline bf16 bf16_value(bf16 x) { return x; }
inline bf16 bf16_value(float x) { return bf16_from_float(x); }
template <typename T>
const T* zero_row() {
    if constexpr (std::is_same_v<T, float>) {
        return kZeroFloatRow;
    } else {
        return kZeroPairRow;
    }
}

// The pair panels of a source stored by rows of k (r contiguous): for each pair of rows (k,
// k + 1), their values of every panel, interleaved 16 bits at a time (vpermt2w), up to 32 rows
// of a panel per instruction. Each row is read from start to end, panel after panel, in
// increasing k: a panel at a time, each row's 128 bytes of a float source lay ldb apart from the
// next row's, a stride the hardware prefetcher does not follow across pages, and the packing of
// the weights stored by row waited on memory (bench-medium's bf16 step, docs/results.md).
template <int R, typename T>
void pack_pairs_rows(PackSrc src, int r0, int rn, int p0, int kc, bf16* dst) {
    const int npairs       = (kc + 1) / 2;
    const __m512i lo_idx   = _mm512_load_si512(kernels::avx512::kInterleave.idx[0]);
    const __m512i hi_idx   = _mm512_load_si512(kernels::avx512::kInterleave.idx[1]);
    constexpr int lo_elems = 2 * std::min(R, 16);
    constexpr int hi_elems = 2 * (R > 16 ? R - 16 : 0);
    for (int g = 0; g < npairs; ++g) {
        const T* ra = src.row<T>(p0 + 2 * g) + r0;
        const T* rb = 2 * g + 1 < kc ? src.row<T>(p0 + 2 * g + 1) + r0 : nullptr;
        for (int p = 0; p < rn; p += R) {
            const int rows     = std::min(R, rn - p);
            const __mmask32 in = rows >= 32 ? ~__mmask32{0} : (__mmask32{1} << rows) - 1;
            const __m512i a    = row32(ra + p, in);
            const __m512i b    = rb ? row32(rb + p, in) : _mm512_setzero_si512();
            bf16* dg           = dst + size_t(p) * size_t(2 * npairs) + size_t(2 * R) * size_t(g);
            const __m512i lo   = _mm512_permutex2var_epi16(a, lo_idx, b);
            if constexpr (lo_elems == 32) {
                _mm512_storeu_si512(dg, lo);
            } else {
                _mm512_mask_storeu_epi16(dg, (__mmask32{1} << lo_elems) - 1, lo);
            }
            if constexpr (hi_elems > 0) {
                const __m512i hi  = _mm512_permutex2var_epi16(a, hi_idx, b);
                const __mmask32 m = hi_elems == 32 ? ~__mmask32{0} : (__mmask32{1} << hi_elems) - 1;
                _mm512_mask_storeu_epi16(dg + 32, m, hi);
            }
        }
    }
}

// Pair panels of a source of element type T: bf16, or float rounded to bf16 as it is packed
// (the same panels as packing the narrowed copy; for an operand packed about once per product,
// such as the weights, this saves writing and reading that copy).
template <int R, typename T = bf16>
void pack_pairs_avx512(PackSrc src, int r0, int rn, int p0, int kc, bf16* dst) {
    static_assert(R >= 1 && R <= 32, "pair panels of up to 32 rows");
    const int npairs = (kc + 1) / 2;
    if (!src.k_contiguous) {
        pack_pairs_rows<R, T>(src, r0, rn, p0, kc, dst);
        return;
    }
    for (int p = 0; p < rn; p += R) {
        const int rows  = std::min(R, rn - p);
        bf16* d         = dst + size_t(p) * size_t(2 * npairs);
        constexpr int G = (R + 7) / 8;
        const T* s[G * 8];
        for (int r = 0; r < G * 8; ++r) {
            s[r] = r < rows ? src.row<T>(r0 + p + r) + size_t(p0) : zero_row<T>();
        }
        // 8 pairs of 8 rows at a time; with R % 8 != 0 a group's store spills into the next
        // pair's slots (rewritten next) or past the panel (the driver's slack).
        int g = 0;
        for (; 2 * (g + 8) <= kc; g += 8) {
            __m256 t[G][8];
            for (int q = 0; q < G; ++q) {
                for (int i = 0; i < 8; ++i) {
                    if constexpr (std::is_same_v<T, float>) {
                        // 32 rows read side by side are more streams than the hardware
                        // prefetcher follows: a row's next lines, 4 steps ahead
                        _mm_prefetch(reinterpret_cast<const char*>(s[q * 8 + i] + 2 * g + 64),
                                     _MM_HINT_T0);
                    }
                    t[q][i] = pairs8(s[q * 8 + i] + 2 * g);
                }
                avx2::transpose8(t[q]);
            }
            for (int i = 0; i < 8; ++i) {
                for (int q = 0; q < G; ++q) {
                    _mm256_storeu_ps(reinterpret_cast<float*>(d + 2 * ((g + i) * R + q * 8)),
                                     t[q][i]);
                }
            }
        }
        for (; g < npairs; ++g) {
            for (int r = 0; r < R; ++r) {
                d[2 * (g * R + r)]     = bf16_value(s[r][2 * g]);
                d[2 * (g * R + r) + 1] = 2 * g + 1 < kc ? bf16_value(s[r][2 * g + 1]) : bf16{};
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::kernels::gemm::avx512

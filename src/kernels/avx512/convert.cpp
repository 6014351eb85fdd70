// bfloat16 conversions, 16 values to a vector in integer arithmetic: the AVX2 kernels' method
// (kernels/avx2/convert.cpp) at twice the width, with masks for the NaNs and the tails. Every
// result is bitwise core/dtype.h's bf16_from_float, denormals included (vcvtneps2bf16 flushes
// those to zero, so it is not used).
// The all-ones masked (maskz) forms of the shifts, vpmovdw and vpmovzxwd are the unmasked
// instructions; they are used because GCC 12 takes the unmasked intrinsics' undefined pass-through
// operand for an uninitialised read (-Wmaybe-uninitialized).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

constexpr __mmask16 kAll = 0xffff;

// The 16 high bits of bf16_from_float for 16 floats, in the low half of each 32-bit lane (the
// high half zero): round to nearest even; a NaN keeps its sign and payload, made quiet.
inline __m512i bf16_bits(__m512i u) {
    const __m512i abs       = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan  = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i high      = _mm512_maskz_srli_epi32(kAll, u, 16);
    const __m512i lsb       = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i sum       = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __m512i rounded   = _mm512_maskz_srli_epi32(kAll, sum, 16);
    const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(rounded, is_nan, quiet_nan);
}

inline __mmask16 tail_mask(size_t left) { return static_cast<__mmask16>((1u << left) - 1u); }

}  // namespace

void bf16_narrow_range(uint16_t* dst, const float* x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm512_maskz_cvtepi32_epi16(kAll, bf16_bits(_mm512_loadu_si512(x + i)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m256i h =
            _mm512_maskz_cvtepi32_epi16(kAll, bf16_bits(_mm512_maskz_loadu_epi32(m, x + i)));
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

void bf16_round_range(float* out, const float* in, size_t n) {
    size_t i = 0;
    if (out == in) {
        // In place, most values are often rounded already (the weights the optimizer wrote
        // back): store only the lanes that change, so the rest of the memory stays clean and the
        // pass costs a read.
        for (; i < n; i += 16) {
            const __mmask16 m       = n - i >= 16 ? kAll : tail_mask(n - i);
            const __m512i x         = _mm512_maskz_loadu_epi32(m, in + i);
            const __m512i r         = _mm512_maskz_slli_epi32(kAll, bf16_bits(x), 16);
            const __mmask16 changed = _mm512_mask_cmpneq_epi32_mask(m, r, x);
            if (changed) _mm512_mask_storeu_epi32(out + i, changed, r);
        }
        return;
    }
    for (; i + 16 <= n; i += 16) {
        const __m512i r = _mm512_maskz_slli_epi32(kAll, bf16_bits(_mm512_loadu_si512(in + i)), 16);
        _mm512_storeu_si512(out + i, r);
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512i r =
            _mm512_maskz_slli_epi32(kAll, bf16_bits(_mm512_maskz_loadu_epi32(m, in + i)), 16);
        _mm512_mask_storeu_epi32(out + i, m, r);
    }
}

void bf16_widen_range(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i w = _mm512_maskz_cvtepu16_epi32(
            kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
        _mm512_storeu_si512(out + i, _mm512_maskz_slli_epi32(kAll, w, 16));
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512i w   = _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(m, in + i));
        _mm512_mask_storeu_epi32(out + i, m, _mm512_maskz_slli_epi32(kAll, w, 16));
    }
}

}  // namespace bagualu::kernels::avx512

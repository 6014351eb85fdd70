// bf16 rounding of 16 floats in AVX-512 integer arithmetic, bitwise core/dtype.h's
// bf16_from_float (round to nearest even; a NaN keeps its sign and payload, made quiet;
// denormals kept). vcvtneps2bf16 / vcvtne2ps2bf16 (AVX512_BF16) give the same bits but take
// denormal inputs for zero: where the CPU has them the conversions use them and send a vector
// holding a denormal (denormals() below) here. Shared by the conversions
// (kernels/avx512/convert.cpp) and the GEMM's packers of float operands
// (kernels/gemm/avx512/pack_pairs.h). Internal linkage: included by AVX-512 translation units
// only.
// The all-ones masked (maskz) shift is the unmasked instruction; it is used because GCC 12 takes
// the unmasked intrinsic's undefined pass-through operand for an uninitialised read
// (-Wmaybe-uninitialized).
#pragma once
#include <immintrin.h>

namespace bagualu::kernels::avx512 {
namespace {

// The 16 floats rounded to bf16, as float bits whose low 16 bits are zero.
inline __m512i bf16_rounded_bits(__m512i u) {
    const __m512i high16   = _mm512_set1_epi32(int(0xffff0000u));
    const __m512i abs      = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i lsb =
        _mm512_and_si512(_mm512_maskz_srli_epi32(__mmask16(0xffff), u, 16), _mm512_set1_epi32(1));
    const __m512i sum       = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __m512i quiet_nan = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    return _mm512_and_si512(_mm512_mask_mov_epi32(sum, is_nan, quiet_nan), high16);
}

// The lanes of x holding a denormal (exponent 0, not zero): |x| - 1 below 0x7fffff, unsigned.
// vcvtneps2bf16 and vcvtne2ps2bf16 (AVX512_BF16) round to nearest even and quiet NaNs as
// bf16_from_float does, but take these for zero.
inline __mmask16 denormals(__m512 x) {
    const __m512i abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                   _mm512_set1_epi32(0x7fffff));
}

// The 16 bf16 of 16 floats, in order.
inline __m256i bf16_of(__m512 x) {
    const __m512i r = bf16_rounded_bits(_mm512_castps_si512(x));
    return _mm512_maskz_cvtepi32_epi16(__mmask16(0xffff),
                                       _mm512_maskz_srli_epi32(__mmask16(0xffff), r, 16));
}

}  // namespace
}  // namespace bagualu::kernels::avx512

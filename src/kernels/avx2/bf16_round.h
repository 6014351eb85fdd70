// bf16 rounding of 8 floats in AVX2 integer arithmetic, bitwise core/dtype.h's bf16_from_float
// (round to nearest even; a NaN stays a quiet NaN; denormals kept). Shared by the conversions
// (kernels/avx2/convert.cpp) and AdamW's bf16 moments (kernels/avx2/adamw.cpp). Internal
// linkage: included by AVX2 translation units only.
#pragma once
#include <immintrin.h>

namespace bagualu::kernels::avx2 {
namespace {

// The 16 high bits of bf16_from_float for 8 floats, in the low half of each 32-bit lane.
inline __m256i bf16_bits(__m256i u) {
    const __m256i abs   = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i isnan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i lsb   = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i sum   = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan   = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(_mm256_srli_epi32(sum, 16), nan, isnan);
}

// The 8 bf16 of 8 floats, in order.
inline __m128i bf16_of(__m256 x) {
    const __m256i h = bf16_bits(_mm256_castps_si256(x));
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// 8 bf16 widened to float.
inline __m256 bf16_widen8(const void* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

}  // namespace
}  // namespace bagualu::kernels::avx2

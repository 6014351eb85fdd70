// exp(x) on 8 float lanes for the AVX2 kernels (include only from sources built with -mavx2
// -mfma, i.e. kernels/avx2/ and */avx2/).
#pragma once
#include <immintrin.h>

namespace bagualu::kernels::avx2 {
namespace {  // internal linkage: each including source keeps the copy built with its flags

// exp(x), 8 lanes: the algorithm of exp_f32 in ops.cpp (Cody-Waite reduction, Cephes
// polynomial, 2^n from the exponent bits). 0 below -87.3 (and for -inf), NaN for NaN, inputs
// above 88 clamped to 88.
inline __m256 exp_ps(__m256 x) {
    const __m256 lo    = _mm256_set1_ps(-87.3f);
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    // max/min return their second operand when either is NaN: NaN flows through.
    const __m256 xc    = _mm256_min_ps(_mm256_set1_ps(88.f), _mm256_max_ps(lo, x));
    const __m256 magic = _mm256_set1_ps(12582912.f);
    const __m256 t     = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n     = _mm256_sub_ps(t, magic);
    __m256 r           = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r                  = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p           = _mm256_set1_ps(1.9875691500e-4f);
    p                  = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p                  = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p                  = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p                  = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p                  = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
    const __m256 two_n =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(below, _mm256_mul_ps(p, two_n));
}

}  // namespace
}  // namespace bagualu::kernels::avx2

// exp(x) on 16 float lanes for the AVX-512 kernels (include only from sources built with the
// AVX-512 flags, i.e. kernels/avx512/ and */avx512/): avx2::exp_ps (kernels/avx2/exp.h)
// operation for operation, so lane for lane the same bits.
// The all-ones masked (maskz) forms are the unmasked instructions: GCC 12 takes the unmasked
// intrinsics' undefined pass-through operand for an uninitialised read.
#pragma once
#include <immintrin.h>

namespace bagualu::kernels::avx512 {
namespace {  // internal linkage: each including source keeps the copy built with its flags

constexpr __mmask16 kAll = 0xffff;

// exp(x), 16 lanes.
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

}  // namespace
}  // namespace bagualu::kernels::avx512

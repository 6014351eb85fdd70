// AVX-512 GELU items (kernels/ops_avx512.h), 16 floats per step: the float operations of generic
// gelu_forward / gelu_backward (ops.cpp) in the same order, with exp_f32's range handling done
// in mask registers, and no FMA (a fused multiply-add rounds once where the generic code rounds
// twice), so every result is bitwise the generic one. The last n % 16 elements use masked
// loads and stores. Internal linkage and no library templates, as in kernels/avx2/.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ops_avx512.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels::avx512 {

namespace {

inline __m512 set(float x) { return _mm512_set1_ps(x); }
inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512i bits(float x) {
    int32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return _mm512_set1_epi32(b);
}

// exp_f32 of ops.cpp on 16 lanes, bit for bit.
inline __m512 exp_exact(__m512 x) {
    const __m512i xb = _mm512_castps_si512(x);
    // Unsigned xb > bits(-87.3): x < -87.3, -inf or a negative NaN.
    const __mmask16 below = _mm512_cmpgt_epu32_mask(xb, bits(-87.3f));
    const __mmask16 above = _mm512_cmpgt_epi32_mask(xb, bits(88.f));  // x > 88, +inf, +NaN
    const __mmask16 nan   = _mm512_cmpgt_epi32_mask(
          _mm512_and_si512(xb, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    __m512 xc          = _mm512_mask_mov_ps(x, below, set(-87.3f));
    xc                 = _mm512_mask_mov_ps(xc, above, set(88.f));
    const __m512 magic = set(12582912.f);
    const __m512 t     = add(mul(xc, set(1.44269504088896341f)), magic);
    const __m512 n     = sub(t, magic);
    const __m512 r     = sub(sub(xc, mul(n, set(0.693359375f))), mul(n, set(-2.12194440e-4f)));
    __m512 p           = set(1.9875691500e-4f);
    p                  = add(mul(p, r), set(1.3981999507e-3f));
    p                  = add(mul(p, r), set(8.3334519073e-3f));
    p                  = add(mul(p, r), set(4.1665795894e-2f));
    p                  = add(mul(p, r), set(1.6666665459e-1f));
    p                  = add(mul(p, r), set(5.0000001201e-1f));
    p                  = add(add(mul(p, mul(r, r)), r), set(1.f));
    const __m512i ni   = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
    // The zero-masked shift: the plain one trips a GCC 12 -Wmaybe-uninitialized in its header.
    const __m512 two_n = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
        __mmask16(0xffff), _mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    const __m512 y     = _mm512_mask_mov_ps(mul(p, two_n), below, _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, nan, x);
}

// e = exp(-2 sqrt(2/pi) (x + a x^3)), as generic GELU computes it.
inline __m512 gelu_exp(__m512 x) {
    const __m512 u = add(x, mul(mul(mul(set(generic::kGeluA), x), x), x));
    return exp_exact(mul(set(-2.f * generic::kGeluK), u));
}

inline __m512 forward16(__m512 x) { return _mm512_div_ps(x, add(set(1.f), gelu_exp(x))); }

inline __m512 backward16(__m512 x, __m512 dy) {
    const __m512 e  = gelu_exp(x);
    const __m512 sg = _mm512_div_ps(set(1.f), add(set(1.f), e));
    const __m512 du_dx =
        mul(set(generic::kGeluK), add(set(1.f), mul(mul(set(3.f * generic::kGeluA), x), x)));
    return mul(add(sg, mul(mul(mul(set(2.f), x), mul(mul(sg, sg), e)), du_dx)), dy);
}

}  // namespace

void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
        _mm512_storeu_ps(out + i, forward16(_mm512_loadu_ps(inp + i)));
    }
    if (i == end) return;
    const __mmask16 m = __mmask16((1u << (end - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m, forward16(_mm512_maskz_loadu_ps(m, inp + i)));
}

void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end) {
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
        _mm512_storeu_ps(dinp + i, backward16(_mm512_loadu_ps(inp + i), _mm512_loadu_ps(dout + i)));
    }
    if (i == end) return;
    const __mmask16 m = __mmask16((1u << (end - i)) - 1u);
    _mm512_mask_storeu_ps(
        dinp + i, m,
        backward16(_mm512_maskz_loadu_ps(m, inp + i), _mm512_maskz_loadu_ps(m, dout + i)));
}

}  // namespace bagualu::kernels::avx512

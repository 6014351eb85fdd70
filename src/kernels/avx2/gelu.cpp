// AVX2 GELU items (kernels/ops_avx2.h), 8 floats per step: the float operations of generic
// gelu_forward / gelu_backward (ops.cpp) in the same order, with exp_f32's range handling done
// on integer lanes, and no FMA (a fused multiply-add rounds once where the generic code rounds
// twice), so every result is bitwise the generic one. The last n % 8 elements go through a
// zero-padded copy. Internal linkage and no library templates, as in attention.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ops_avx2.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels::avx2 {

namespace {

inline __m256 set(float x) { return _mm256_set1_ps(x); }
inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256i bits(float x) {
    int32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return _mm256_set1_epi32(b);
}

// exp_f32 of ops.cpp on 8 lanes, bit for bit.
inline __m256 exp_exact(__m256 x) {
    const __m256i xb   = _mm256_castps_si256(x);
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    // Unsigned xb > bits(-87.3): x < -87.3, -inf or a negative NaN.
    const __m256i below =
        _mm256_cmpgt_epi32(_mm256_xor_si256(xb, sign), _mm256_xor_si256(bits(-87.3f), sign));
    const __m256i above = _mm256_cmpgt_epi32(xb, bits(88.f));  // x > 88, +inf, +NaN
    const __m256i nan   = _mm256_cmpgt_epi32(_mm256_and_si256(xb, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
    __m256 xc           = _mm256_blendv_ps(x, set(-87.3f), _mm256_castsi256_ps(below));
    xc                  = _mm256_blendv_ps(xc, set(88.f), _mm256_castsi256_ps(above));
    const __m256 magic  = set(12582912.f);
    const __m256 t      = add(mul(xc, set(1.44269504088896341f)), magic);
    const __m256 n      = sub(t, magic);
    const __m256 r      = sub(sub(xc, mul(n, set(0.693359375f))), mul(n, set(-2.12194440e-4f)));
    __m256 p            = set(1.9875691500e-4f);
    p                   = add(mul(p, r), set(1.3981999507e-3f));
    p                   = add(mul(p, r), set(8.3334519073e-3f));
    p                   = add(mul(p, r), set(4.1665795894e-2f));
    p                   = add(mul(p, r), set(1.6666665459e-1f));
    p                   = add(mul(p, r), set(5.0000001201e-1f));
    p                   = add(add(mul(p, mul(r, r)), r), set(1.f));
    const __m256i ni    = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
    const __m256 two_n =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    const __m256 y = _mm256_andnot_ps(_mm256_castsi256_ps(below), mul(p, two_n));
    return _mm256_blendv_ps(y, x, _mm256_castsi256_ps(nan));
}

// e = exp(-2 sqrt(2/pi) (x + a x^3)), as generic GELU computes it.
inline __m256 gelu_exp(__m256 x) {
    const __m256 u = add(x, mul(mul(mul(set(generic::kGeluA), x), x), x));
    return exp_exact(mul(set(-2.f * generic::kGeluK), u));
}

inline __m256 forward8(__m256 x) { return _mm256_div_ps(x, add(set(1.f), gelu_exp(x))); }

inline __m256 backward8(__m256 x, __m256 dy) {
    const __m256 e  = gelu_exp(x);
    const __m256 sg = _mm256_div_ps(set(1.f), add(set(1.f), e));
    const __m256 du_dx =
        mul(set(generic::kGeluK), add(set(1.f), mul(mul(set(3.f * generic::kGeluA), x), x)));
    return mul(add(sg, mul(mul(mul(set(2.f), x), mul(mul(sg, sg), e)), du_dx)), dy);
}

}  // namespace

void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) _mm256_storeu_ps(out + i, forward8(_mm256_loadu_ps(inp + i)));
    if (i == end) return;
    alignas(32) float x[8] = {};
    const size_t rest      = size_t(end - i);
    std::memcpy(x, inp + i, rest * sizeof(float));
    _mm256_store_ps(x, forward8(_mm256_load_ps(x)));
    std::memcpy(out + i, x, rest * sizeof(float));
}

void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
        _mm256_storeu_ps(dinp + i, backward8(_mm256_loadu_ps(inp + i), _mm256_loadu_ps(dout + i)));
    }
    if (i == end) return;
    alignas(32) float x[8] = {}, dy[8] = {};
    const size_t rest = size_t(end - i);
    std::memcpy(x, inp + i, rest * sizeof(float));
    std::memcpy(dy, dout + i, rest * sizeof(float));
    _mm256_store_ps(x, backward8(_mm256_load_ps(x), _mm256_load_ps(dy)));
    std::memcpy(dinp + i, x, rest * sizeof(float));
}

}  // namespace bagualu::kernels::avx2

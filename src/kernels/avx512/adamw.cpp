// AVX-512 AdamW items (kernels/ops_avx512.h), 16 floats per step: the float operations of generic
// adamw_update (ops.cpp) in the same order, no FMA (built with -ffp-contract=off,
// CMakeLists.txt), IEEE division and square root, so every result is bitwise the generic one.
// The last n % 16 elements go through the scalar code of the generic kernel. The gradient's
// scaling is one float multiply, as kernels::scale_inplace's.
#include <immintrin.h>

#include <cstdint>

#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale) {
    const __m512 b1 = _mm512_set1_ps(beta1), b2 = _mm512_set1_ps(beta2);
    const __m512 omb1 = _mm512_set1_ps(1.f - beta1), omb2 = _mm512_set1_ps(1.f - beta2);
    const __m512 c1v = _mm512_set1_ps(c1), c2v = _mm512_set1_ps(c2), epsv = _mm512_set1_ps(eps);
    const __m512 lrv = _mm512_set1_ps(lr), wdv = _mm512_set1_ps(weight_decay);
    const __m512 gsv = _mm512_set1_ps(grad_scale);
    int64_t i        = begin;
    for (; i + 16 <= end; i += 16) {
        const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gsv);
        const __m512 mi =
            _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, g));
        const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                        _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        const __m512 p = _mm512_loadu_ps(param + i);
        // The zero-masked root: the plain one trips a GCC 12 -Wmaybe-uninitialized in its header.
        const __m512 root = _mm512_maskz_sqrt_ps(__mmask16(0xffff), _mm512_div_ps(vi, c2v));
        const __m512 den  = _mm512_add_ps(root, epsv);
        const __m512 step =
            _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(mi, c1v), den), _mm512_mul_ps(wdv, p));
        _mm512_storeu_ps(param + i, _mm512_sub_ps(p, _mm512_mul_ps(lrv, step)));
    }
    for (; i < end; ++i) {
        const float g  = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.f - beta1) * g;
        const float vi = beta2 * v[i] + (1.f - beta2) * g * g;
        m[i]           = mi;
        v[i]           = vi;
        param[i] -= lr * ((mi / c1) / (__builtin_sqrtf(vi / c2) + eps) + weight_decay * param[i]);
    }
}

}  // namespace bagualu::kernels::avx512

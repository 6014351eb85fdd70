// AVX2 AdamW items (kernels/ops_avx2.h), 8 floats per step: the float operations of generic
// adamw_update (ops.cpp) in the same order, no FMA (built with -ffp-contract=off,
// CMakeLists.txt), IEEE division and square root, so every result is bitwise the generic one.
// The last n % 8 elements go through the generic kernel's scalar step (kernels/adamw_tail.h). The
// bf16-moment kernel is the same update between a widening load and a rounding store of m and v.
// The gradient's scaling is one float multiply, as kernels::scale_inplace's.
#include <immintrin.h>

#include <cstdint>

#include "kernels/adamw_tail.h"
#include "kernels/avx2/bf16_round.h"
#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {
namespace {

// The moments' loads and stores: floats, or bf16 widened and rounded (bitwise core/dtype.h's).
__m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__m256 load8(const uint16_t* p) { return bf16_widen8(p); }
void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
void store8(uint16_t* p, __m256 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_of(x)); }

template <typename M>
void adamw_range(float* param, const float* grad, M* m, M* v, int64_t begin, int64_t end, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float c1, float c2,
                 float grad_scale) {
    const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2);
    const __m256 omb1 = _mm256_set1_ps(1.f - beta1), omb2 = _mm256_set1_ps(1.f - beta2);
    const __m256 c1v = _mm256_set1_ps(c1), c2v = _mm256_set1_ps(c2), epsv = _mm256_set1_ps(eps);
    const __m256 lrv = _mm256_set1_ps(lr), wdv = _mm256_set1_ps(weight_decay);
    const __m256 gsv = _mm256_set1_ps(grad_scale);
    int64_t i        = begin;
    for (; i + 8 <= end; i += 8) {
        const __m256 g  = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gsv);
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, load8(m + i)), _mm256_mul_ps(omb1, g));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, load8(v + i)),
                                        _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        store8(m + i, mi);
        store8(v + i, vi);
        const __m256 p   = _mm256_loadu_ps(param + i);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, c2v)), epsv);
        const __m256 step =
            _mm256_add_ps(_mm256_div_ps(_mm256_div_ps(mi, c1v), den), _mm256_mul_ps(wdv, p));
        _mm256_storeu_ps(param + i, _mm256_sub_ps(p, _mm256_mul_ps(lrv, step)));
    }
    for (; i < end; ++i) {
        adamw_element(param + i, grad[i], m + i, v + i, lr, beta1, beta2, eps, weight_decay, c1, c2,
                      grad_scale);
    }
}

}  // namespace

void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale) {
    adamw_range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, c1, c2,
                grad_scale);
}

void adamw_update_range_bf16m(float* param, const float* grad, uint16_t* m, uint16_t* v,
                              int64_t begin, int64_t end, float lr, float beta1, float beta2,
                              float eps, float weight_decay, float c1, float c2, float grad_scale) {
    adamw_range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, c1, c2,
                grad_scale);
}

}  // namespace bagualu::kernels::avx2

// AVX-512 AdamW items (kernels/ops_avx512.h), 16 floats per step: the float operations of generic
// adamw_update (ops.cpp) in the same order, no FMA (built with -ffp-contract=off,
// CMakeLists.txt), IEEE division and square root, so every result is bitwise the generic one.
// The last n % 16 elements go through the generic kernel's scalar step (kernels/adamw_tail.h). The
// bf16-moment kernel is the same update between a widening load and a rounding store of m and v.
// The gradient's scaling is one float multiply, as kernels::scale_inplace's.
#include <immintrin.h>

#include <cstdint>

#include "kernels/adamw_tail.h"
#include "kernels/avx512/bf16_round.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {
namespace {

// The zero-masked forms with every lane set: the plain ones trip a GCC 12
// -Wmaybe-uninitialized in its header.
constexpr __mmask16 kAll = 0xffff;

struct Hyper {
    __m512 b1, b2, omb1, omb2, c1, c2, eps, lr, wd, gs;
    Hyper(float beta1, float beta2, float c1_, float c2_, float eps_, float lr_, float wd_,
          float gs_)
        : b1(_mm512_set1_ps(beta1)),
          b2(_mm512_set1_ps(beta2)),
          omb1(_mm512_set1_ps(1.f - beta1)),
          omb2(_mm512_set1_ps(1.f - beta2)),
          c1(_mm512_set1_ps(c1_)),
          c2(_mm512_set1_ps(c2_)),
          eps(_mm512_set1_ps(eps_)),
          lr(_mm512_set1_ps(lr_)),
          wd(_mm512_set1_ps(wd_)),
          gs(_mm512_set1_ps(gs_)) {}
};

// 16 elements at param: m and v updated from the gradient, the parameter stepped with them
void update16(const Hyper& h, float* param, const float* grad, __m512& m, __m512& v) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad), h.gs);
    m              = _mm512_add_ps(_mm512_mul_ps(h.b1, m), _mm512_mul_ps(h.omb1, g));
    v = _mm512_add_ps(_mm512_mul_ps(h.b2, v), _mm512_mul_ps(_mm512_mul_ps(h.omb2, g), g));
    const __m512 p    = _mm512_loadu_ps(param);
    const __m512 root = _mm512_maskz_sqrt_ps(kAll, _mm512_div_ps(v, h.c2));
    const __m512 den  = _mm512_add_ps(root, h.eps);
    const __m512 step =
        _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(m, h.c1), den), _mm512_mul_ps(h.wd, p));
    _mm512_storeu_ps(param, _mm512_sub_ps(p, _mm512_mul_ps(h.lr, step)));
}

__m512 widen16(const uint16_t* p) {
    const __m512i w =
        _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, w, 16));
}

// The moments' loads and stores: floats, or bf16 widened and rounded (bitwise core/dtype.h's).
__m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__m512 load16(const uint16_t* p) { return widen16(p); }
void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
void store16(uint16_t* p, __m512 x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_of(x));
}

template <typename M>
void adamw_range(float* param, const float* grad, M* m, M* v, int64_t begin, int64_t end, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float c1, float c2,
                 float grad_scale) {
    const Hyper h(beta1, beta2, c1, c2, eps, lr, weight_decay, grad_scale);
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512 mi = load16(m + i), vi = load16(v + i);
        update16(h, param + i, grad + i, mi, vi);
        store16(m + i, mi);
        store16(v + i, vi);
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

}  // namespace bagualu::kernels::avx512

// The scalar AdamW step of one element with m and v stored as float or as bf16 bits (widened on
// load, rounded to nearest even on store: core/dtype.h's): the last n % width elements of the
// SIMD AdamW kernels (kernels/avx2/adamw.cpp, kernels/avx512/adamw.cpp), the float operations of
// generic adamw_update (ops.cpp) in the same order. Internal linkage: each ISA's translation unit,
// built with -ffp-contract=off (CMakeLists.txt), keeps its own copy, so no multiply and add fuse.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace bagualu::kernels {
namespace {

inline float adamw_load1(const float* p) { return *p; }
inline float adamw_load1(const uint16_t* p) { return bf16_to_float(*p); }
inline void adamw_store1(float* p, float x) { *p = x; }
inline void adamw_store1(uint16_t* p, float x) { *p = bf16_from_float(x); }

template <typename M>
inline void adamw_element(float* param, float grad, M* m, M* v, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float c1, float c2, float grad_scale) {
    const float g  = grad * grad_scale;
    const float mi = beta1 * adamw_load1(m) + (1.f - beta1) * g;
    const float vi = beta2 * adamw_load1(v) + (1.f - beta2) * g * g;
    adamw_store1(m, mi);
    adamw_store1(v, vi);
    *param -= lr * ((mi / c1) / (__builtin_sqrtf(vi / c2) + eps) + weight_decay * *param);
}

}  // namespace
}  // namespace bagualu::kernels

// Threaded drivers of the AVX-512 GELU and AdamW items (kernels/ops_avx512.h). Built for any
// x86-64 like the rest of kernels/, so the library templates instantiated here are portable
// code; only the item functions in kernels/avx512/ use AVX-512 instructions. Elementwise, so
// any split of the elements over threads gives the same bits.
#include "kernels/ops_avx512.h"

#include <cmath>

#include "kernels/parallel_rows.h"

namespace bagualu::kernels::avx512 {

void gelu_forward(float* out, const float* inp, size_t n) {
    parallel_rows(int64_t(n), 1,
                  [&](int64_t begin, int64_t end) { gelu_forward_range(out, inp, begin, end); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        gelu_backward_range(dinp, inp, dout, begin, end);
    });
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step) {
    // The bias corrections as the generic kernel rounds them.
    const float c1 = float(1.0 - std::pow(double(beta1), step));
    const float c2 = float(1.0 - std::pow(double(beta2), step));
    parallel_rows(int64_t(n), 4, [&](int64_t begin, int64_t end) {
        adamw_update_range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, c1,
                           c2);
    });
}

}  // namespace bagualu::kernels::avx512

// Threaded drivers of the AVX-512 GELU items (kernels/ops_avx512.h). Built for any x86-64 like
// the rest of kernels/, so the library templates instantiated here are portable code; only the
// item functions in kernels/avx512/ use AVX-512 instructions. Elementwise, so any split of the
// elements over threads gives the same bits.
#include "kernels/ops_avx512.h"

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

}  // namespace bagualu::kernels::avx512

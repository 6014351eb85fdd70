// AVX2 FMA peak loop: 12 independent ymm accumulators (latency 4-5 x 2 pipes needs at least 10).
#include <immintrin.h>

#include "kernels/peak_loops.h"

namespace bagualu::kernels::avx2 {

void fma_loop_f32(uint64_t iters, float* sink) {
    constexpr int kAcc = 12;
    __m256 acc[kAcc];
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
    const __m256 m = _mm256_set1_ps(0.999999f);
    const __m256 a = _mm256_set1_ps(1e-6f);
    for (uint64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    }
    __m256 s = acc[0];
    for (int i = 1; i < kAcc; ++i) s = _mm256_add_ps(s, acc[i]);
    *sink = _mm256_cvtss_f32(s);
}

}  // namespace bagualu::kernels::avx2

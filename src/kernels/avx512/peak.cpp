// AVX-512 peak loops: 16 independent zmm accumulators, updated with FMA (float) or vdpbf16ps
// (bf16 pairs into float lanes).
#include <immintrin.h>

#include "kernels/peak_loops.h"

namespace bagualu::kernels::avx512 {

namespace {

constexpr int kAcc = 16;

// The sum of all lanes (not _mm512_reduce_add_ps, which trips a GCC 12 -Wuninitialized).
float sum_lanes(const __m512 acc[kAcc]) {
    __m512 s = acc[0];
    for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    float total = 0.0f;
    for (float x : lanes) total += x;
    return total;
}

}  // namespace

void fma_loop_f32(uint64_t iters, float* sink) {
    __m512 acc[kAcc];
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
    const __m512 m = _mm512_set1_ps(0.999999f);
    const __m512 a = _mm512_set1_ps(1e-6f);
    for (uint64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    }
    *sink = sum_lanes(acc);
}

void dot_loop_bf16(uint64_t iters, float* sink) {
    __m512 acc[kAcc];
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
    // Small values (0x3c00 = 2^-7 and 0x3f80 = 1.0 as bf16) keep the sums finite.
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    const __m512bh y = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    for (uint64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    }
    *sink = sum_lanes(acc);
}

}  // namespace bagualu::kernels::avx512

// AVX-512 peak loops: 16 independent zmm accumulators, updated with FMA (float) or vdpbf16ps
// (bf16 pairs into float lanes); and the AMX-BF16 loop, compiled for AMX by function attribute
// so that nothing else in this file may use it.
#include <immintrin.h>

#include <cstring>

#include "kernels/avx512/tile_config.h"
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

__attribute__((target("amx-tile,amx-bf16"))) void tile_loop_bf16(uint64_t iters, float* sink) {
    const TileConfig cfg = tiles_16x64();
    // A tiles hold 2^-7, B tiles 1.0 (bf16 0x3c00, 0x3f80): sums stay finite and normal.
    alignas(64) uint16_t a[16 * 32], b[16 * 32];
    alignas(64) float c[16 * 16];
    for (int i = 0; i < 16 * 32; ++i) {
        a[i] = 0x3c00;
        b[i] = 0x3f80;
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    for (uint64_t it = 0; it < iters; ++it) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float total = 0.0f;
    _tile_stored(0, c, 64);
    total += c[0];
    _tile_stored(1, c, 64);
    total += c[1];
    _tile_stored(2, c, 64);
    total += c[2];
    _tile_stored(3, c, 64);
    total += c[3];
    _tile_release();
    *sink = total;
}

}  // namespace bagualu::kernels::avx512

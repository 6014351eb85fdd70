// The 64 bytes ldtilecfg loads (palette 1), with every one of the first eight tiles 16 rows of
// 64 bytes: the one configuration our AMX code uses (the GEMM kernel, kernels/gemm/avx512/
// amx.cpp, the bf16 attention, kernels/avx512/attention_bf16.cpp, and the peak loop,
// kernels/avx512/peak.cpp); and the steps of a 32 x 32 block of C in tiles 0-3 (rows 0-15:
// tiles 0, 1; rows 16-31: 2, 3), which the first two share. Internal linkage.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace bagualu::kernels::avx512 {
namespace {

struct alignas(64) TileConfig {
    uint8_t palette_id = 1;
    uint8_t start_row  = 0;
    uint8_t reserved[14]{};
    uint16_t colsb[16]{};
    uint8_t rows[16]{};
};

inline TileConfig tiles_16x64() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        cfg.rows[t]  = 16;
    }
    return cfg;
}

// The C block's tiles from c (row stride ldc_b bytes), or zero.
__attribute__((target("amx-tile"))) inline void load_c_tiles(const float* c, size_t ldc_b) {
    const float* hi = c + 16 * (ldc_b / sizeof(float));
    _tile_loadd(0, c, ldc_b);
    _tile_loadd(1, c + 16, ldc_b);
    _tile_loadd(2, hi, ldc_b);
    _tile_loadd(3, hi + 16, ldc_b);
}
__attribute__((target("amx-tile"))) inline void zero_c_tiles() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}
__attribute__((target("amx-tile"))) inline void store_c_tiles(float* c, size_t ldc_b) {
    float* hi = c + 16 * (ldc_b / sizeof(float));
    _tile_stored(0, c, ldc_b);
    _tile_stored(1, c + 16, ldc_b);
    _tile_stored(2, hi, ldc_b);
    _tile_stored(3, hi + 16, ldc_b);
}

// One k step of 32 bf16: A rows 0-15 at a0 and 16-31 at a1 (tiles 4, 5; row stride sa bytes),
// B's pairs of columns 0-15 at b0 and 16-31 at b1 (tiles 6, 7; stride sb), added to the block.
__attribute__((target("amx-tile,amx-bf16"))) inline void tile_step(const void* a0, const void* a1,
                                                                   size_t sa, const void* b0,
                                                                   const void* b1, size_t sb) {
    _tile_loadd(4, a0, sa);
    _tile_loadd(6, b0, sb);
    _tile_loadd(7, b1, sb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1, sa);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

}  // namespace
}  // namespace bagualu::kernels::avx512

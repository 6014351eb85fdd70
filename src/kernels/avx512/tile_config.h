// The 64 bytes ldtilecfg loads (palette 1), with every one of the first eight tiles 16 rows of
// 64 bytes: the one configuration our AMX code uses (the GEMM kernel, kernels/gemm/avx512/
// amx.cpp, and the peak loop, kernels/avx512/peak.cpp). Internal linkage.
#pragma once
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

}  // namespace
}  // namespace bagualu::kernels::avx512

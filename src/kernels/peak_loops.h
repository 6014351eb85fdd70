// Per-ISA register-only multiply-add loops behind kernels/peak.h. Each runs `iters` iterations
// of a fixed block of independent accumulator updates worth the stated flops, and stores the
// accumulators' sum to *sink so nothing is optimised away. Call only where the ISA is present.
#pragma once
#include <cstdint>

namespace bagualu::kernels {

namespace avx2 {
inline constexpr int kFmaLoopF32Flops = 12 * 8 * 2;  // 12 ymm accumulators
void fma_loop_f32(uint64_t iters, float* sink);
}  // namespace avx2

namespace avx512 {
inline constexpr int kFmaLoopF32Flops  = 16 * 16 * 2;  // 16 zmm accumulators
inline constexpr int kDotLoopBf16Flops = 16 * 16 * 4;  // 16 zmm accumulators, 2 products a lane
void fma_loop_f32(uint64_t iters, float* sink);
void dot_loop_bf16(uint64_t iters, float* sink);
// 4 independent tdpbf16ps per iteration, each (16 x 32) @ (32 x 16) bf16 into 16 x 16 floats.
// Only after request_amx() succeeded (kernels/cpu_features.h).
inline constexpr int kTileLoopBf16Flops = 4 * 16 * 16 * 32 * 2;
void tile_loop_bf16(uint64_t iters, float* sink);
}  // namespace avx512

}  // namespace bagualu::kernels

// Element types other than float32. bf16 is stored as raw uint16_t bits (the top half of an
// IEEE float32), so buffers read from checkpoints can be used without a copy.
// Conversion float -> bf16 rounds to nearest even; NaN stays NaN (quiet). bf16 -> float is exact.
#pragma once
#include <bit>
#include <cstdint>

namespace bagualu {

using bf16 = uint16_t;

inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline bf16 bf16_from_float(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x0040u);
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16>((u + rounding) >> 16);
}

}  // namespace bagualu

// bf16 and fp16 <-> float conversions for the reduced-precision payloads of collectives.h, kept
// private to dist/comm (namespace detail) until the project has a shared dtype header. Storage is
// uint16_t; float -> half rounds to nearest even, NaN stays NaN, fp16 overflow gives +-inf,
// fp16 subnormals are exact. Portable bit manipulation: no F16C or AVX-512 BF16 needed.
#pragma once
#include <bit>
#include <cstdint>

namespace bagualu::dist::detail {

inline float float_from_bf16(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t bf16_from_float(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
    const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float float_from_fp16(uint16_t h) {
    constexpr uint32_t kShiftedExp = 0x7c00u << 13;
    uint32_t o                     = (uint32_t{h} & 0x7fffu) << 13;
    const uint32_t exp             = o & kShiftedExp;
    o += (127u - 15u) << 23;
    if (exp == kShiftedExp) {
        o += (128u - 16u) << 23;  // inf / NaN
    } else if (exp == 0) {
        o += 1u << 23;  // zero / subnormal: renormalise through float arithmetic
        o = std::bit_cast<uint32_t>(std::bit_cast<float>(o) -
                                    std::bit_cast<float>(uint32_t{113u << 23}));
    }
    return std::bit_cast<float>(o | ((uint32_t{h} & 0x8000u) << 16));
}

inline uint16_t fp16_from_float(float f) {
    constexpr uint32_t kF32Inf      = 255u << 23;
    constexpr uint32_t kF16Max      = (127u + 16u) << 23;  // 65536: everything above is inf
    constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t x                      = std::bit_cast<uint32_t>(f);
    const uint32_t sign             = x & 0x80000000u;
    x ^= sign;
    uint32_t o = 0;
    if (x >= kF16Max) {
        o = x > kF32Inf ? 0x7e00u : 0x7c00u;
    } else if (x < (113u << 23)) {
        // Subnormal or zero: align the 10 mantissa bits at the bottom with a magic add (RNE).
        const float g = std::bit_cast<float>(x) + std::bit_cast<float>(kDenormMagic);
        o             = std::bit_cast<uint32_t>(g) - kDenormMagic;
    } else {
        const uint32_t mant_odd = (x >> 13) & 1u;
        x += ((15u - 127u) << 23) + 0xfffu + mant_odd;
        o = x >> 13;
    }
    return static_cast<uint16_t>(o | (sign >> 16));
}

}  // namespace bagualu::dist::detail

// Element types other than float32. bf16 and fp16 are stored as raw uint16_t bits (bf16: the top
// half of an IEEE float32; fp16: IEEE binary16), so buffers read from checkpoints can be used
// without a copy. Conversions float -> half round to nearest even; NaN stays NaN (quiet); fp16
// overflow (|x| >= 65520) gives +-inf and fp16 subnormals are exact. half -> float is exact.
// Portable bit manipulation: no F16C or AVX-512 BF16 needed.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>

namespace bagualu {

using bf16 = uint16_t;
using fp16 = uint16_t;

// The element type of a tensor or of a computation: float32, bfloat16 or IEEE half.
enum class Dtype { float32, bfloat16, float16 };

inline const char* dtype_name(Dtype d) {
    return d == Dtype::float32 ? "fp32" : d == Dtype::bfloat16 ? "bf16" : "fp16";
}

inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline bf16 bf16_from_float(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x0040u);
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16>((u + rounding) >> 16);
}

inline float fp16_to_float(fp16 h) {
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

inline fp16 fp16_from_float(float f) {
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
    return static_cast<fp16>(o | (sign >> 16));
}

// dst[i] = src[i] in the half type d (bfloat16 or float16) for i < n, and back (exact): the
// 16-bit payloads of collectives and all-to-alls.
inline void to_half(Dtype d, const float* src, uint16_t* dst, size_t n) {
    if (d == Dtype::bfloat16) {
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_from_float(src[i]);
    } else {
        for (size_t i = 0; i < n; ++i) dst[i] = fp16_from_float(src[i]);
    }
}
inline void from_half(Dtype d, const uint16_t* src, float* dst, size_t n) {
    if (d == Dtype::bfloat16) {
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
    } else {
        for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
    }
}

// f rounded to the nearest value of dtype d (identity for f32).
inline float round_to(Dtype d, float f) {
    return d == Dtype::bfloat16  ? bf16_to_float(bf16_from_float(f))
           : d == Dtype::float16 ? fp16_to_float(fp16_from_float(f))
                                 : f;
}

}  // namespace bagualu

// bf16 and fp16 <-> float conversions for the reduced-precision payloads of collectives.h: the
// shared ones of core/dtype.h under the names dist/comm has always used. Storage is uint16_t;
// float -> half rounds to nearest even, NaN stays NaN, fp16 overflow gives +-inf, fp16
// subnormals are exact.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace bagualu::dist::detail {

inline float float_from_bf16(uint16_t h) { return bagualu::bf16_to_float(h); }
inline uint16_t bf16_from_float(float f) { return bagualu::bf16_from_float(f); }
inline float float_from_fp16(uint16_t h) { return bagualu::fp16_to_float(h); }
inline uint16_t fp16_from_float(float f) { return bagualu::fp16_from_float(f); }

}  // namespace bagualu::dist::detail

// In-register transposes and interleaves for the AVX-512 kernels (include only from sources
// built with the AVX-512 flags): the GEMM's packers (kernels/gemm/avx512/amx.cpp,
// pack_pairs.h) and the bf16 attention (kernels/avx512/attention_bf16.cpp). Internal linkage.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace bagualu::kernels::avx512 {
namespace {

// Indices for vpermt2w (_mm512_permutex2var_epi16): the low (half 0) and high (half 1) halves of
// (a0, b0, a1, b1, ...) from rows a and b.
struct InterleaveIndex {
    alignas(64) int16_t idx[2][32];
};
constexpr InterleaveIndex make_interleave_index() {
    InterleaveIndex t{};
    for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < 16; ++i) {
            t.idx[half][2 * i]     = static_cast<int16_t>(half * 16 + i);
            t.idx[half][2 * i + 1] = static_cast<int16_t>(32 + half * 16 + i);
        }
    }
    return t;
}
constexpr InterleaveIndex kInterleave = make_interleave_index();

// The 16 x 16 transpose of 32-bit words r[0..15] (row i lane j -> row j lane i). The zero-masked
// forms with every lane selected are the plain instructions; GCC 12 warns about the undefined
// pass-through operand of the plain intrinsics.
inline void transpose16_epi32(__m512i r[16]) {
    constexpr __mmask16 all16 = 0xffff;
    constexpr __mmask8 all8   = 0xff;
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i]     = _mm512_maskz_unpacklo_epi32(all16, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(all16, r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[4 * i]     = _mm512_maskz_unpacklo_epi64(all8, t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(all8, t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(all8, t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(all8, t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
            t[8 * i + j] = _mm512_maskz_shuffle_i32x4(all16, r[8 * i + j], r[8 * i + j + 4], 0x88);
            t[8 * i + j + 4] =
                _mm512_maskz_shuffle_i32x4(all16, r[8 * i + j], r[8 * i + j + 4], 0xdd);
        }
    }
    for (int j = 0; j < 8; ++j) {
        r[j]     = _mm512_maskz_shuffle_i32x4(all16, t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_maskz_shuffle_i32x4(all16, t[j], t[j + 8], 0xdd);
    }
}

}  // namespace
}  // namespace bagualu::kernels::avx512

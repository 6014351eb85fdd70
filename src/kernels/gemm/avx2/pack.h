// Fast float packing for x86 (AVX2 and up): rows with contiguous k are transposed 8 x 8 in
// registers; rows with contiguous r are copied 8 at a time. Sources are float, bf16 (widened
// while loading) or floats rounded to bf16 while loading (F32AsBf16: the widening bf16 kernels'
// KernelSpec::pack_b_f32, the same panels as from the narrowed copy). Same layout and contract
// as pack_panels in kernels/gemm/pack.h with KS = 1.
// Internal linkage: included by the avx2 and avx512 kernels, each compiled with its own flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/avx2/bf16_round.h"
#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm::avx2 {
namespace {

// Longest k block the transposing packer accepts (it reads missing rows from a zero row).
constexpr int kMaxPackK                         = 1024;
alignas(64) const float kZeroF32[kMaxPackK + 8] = {};
alignas(64) const bf16 kZeroBf16[kMaxPackK + 8] = {};

// A float source read as its bf16 rounding (core/dtype.h bf16_from_float, widened back).
struct F32AsBf16 {
    float v;
};
static_assert(sizeof(F32AsBf16) == sizeof(float));

inline const float* zero_row(const float*) { return kZeroF32; }
inline const bf16* zero_row(const bf16*) { return kZeroBf16; }
inline const F32AsBf16* zero_row(const F32AsBf16*) {
    return reinterpret_cast<const F32AsBf16*>(kZeroF32);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 load8(const F32AsBf16* p) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(kernels::avx2::bf16_bits(u), 16));
}
inline float load1(const float* p) { return *p; }
inline float load1(const F32AsBf16* p) { return bf16_to_float(bf16_from_float(p->v)); }
inline float load1(const bf16* p) {
    const uint32_t u = static_cast<uint32_t>(*p) << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
    const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
    const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
    const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
    const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0]            = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1]            = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2]            = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3]            = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4]            = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5]            = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6]            = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7]            = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Rows [r0, r0 + rn) x k in [p0, p0 + kc) of op(X) -> float panels (kc, R), zero-padded.
// The transposing path stores whole groups of 8 rows in increasing k, so when R % 8 != 0 each
// store spills into the next k's slots (rewritten next) or past the panel (driver slack).
template <int R, typename Src>
void pack_panels_f32(PackSrc src, int r0, int rn, int p0, int kc, float* dst) {
    constexpr int G = (R + 7) / 8;
    const Src* x    = static_cast<const Src*>(src.data);
    for (int p = 0; p < rn; p += R) {
        const int rows = std::min(R, rn - p);
        float* d       = dst + size_t(p) * size_t(kc);
        if (src.k_contiguous) {
            const Src* s[G * 8];
            for (int r = 0; r < G * 8; ++r) {
                s[r] = r < rows ? src.row<Src>(r0 + p + r) + size_t(p0) : zero_row(x);
            }
            int k = 0;
            for (; k + 8 <= kc; k += 8) {
                __m256 t[G][8];
                for (int g = 0; g < G; ++g) {
                    for (int q = 0; q < 8; ++q) t[g][q] = load8(s[g * 8 + q] + k);
                    transpose8(t[g]);
                }
                for (int kk = 0; kk < 8; ++kk) {
                    for (int g = 0; g < G; ++g)
                        _mm256_storeu_ps(d + (k + kk) * R + g * 8, t[g][kk]);
                }
            }
            for (; k < kc; ++k) {
                for (int r = 0; r < R; ++r) d[k * R + r] = load1(s[r] + k);
            }
        } else {
            for (int k = 0; k < kc; ++k) {
                const Src* s = src.row<Src>(p0 + k) + size_t(r0 + p);
                float* dk    = d + k * R;
                int r        = 0;
                if (rows == R) {
                    for (; r + 8 <= R; r += 8) _mm256_storeu_ps(dk + r, load8(s + r));
                }
                for (; r < rows; ++r) dk[r] = load1(s + r);
                for (; r < R; ++r) dk[r] = 0.0f;
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::kernels::gemm::avx2

// bfloat16 rounding and widening, 16 values to a vector in integer arithmetic: the AVX2 kernels'
// method (kernels/avx2/convert.cpp) at twice the width, with masks for the NaNs and the tails.
// Narrowing with AVX512_BF16 is one vcvtne2ps2bf16 for 32 values (rounding to nearest even and
// quieting NaNs as bf16_from_float does); the instruction takes denormal inputs for zero, so a
// vector holding one goes through the AVX2 loop. Without AVX512_BF16 narrowing is the AVX2 loop:
// on the AMD Zen 5 measured, a 512-bit integer version was faster on arrays in L2 but slower on
// arrays that stream from L3 and memory, as the model's do (docs/results.md). Every result is
// bitwise core/dtype.h's bf16_from_float, denormals included.
// The all-ones masked (maskz) forms of the shifts and of vpmovzxwd are the unmasked instructions;
// they are used because GCC 12 takes the unmasked intrinsics' undefined pass-through operand for
// an uninitialised read (-Wmaybe-uninitialized).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/avx512/bf16_round.h"
#include "kernels/cpu_features.h"
#include "kernels/ops_avx2.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

constexpr __mmask16 kAll = 0xffff;

inline __mmask16 tail_mask(size_t left) { return static_cast<__mmask16>((1u << left) - 1u); }

}  // namespace

void bf16_narrow_range(uint16_t* dst, const float* x, size_t n) {
    static const bool convert = cpu_features().avx512_bf16;
    if (!convert) {
        avx2::bf16_narrow_range(dst, x, n);
        return;
    }
    // 32 values a step (4 Mi values in L3, one thread: 0.51 -> 0.34 ns a value; in L2 0.13 ->
    // 0.06; docs/results.md)
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
        if (denormals(lo) | denormals(hi)) {
            avx2::bf16_narrow_range(dst + i, x + i, 32);
            continue;
        }
        _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    if (i < n) avx2::bf16_narrow_range(dst + i, x + i, n - i);
}

void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n) {
    static const bool convert = cpu_features().avx512_bf16;
    if (!convert) {
        avx2::bf16_narrow_scaled(dst, x, w, n);
        return;
    }
    const __m512 wv = _mm512_set1_ps(w);
    size_t i        = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 lo = _mm512_mul_ps(wv, _mm512_loadu_ps(x + i));
        const __m512 hi = _mm512_mul_ps(wv, _mm512_loadu_ps(x + i + 16));
        if (denormals(lo) | denormals(hi)) {
            avx2::bf16_narrow_scaled(dst + i, x + i, w, 32);
            continue;
        }
        _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    if (i < n) avx2::bf16_narrow_scaled(dst + i, x + i, w, n - i);
}

void bf16_round_range(float* out, const float* in, size_t n) {
    size_t i = 0;
    if (out == in) {
        // In place, most values are often rounded already (the weights the optimizer wrote
        // back): store only the vectors that change, so the rest of the memory stays clean and
        // the pass costs a read. (Masked loads and stores of the changed lanes only were three
        // times slower here.)
        for (; i + 16 <= n; i += 16) {
            const __m512i x = _mm512_loadu_si512(in + i);
            const __m512i r = bf16_rounded_bits(x);
            if (_mm512_cmpneq_epi32_mask(r, x)) _mm512_storeu_si512(out + i, r);
        }
    } else {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_si512(out + i, bf16_rounded_bits(_mm512_loadu_si512(in + i)));
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_epi32(out + i, m,
                                 bf16_rounded_bits(_mm512_maskz_loadu_epi32(m, in + i)));
    }
}

void bf16_round_stream(float* out, const float* in, size_t n) {
    // up to the first 64-byte boundary of out as bf16_round_range, then whole lines streamed
    const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64 / 4);
    bf16_round_range(out, in, head);
    size_t i = head;
    for (; i + 16 <= n; i += 16) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i),
                            bf16_rounded_bits(_mm512_loadu_si512(in + i)));
    }
    bf16_round_range(out + i, in + i, n - i);
    _mm_sfence();
}

namespace {

// bf16_bias_round over whole vectors of 16; Convert: by vcvtneps2bf16 (AVX512_BF16), a vector
// holding a denormal in integer arithmetic.
template <bool Convert>
size_t bias_round16(float* o, const float* bias, uint16_t* half, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(o + i);
        if (bias) x = _mm512_add_ps(x, _mm512_loadu_ps(bias + i));
        __m256i h;
        if (Convert && !denormals(x)) {
            h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
        } else {
            h = bf16_of(x);
        }
        _mm512_storeu_si512(
            o + i, _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
        if (half) _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + i), h);
    }
    return i;
}

}  // namespace

void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n) {
    static const bool convert = cpu_features().avx512_bf16;
    const size_t i =
        convert ? bias_round16<true>(o, bias, half, n) : bias_round16<false>(o, bias, half, n);
    if (i < n)
        avx2::bf16_bias_round(o + i, bias ? bias + i : nullptr, half ? half + i : nullptr, n - i);
}

void bf16_widen_range(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i w = _mm512_maskz_cvtepu16_epi32(
            kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
        _mm512_storeu_si512(out + i, _mm512_maskz_slli_epi32(kAll, w, 16));
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512i w   = _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(m, in + i));
        _mm512_mask_storeu_epi32(out + i, m, _mm512_maskz_slli_epi32(kAll, w, 16));
    }
}

}  // namespace bagualu::kernels::avx512

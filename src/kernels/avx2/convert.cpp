// bfloat16 conversions, 8 values to a vector in integer arithmetic: the rounding of
// core/dtype.h's bf16_from_float (round to nearest even, a NaN stays a quiet NaN), so every
// result is bitwise the scalar one, denormals included (vcvtneps2bf16 flushes those to zero,
// so it is not used).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/avx2/bf16_round.h"
#include "kernels/ops_avx2.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels::avx2 {

namespace {

inline __m256i load8(const float* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

}  // namespace

void bf16_narrow_range(uint16_t* dst, const float* x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i lo = bf16_bits(load8(x + i));
        const __m256i hi = bf16_bits(load8(x + i + 8));
        // packus interleaves the 128-bit lanes (lo0 hi0 lo1 hi1): put them back in order
        const __m256i packed =
            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    }
    for (; i < n; ++i) dst[i] = bf16_from_float(x[i]);
}

void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    size_t i        = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i lo =
            bf16_bits(_mm256_castps_si256(_mm256_mul_ps(wv, _mm256_loadu_ps(x + i))));
        const __m256i hi =
            bf16_bits(_mm256_castps_si256(_mm256_mul_ps(wv, _mm256_loadu_ps(x + i + 8))));
        const __m256i packed =
            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    }
    for (; i < n; ++i) dst[i] = bf16_from_float(w * x[i]);
}

void bf16_round_range(float* out, const float* in, size_t n) {
    size_t i = 0;
    if (out == in) {
        // In place, most values are often rounded already (the weights the optimizer wrote
        // back): store only the vectors that change, so the rest of the memory stays clean and
        // the pass costs a read.
        for (; i + 8 <= n; i += 8) {
            const __m256i x = load8(in + i);
            const __m256i r = _mm256_slli_epi32(bf16_bits(x), 16);
            if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(r, x)) != -1)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256i r = _mm256_slli_epi32(bf16_bits(load8(in + i)), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
    }
    for (; i < n; ++i) out[i] = bf16_to_float(bf16_from_float(in[i]));
}

void zero_stream(float* x, size_t n) {
    // up to the first 32-byte boundary by plain stores, then streamed
    const size_t head = std::min(n, (32 - reinterpret_cast<uintptr_t>(x) % 32) % 32 / 4);
    generic::zero_range(x, head);
    size_t i       = head;
    const __m256 z = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(x + i, z);
    generic::zero_range(x + i, n - i);
    _mm_sfence();
}

void bf16_round_stream(float* out, const float* in, size_t n) {
    // up to the first 32-byte boundary of out as bf16_round_range, then streamed
    const size_t head = std::min(n, (32 - reinterpret_cast<uintptr_t>(out) % 32) % 32 / 4);
    bf16_round_range(out, in, head);
    size_t i = head;
    for (; i + 8 <= n; i += 8) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm256_slli_epi32(bf16_bits(load8(in + i)), 16));
    }
    bf16_round_range(out + i, in + i, n - i);
    _mm_sfence();
}

void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(o + i);
        if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + i));
        const __m256i h = bf16_bits(_mm256_castps_si256(x));  // in each lane's low 16 bits
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm256_slli_epi32(h, 16));
        if (half) {
            const __m128i p =
                _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i), p);
        }
    }
    generic::bf16_bias_round(o + i, bias ? bias + i : nullptr, half ? half + i : nullptr, n - i);
}

void bf16_widen_range(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, bf16_widen8(in + i));
    for (; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace bagualu::kernels::avx2

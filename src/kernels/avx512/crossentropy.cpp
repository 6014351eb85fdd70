// AVX-512 softmax cross-entropy rows (kernels/ops_avx512.h): bitwise the AVX2 rows
// (kernels/avx2/crossentropy.cpp). The AVX2 rows sum the exponentials of a row in two 4-lane
// double accumulators (columns 8t .. 8t+3 and 8t+4 .. 8t+7 of each 8-column block t, blocks in
// order) and add the two pairwise at the end. Here one 8-lane accumulator holds both (lanes 0-3
// and 4-7) and takes a 16-column vector as its two blocks one after the other, so every lane adds
// the same values in the same order; exp is avx512::exp_ps, lane for lane avx2::exp_ps. A row's
// last V % 8 columns are one masked block whose missing lanes read as -inf (exp 0, as in AVX2).
// The unmasked AVX-512 intrinsics are written as their all-ones maskz forms (kernels/avx512/exp.h).
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512/exp.h"
#include "kernels/crossentropy_rows.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

inline float hmax(__m512 v) {
    const __m256 h = _mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                                   _mm512_maskz_extractf32x8_ps(0xff, v, 1));
    __m128 m       = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    m              = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m              = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// The AVX2 rows' hsum(s0 + s1) of the accumulator's two halves.
inline double hsum_halves(__m512d acc) {
    const __m256d s  = _mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xff, acc, 0),
                                     _mm512_maskz_extractf64x4_pd(0xff, acc, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

// acc + the 8 columns of e's half h (0: lanes 0-7, 1: lanes 8-15), widened to double.
inline __m512d add_block(__m512d acc, __m512 e, int h) {
    const __m256 b = h == 0 ? _mm512_maskz_extractf32x8_ps(0xff, e, 0)
                            : _mm512_maskz_extractf32x8_ps(0xff, e, 1);
    return _mm512_add_pd(acc, _mm512_maskz_cvtps_pd(0xff, b));
}

// log(sum_j exp(x_j)) of one row of V >= 1 values.
double row_logsumexp(const float* x, int V) {
    const int v8 = V & ~7, v16 = V & ~15;
    const __mmask16 tail = static_cast<__mmask16>((1u << (V - v8)) - 1u);
    const __m512 ninf    = _mm512_set1_ps(-__builtin_inff());
    // The last block's missing lanes (and lanes 8-15) read as -inf: no change to max or sum;
    // so do the upper 8 lanes of the 8-column block between the vectors and the last block.
    const __m512 xt = _mm512_mask_loadu_ps(ninf, tail, x + v8);
    const __m512 xb = _mm512_mask_loadu_ps(ninf, v16 < v8 ? 0xff : 0, x + v16);
    __m512 m        = _mm512_maskz_max_ps(kAll, xt, xb);
    for (int j = 0; j < v16; j += 16) m = _mm512_maskz_max_ps(kAll, m, _mm512_loadu_ps(x + j));
    const float mx  = hmax(m);
    const __m512 mv = _mm512_set1_ps(mx);
    __m512d acc     = _mm512_setzero_pd();
    for (int j = 0; j < v16; j += 16) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
        acc            = add_block(acc, e, 0);
        acc            = add_block(acc, e, 1);
    }
    if (v16 < v8) {
        const __m512 e = exp_ps(_mm512_sub_ps(xb, mv));
        acc            = add_block(acc, e, 0);
    }
    if (v8 < V) {
        const __m512 e = exp_ps(_mm512_sub_ps(xt, mv));
        acc            = add_block(acc, e, 0);
    }
    return double(mx) + __builtin_log(hsum_halves(acc));
}

}  // namespace

void crossentropy_forward_rows(float* losses, const float* logits, const int32_t* targets,
                               int64_t begin, int64_t end, int V, float* lse) {
    crossentropy_forward_rows_of<row_logsumexp>(losses, logits, targets, begin, end, V, lse);
}

void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V,
                                const float* lse) {
    // dlogits may alias logits: each vector is loaded before it is stored.
    const int v16        = V & ~15;
    const __mmask16 tail = static_cast<__mmask16>((1u << (V - v16)) - 1u);
    const auto exp1      = [](float v) { return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(v))); };
    const auto row       = [&](float* d, const float* x, float l, float dl) {
        const __m512 lv = _mm512_set1_ps(l), dv = _mm512_set1_ps(dl);
        for (int j = 0; j < v16; j += 16) {
            const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), lv));
            _mm512_storeu_ps(d + j, _mm512_mul_ps(e, dv));
        }
        if (v16 < V) {
            const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + v16), lv));
            _mm512_mask_storeu_ps(d + v16, tail, _mm512_mul_ps(e, dv));
        }
    };
    crossentropy_backward_rows_of<row_logsumexp>(dlogits, logits, targets, dlosses, begin, end, V,
                                                 lse, exp1, row);
}

}  // namespace bagualu::kernels::avx512

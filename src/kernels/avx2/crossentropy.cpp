// AVX2/FMA softmax cross-entropy rows (kernels/ops_avx2.h): per row, the max and the sum of
// exponentials (in double, 8 lanes then pairwise) over whole ymm registers, the last V % 8
// columns through masked loads and stores. One row's sums have one fixed order. Internal
// linkage and no library templates, as in attention.cpp.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx2/exp.h"
#include "kernels/crossentropy_rows.h"
#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {

namespace {

// All ones in lanes [0, n), n in [0, 8].
inline __m256i first_lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m        = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m        = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

inline double hsum(__m256d v) {
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// Adds the 8 floats of e to the two double accumulators.
inline void add_f64(__m256d& lo, __m256d& hi, __m256 e) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

// log(sum_j exp(x_j)) of one row of V >= 1 values.
double row_logsumexp(const float* x, int V) {
    const int v8       = V & ~7;
    const __m256i tail = first_lanes(V - v8);
    const __m256 ninf  = _mm256_set1_ps(-__builtin_inff());
    // The tail's missing lanes read as -inf: they change neither the max nor the sum.
    const __m256 xt =
        _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + v8, tail), _mm256_castsi256_ps(tail));
    __m256 m = xt;
    for (int j = 0; j < v8; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
    const float mx  = hmax(m);
    const __m256 mv = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int j = 0; j < v8; j += 8)
        add_f64(s0, s1, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    if (v8 < V) add_f64(s0, s1, exp_ps(_mm256_sub_ps(xt, mv)));
    return double(mx) + __builtin_log(hsum(_mm256_add_pd(s0, s1)));
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
    const int v8       = V & ~7;
    const __m256i tail = first_lanes(V - v8);
    const auto exp1    = [](float v) { return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(v))); };
    const auto row     = [&](float* d, const float* x, float l, float dl) {
        const __m256 lv = _mm256_set1_ps(l), dv = _mm256_set1_ps(dl);
        for (int j = 0; j < v8; j += 8) {
            const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), lv));
            _mm256_storeu_ps(d + j, _mm256_mul_ps(e, dv));
        }
        if (v8 < V) {
            const __m256 e = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + v8, tail), lv));
            _mm256_maskstore_ps(d + v8, tail, _mm256_mul_ps(e, dv));
        }
    };
    crossentropy_backward_rows_of<row_logsumexp>(dlogits, logits, targets, dlosses, begin, end, V,
                                                 lse, exp1, row);
}

}  // namespace bagualu::kernels::avx2

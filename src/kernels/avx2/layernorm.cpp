// AVX2 layernorm items (kernels/ops_avx2.h): the operations of generic layernorm_forward /
// layernorm_backward (ops.cpp) in the same order, so every result is bitwise the generic one.
// Row sums in double keep sum_f64's four lanes (lane l takes elements l, l + 4, ...; the last
// C % 4 go to lanes 0, 1, 2; lanes combined as (0 + 2) + (1 + 3)) as one ymm of doubles; the
// elementwise float parts run 8 per step; column sums are per column, so the lanes are columns.
// Built with -ffp-contract=off (CMakeLists.txt): no multiply-add is fused. Internal linkage and
// no library templates, as in attention.cpp.
#include <immintrin.h>

#include <cstdint>

#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {

namespace {

// sum_f64 of ops.cpp over c in [0, C): the terms of x[c .. c + 3] as f(their doubles, c) on
// four lanes, those of the last C % 4 as g(double(x[c]), c), f's scalar twin.
template <typename F, typename G>
inline double sum4(const float* x, int C, F f, G g) {
    __m256d acc = _mm256_setzero_pd();
    int c       = 0;
    for (; c + 4 <= C; c += 4) acc = _mm256_add_pd(acc, f(_mm256_cvtps_pd(_mm_loadu_ps(x + c)), c));
    alignas(32) double lane[4];
    _mm256_store_pd(lane, acc);
    for (; c < C; ++c) lane[c - (C & ~3)] += g(double(x[c]), c);
    return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

}  // namespace

void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t begin, int64_t end,
                            int C) {
    for (int64_t i = begin; i < end; ++i) {
        const float* x     = inp + i * C;
        float* o           = out + i * C;
        const auto value4  = [](__m256d v, int) { return v; };
        const auto value1  = [](double v, int) { return v; };
        const double m     = sum4(x, C, value4, value1) / C;
        const __m256d mv   = _mm256_set1_pd(m);
        const auto sq_dev4 = [&](__m256d v, int) {
            const __m256d d = _mm256_sub_pd(v, mv);
            return _mm256_mul_pd(d, d);
        };
        const auto sq_dev1 = [&](double v, int) {
            const double d = v - m;
            return d * d;
        };
        const double var = sum4(x, C, sq_dev4, sq_dev1) / C;
        const double s   = 1.0 / __builtin_sqrt(var + 1e-5);
        const float mf   = float(m);
        const float sf   = float(s);
        const __m256 m8 = _mm256_set1_ps(mf), s8 = _mm256_set1_ps(sf);
        int c = 0;
        for (; c + 8 <= C; c += 8) {
            const __m256 xn = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), m8), s8);
            _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_mul_ps(xn, _mm256_loadu_ps(weight + c)),
                                                  _mm256_loadu_ps(bias + c)));
        }
        for (; c < C; ++c) o[c] = (x[c] - mf) * sf * weight[c] + bias[c];
        mean[i] = mf;
        rstd[i] = sf;
    }
}

void layernorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, int64_t begin, int64_t end,
                             int C) {
    for (int64_t i = begin; i < end; ++i) {
        const float* x  = inp + i * C;
        const float* dy = dout + i * C;
        float* dx       = dinp + i * C;
        const float m = mean[i], s = rstd[i];
        const __m256 m8 = _mm256_set1_ps(m), s8 = _mm256_set1_ps(s);
        const __m128 m4 = _mm_set1_ps(m), s4 = _mm_set1_ps(s);
        // dnorm = double(w) double(dy), summed over the row as sum_f64 does.
        const auto dnorm4 = [&](__m256d d, int c) {
            return _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(weight + c)), d);
        };
        const auto dnorm1       = [&](double d, int c) { return double(weight[c]) * d; };
        const double dnorm_mean = sum4(dy, C, dnorm4, dnorm1) / C;
        // dnorm * double((x - m) s): the float normalisation first, then double products.
        double lane[4] = {0.0, 0.0, 0.0, 0.0};
        __m256d acc    = _mm256_setzero_pd();
        int c          = 0;
        for (; c + 4 <= C; c += 4) {
            const __m128 xn     = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + c), m4), s4);
            const __m256d dnorm = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(weight + c)),
                                                _mm256_cvtps_pd(_mm_loadu_ps(dy + c)));
            acc                 = _mm256_add_pd(acc, _mm256_mul_pd(dnorm, _mm256_cvtps_pd(xn)));
        }
        _mm256_storeu_pd(lane, acc);
        for (; c < C; ++c) {
            lane[c - (C & ~3)] += double(weight[c]) * double(dy[c]) * double((x[c] - m) * s);
        }
        const double dnorm_norm_mean = ((lane[0] + lane[2]) + (lane[1] + lane[3])) / C;
        const float a                = float(dnorm_mean);
        const float b                = float(dnorm_norm_mean);
        const __m256 a8 = _mm256_set1_ps(a), b8 = _mm256_set1_ps(b);
        c = 0;
        for (; c + 8 <= C; c += 8) {
            const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), m8), s8);
            const __m256 wdy  = _mm256_mul_ps(_mm256_loadu_ps(weight + c), _mm256_loadu_ps(dy + c));
            const __m256 g =
                _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(wdy, a8), _mm256_mul_ps(norm, b8)), s8);
            _mm256_storeu_ps(dx + c, _mm256_add_ps(_mm256_loadu_ps(dx + c), g));
        }
        for (; c < C; ++c) {
            const float norm = (x[c] - m) * s;
            dx[c] += (weight[c] * dy[c] - a - norm * b) * s;
        }
    }
}

void layernorm_backward_cols(float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C, int64_t c0,
                             int64_t c1, double* scratch) {
    const int64_t w = c1 - c0;
    double* aw      = scratch;
    double* ab      = scratch + w;
    for (int64_t c = 0; c < 2 * w; ++c) scratch[c] = 0.0;
    for (int64_t i = 0; i < N; ++i) {
        const float* x  = inp + i * C + c0;
        const float* dy = dout + i * C + c0;
        const float m = mean[i], s = rstd[i];
        const __m128 m4 = _mm_set1_ps(m), s4 = _mm_set1_ps(s);
        int64_t c = 0;
        for (; c + 4 <= w; c += 4) {
            const __m256d xn = _mm256_cvtps_pd(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + c), m4), s4));
            const __m256d dyd = _mm256_cvtps_pd(_mm_loadu_ps(dy + c));
            _mm256_storeu_pd(aw + c,
                             _mm256_add_pd(_mm256_loadu_pd(aw + c), _mm256_mul_pd(xn, dyd)));
            _mm256_storeu_pd(ab + c, _mm256_add_pd(_mm256_loadu_pd(ab + c), dyd));
        }
        for (; c < w; ++c) {
            aw[c] += double((x[c] - m) * s) * double(dy[c]);
            ab[c] += double(dy[c]);
        }
    }
    for (int64_t c = 0; c < w; ++c) {
        dweight[c0 + c] = float(double(dweight[c0 + c]) + aw[c]);
        dbias[c0 + c]   = float(double(dbias[c0 + c]) + ab[c]);
    }
}

}  // namespace bagualu::kernels::avx2

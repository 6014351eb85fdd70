// Row sums in double and the combine's gradient rows with AVX2 (kernels/ops_avx2.h), the same
// operations in the same order as the generic loops of kernels/ops.cpp, so the same bits:
// - col_sums_f64 keeps up to 32 columns' sums in eight registers while the rows stream by (the
//   generic loop, compiled for any x86-64, reloads and stores its sums every row);
// - scaled_rows_and_dots runs four rows at once, one register of four partial sums each: the
//   generic loop's single chain of dependent adds per row ran at the adds' latency.
#include <immintrin.h>

#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {

namespace {

// Sums of columns [0, 4 V) of rows [0, n) onto s, V registers of four doubles.
template <int V>
void col_block(double* s, const float* x, int64_t n, int64_t ld) {
    __m256d acc[V];
    for (int v = 0; v < V; ++v) acc[v] = _mm256_loadu_pd(s + 4 * v);
    for (int64_t r = 0; r < n; ++r) {
        const float* row = x + r * ld;
        for (int v = 0; v < V; ++v)
            acc[v] = _mm256_add_pd(acc[v], _mm256_cvtps_pd(_mm_loadu_ps(row + 4 * v)));
    }
    for (int v = 0; v < V; ++v) _mm256_storeu_pd(s + 4 * v, acc[v]);
}

}  // namespace

void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w) {
    int c = 0;
    for (; c + 32 <= w; c += 32) col_block<8>(s + c, x + c, n, ld);
    if (c + 16 <= w) {
        col_block<4>(s + c, x + c, n, ld);
        c += 16;
    }
    for (; c + 4 <= w; c += 4) col_block<1>(s + c, x + c, n, ld);
    if (c == w) return;
    for (int64_t r = 0; r < n; ++r) {
        const float* row = x + r * ld;
        for (int i = c; i < w; ++i) s[i] += double(row[i]);
    }
}

void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C) {
    constexpr int kRows = 4;
    const int C4        = C / 4 * 4;
    for (int j0 = 0; j0 < n; j0 += kRows) {
        const int m = n - j0 < kRows ? n - j0 : kRows;
        // a group short of four rows repeats its first row's work in the spare registers and
        // stores only its own rows
        float* o[kRows];
        const float* v[kRows];
        __m128 wv[kRows];
        __m256d acc[kRows];
        for (int i = 0; i < kRows; ++i) {
            const int j = j0 + (i < m ? i : 0);
            o[i]        = dy[j];
            v[i]        = y[j];
            wv[i]       = _mm_set1_ps(w[j]);
            acc[i]      = _mm256_setzero_pd();
        }
        for (int c = 0; c < C4; c += 4) {
            const __m128 dv  = _mm_loadu_ps(d + c);
            const __m256d dd = _mm256_cvtps_pd(dv);
            for (int i = 0; i < kRows; ++i) {
                const __m256d p = _mm256_mul_pd(dd, _mm256_cvtps_pd(_mm_loadu_ps(v[i] + c)));
                acc[i]          = _mm256_add_pd(acc[i], p);
                if (i < m) _mm_storeu_ps(o[i] + c, _mm_mul_ps(wv[i], dv));
            }
        }
        for (int i = 0; i < m; ++i) {
            alignas(32) double s[4];
            _mm256_store_pd(s, acc[i]);
            for (int c = C4; c < C; ++c) {
                s[c & 3] += double(d[c]) * double(v[i][c]);
                o[i][c] = w[j0 + i] * d[c];
            }
            dots[j0 + i] = float((s[0] + s[1]) + (s[2] + s[3]));
        }
    }
}

}  // namespace bagualu::kernels::avx2

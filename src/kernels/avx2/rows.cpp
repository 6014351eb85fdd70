// Row sums in double and the combine's gradient rows with AVX2 (kernels/ops_avx2.h), the same
// operations in the same order as the generic loops of kernels/ops.cpp, so the same bits:
// - col_sums_f64 keeps up to 32 columns' sums in eight registers while a chunk of rows streams
//   by (the generic loop, compiled for any x86-64, reloads and stores its sums every row), and
//   col_sums_f64_bf16 the same of bf16 rows;
// - scaled_rows_and_dots runs four rows at once, one register of four partial sums each: the
//   generic loop's single chain of dependent adds per row ran at the adds' latency.
// - rank_rows counts, for every score, the scores ranked above it, 8 at a time, instead of the
//   generic insertion's data-dependent branches (kernels/ops.h; the same indices).
#include <immintrin.h>

#include <vector>

#include "core/dtype.h"
#include "kernels/ops_avx2.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels::avx2 {

namespace {

// Four values of a row as doubles: floats, or bf16 widened to floats (their bits shifted up).
inline __m256d four(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
inline __m256d four(const uint16_t* p) {
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
}
inline double one(float v) { return double(v); }
inline double one(uint16_t v) { return double(bf16_to_float(v)); }

// Sums of columns [0, 4 V) of rows [0, n) onto s, V registers of four doubles.
template <int V, typename T>
void col_block(double* s, const T* x, int64_t n, int64_t ld) {
    __m256d acc[V];
    for (int v = 0; v < V; ++v) acc[v] = _mm256_loadu_pd(s + 4 * v);
    for (int64_t r = 0; r < n; ++r) {
        const T* row = x + r * ld;
        for (int v = 0; v < V; ++v) acc[v] = _mm256_add_pd(acc[v], four(row + 4 * v));
    }
    for (int v = 0; v < V; ++v) _mm256_storeu_pd(s + 4 * v, acc[v]);
}

// Columns [0, w) of rows [0, n) onto s, a block of 32 columns after another.
template <typename T>
void col_sums_rows(double* s, const T* x, int64_t n, int64_t ld, int w) {
    int c = 0;
    for (; c + 32 <= w; c += 32) col_block<8>(s + c, x + c, n, ld);
    if (c + 16 <= w) {
        col_block<4>(s + c, x + c, n, ld);
        c += 16;
    }
    for (; c + 4 <= w; c += 4) col_block<1>(s + c, x + c, n, ld);
    if (c == w) return;
    for (int64_t r = 0; r < n; ++r) {
        const T* row = x + r * ld;
        for (int i = c; i < w; ++i) s[i] += one(row[i]);
    }
}

// Rows summed a chunk at a time, every column block over the chunk before the next chunk: each
// row is read along its lines while the chunk's rows stream, where whole passes over all rows a
// block at a time read one line of every row per pass (1,024 rows of 1,536 bf16 from L3, one
// thread: 2.4-2.7x faster in chunks of 4-64 rows). Each column's sum still adds the rows in
// order, so the bits are those of one pass.
constexpr int64_t kRowChunk = 16;

template <typename T>
void col_sums(double* s, const T* x, int64_t n, int64_t ld, int w) {
    for (int64_t r0 = 0; r0 < n; r0 += kRowChunk)
        col_sums_rows(s, x + r0 * ld, n - r0 < kRowChunk ? n - r0 : kRowChunk, ld, w);
}

}  // namespace

void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w) {
    col_sums(s, x, n, ld, w);
}

void col_sums_f64_bf16(double* s, const uint16_t* x, int64_t n, int64_t ld, int w) {
    col_sums(s, x, n, ld, w);
}

namespace {

// scaled_rows_and_dots, with Store false the dots only (dy unused); y: float rows, or the bits of
// bf16 rows (their values widened exactly).
template <bool Store, typename T>
void scaled_rows_and_dots_impl(float* const* dy, float* dots, const float* w, const float* d,
                               const T* const* y, int n, int C) {
    constexpr int kRows = 4;
    const int C4        = C / 4 * 4;
    for (int j0 = 0; j0 < n; j0 += kRows) {
        const int m = n - j0 < kRows ? n - j0 : kRows;
        // a group short of four rows repeats its first row's work in the spare registers and
        // stores only its own rows
        float* o[kRows];
        const T* v[kRows];
        __m128 wv[kRows];
        __m256d acc[kRows];
        for (int i = 0; i < kRows; ++i) {
            const int j = j0 + (i < m ? i : 0);
            o[i]        = Store ? dy[j] : nullptr;
            v[i]        = y[j];
            wv[i]       = _mm_set1_ps(w[j]);
            acc[i]      = _mm256_setzero_pd();
        }
        for (int c = 0; c < C4; c += 4) {
            const __m128 dv  = _mm_loadu_ps(d + c);
            const __m256d dd = _mm256_cvtps_pd(dv);
            for (int i = 0; i < kRows; ++i) {
                const __m256d p = _mm256_mul_pd(dd, four(v[i] + c));
                acc[i]          = _mm256_add_pd(acc[i], p);
                if (Store && i < m) _mm_storeu_ps(o[i] + c, _mm_mul_ps(wv[i], dv));
            }
        }
        for (int i = 0; i < m; ++i) {
            alignas(32) double s[4];
            _mm256_store_pd(s, acc[i]);
            for (int c = C4; c < C; ++c) {
                s[c & 3] += double(d[c]) * one(v[i][c]);
                if (Store) o[i][c] = w[j0 + i] * d[c];
            }
            dots[j0 + i] = float((s[0] + s[1]) + (s[2] + s[3]));
        }
    }
}

// With rows to write (dy) or the dots only.
template <typename T>
void rows_and_dots(float* const* dy, float* dots, const float* w, const float* d, const T* const* y,
                   int n, int C) {
    if (dy) {
        scaled_rows_and_dots_impl<true>(dy, dots, w, d, y, n, C);
    } else {
        scaled_rows_and_dots_impl<false>(dy, dots, w, d, y, n, C);
    }
}

}  // namespace

void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C) {
    rows_and_dots(dy, dots, w, d, y, n, C);
}

void scaled_rows_and_dots_bf16(float* const* dy, float* dots, const float* w, const float* d,
                               const uint16_t* const* y, int n, int C) {
    rows_and_dots(dy, dots, w, d, y, n, C);
}

void weighted_row_sum(float* o, const float* w, const float* const* y, int n, int C) {
    // 32 columns at a time in four registers across the rows, then the last ones one by one:
    // per element the generic kernel's adds in its order (mul and add kept apart: this file is
    // built without FMA contraction)
    int c = 0;
    for (; c + 32 <= C; c += 32) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        for (int j = 0; j < n; ++j) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            for (int v = 0; v < 4; ++v) {
                acc[v] =
                    _mm256_add_ps(acc[v], _mm256_mul_ps(wj, _mm256_loadu_ps(y[j] + c + 8 * v)));
            }
        }
        for (int v = 0; v < 4; ++v) _mm256_storeu_ps(o + c + 8 * v, acc[v]);
    }
    for (; c < C; ++c) {
        float s = 0.0f;
        for (int j = 0; j < n; ++j) s += w[j] * y[j][c];
        o[c] = s;
    }
}

void bias_add(float* o, const float* bias, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), _mm256_loadu_ps(bias + i)));
    generic::bias_add(o + i, bias + i, n - i);
}

void add_row_sum(float* o, const float* const* y, int n, int C) {
    int c = 0;
    for (; c + 32 <= C; c += 32) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        for (int j = 0; j < n; ++j) {
            for (int v = 0; v < 4; ++v)
                acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(y[j] + c + 8 * v));
        }
        for (int v = 0; v < 4; ++v)
            _mm256_storeu_ps(o + c + 8 * v, _mm256_add_ps(_mm256_loadu_ps(o + c + 8 * v), acc[v]));
    }
    for (; c < C; ++c) {
        float s = 0.0f;
        for (int j = 0; j < n; ++j) s += y[j][c];
        o[c] += s;
    }
}

namespace {

// Scores v[0, n) padded with -inf to whole vectors: t[place] = ids[i] (or i) for every score i
// whose place, the number of scores ranked above it, is below R.
void place_by_count(int32_t* t, const float* v, int n, int R, const int32_t* ids) {
    const int np = (n + 7) / 8 * 8;
    for (int i = 0; i < n; ++i) {
        const __m256 s = _mm256_set1_ps(v[i]);
        const int ib   = i / 8 * 8;  // the vector holding i
        int above      = 0;
        int j          = 0;
        // before i's vector: larger or equal; every 8 vectors, stop once past the R-th place
        for (; j < ib; j += 8) {
            above += __builtin_popcount(static_cast<unsigned>(
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + j), s, _CMP_GE_OQ))));
            if ((j & 63) == 56 && above >= R) break;
        }
        if (above >= R) continue;
        {
            const __m256 w = _mm256_loadu_ps(v + ib);
            const auto ge =
                static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(w, s, _CMP_GE_OQ)));
            const auto gt =
                static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(w, s, _CMP_GT_OQ)));
            const unsigned low = (1u << (i - ib)) - 1u;  // lanes before i
            above += __builtin_popcount((ge & low) | (gt & ~low));
        }
        for (j = ib + 8; j < np; j += 8) {
            above += __builtin_popcount(static_cast<unsigned>(
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + j), s, _CMP_GT_OQ))));
            if ((j & 63) == 56 && above >= R) break;
        }
        if (above < R) t[above] = ids ? ids[i] : i;
    }
}

}  // namespace

void rank_rows(int32_t* top, const float* x, int64_t n, int E, int R) {
    // A score's place is the number of scores ranked above it: those larger, and those equal at a
    // lower index (the generic insertion's stable order). The row is copied padded to whole
    // vectors with -inf, which is never larger than a score and lies above every index.
    // For a short ranking (R <= 32) of a longer row, only the candidates are placed: the scores
    // at or above tau, the least of G * 8 maxima over disjoint sets of the row (lane l of
    // accumulator g: vectors g, g + G, ...), G * 8 >= R. Those are G * 8 distinct scores >= tau,
    // so the R-th largest is >= tau, and every score below tau is ranked below every candidate.
    // Counting costs about n^2 / 8 comparisons for n scores placed, the insertion about E R: a row
    // longer than kMaxCount with a long ranking, or whose candidates are more than kMaxCount (many
    // scores tied at tau, as when the gate's weights are all equal), is ranked by the insertion.
    constexpr int kMaxAcc = 4, kMaxCount = 256;
    const int EP      = (E + 7) / 8 * 8;
    const int G       = (R + 7) / 8;
    const bool filter = G <= kMaxAcc && 2 * G * 8 <= EP;
    if (!filter && E > kMaxCount) {
        generic::rank_rows(top, x, n, E, R);
        return;
    }
    thread_local std::vector<float> row, cand;
    thread_local std::vector<int32_t> ids;
    if (row.size() < static_cast<size_t>(EP)) {
        row.resize(static_cast<size_t>(EP));
        cand.resize(static_cast<size_t>(EP));
        ids.resize(static_cast<size_t>(EP));
    }
    float* l = row.data();
    for (int e = E; e < EP; ++e) l[e] = -__builtin_inff();
    for (int64_t r = 0; r < n; ++r) {
        const float* src = x + r * E;
        int32_t* t       = top + r * R;
        __m256 nan       = _mm256_setzero_ps();
        int e            = 0;
        for (; e + 8 <= E; e += 8) {
            const __m256 v = _mm256_loadu_ps(src + e);
            nan            = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            _mm256_storeu_ps(l + e, v);
        }
        bool has_nan = _mm256_movemask_ps(nan) != 0;
        for (; e < E; ++e) {
            l[e]    = src[e];
            has_nan = has_nan || src[e] != src[e];
        }
        if (has_nan) {
            generic::rank_rows(t, src, 1, E, R);
            continue;
        }
        if (!filter) {
            place_by_count(t, l, E, R, nullptr);
            continue;
        }
        __m256 acc[kMaxAcc];
        for (int g = 0; g < G; ++g) acc[g] = _mm256_set1_ps(-__builtin_inff());
        for (int j = 0, g = 0; j < EP; j += 8, g = g + 1 == G ? 0 : g + 1)
            acc[g] = _mm256_max_ps(acc[g], _mm256_loadu_ps(l + j));
        __m256 lo = acc[0];
        for (int g = 1; g < G; ++g) lo = _mm256_min_ps(lo, acc[g]);
        lo               = _mm256_min_ps(lo, _mm256_permute2f128_ps(lo, lo, 1));
        lo               = _mm256_min_ps(lo, _mm256_shuffle_ps(lo, lo, _MM_SHUFFLE(1, 0, 3, 2)));
        lo               = _mm256_min_ps(lo, _mm256_shuffle_ps(lo, lo, _MM_SHUFFLE(2, 3, 0, 1)));
        const __m256 tau = lo;  // tau in every lane
        float* cv        = cand.data();
        int32_t* ci      = ids.data();
        int c            = 0;
        for (int j = 0; j < EP; j += 8) {
            auto m = static_cast<unsigned>(
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + j), tau, _CMP_GE_OQ)));
            for (; m != 0; m &= m - 1) {
                const int k = j + __builtin_ctz(m);
                if (k >= E) break;  // padding (-inf), when tau is -inf
                cv[c]   = l[k];
                ci[c++] = k;
            }
        }
        if (c > kMaxCount) {
            generic::rank_rows(t, src, 1, E, R);
            continue;
        }
        for (int k = c; k < (c + 7) / 8 * 8; ++k) cv[k] = -__builtin_inff();
        place_by_count(t, cv, c, R, ci);
    }
}

}  // namespace bagualu::kernels::avx2

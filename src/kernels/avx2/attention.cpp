// AVX2/FMA causal attention (kernels/ops_avx2.h): the items of kernels/attention_items.h on
// 8-float registers, two per 16-row query block. Everything here but the entry points has
// internal linkage and no library templates are instantiated, so no code built for AVX2 can
// stand in for a portable copy at link time.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_items.h"
#include "kernels/avx2/exp.h"
#include "kernels/ops_avx2.h"

namespace bagualu::kernels::avx2 {

namespace {

static_assert(kAttentionQueryBlock == attn::kQB);

struct V8 {
    using reg                       = __m256;
    static constexpr int width      = 8;
    static constexpr int score_keys = 6;  // 12 accumulators
    static constexpr int col_vecs   = 2;  // 8 accumulators of a weighted tile
    static reg zero() { return _mm256_setzero_ps(); }
    static reg load(const float* p) { return _mm256_load_ps(p); }
    static void store(float* p, reg x) { _mm256_store_ps(p, x); }
    static reg loadu(const float* p) { return _mm256_loadu_ps(p); }
    static void storeu(float* p, reg x) { _mm256_storeu_ps(p, x); }
    static reg set1(float x) { return _mm256_set1_ps(x); }
    static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
    static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
    static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
    static reg exp(reg x) { return exp_ps(x); }
    static void widen_add(double* s, reg p) {
        _mm256_storeu_pd(
            s, _mm256_add_pd(_mm256_loadu_pd(s), _mm256_cvtps_pd(_mm256_castps256_ps128(p))));
        _mm256_storeu_pd(s + 4, _mm256_add_pd(_mm256_loadu_pd(s + 4),
                                              _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1))));
    }
};

}  // namespace

size_t attention_forward_scratch(int T, int hs) { return attn::forward_scratch(T, hs); }

void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch) {
    attn::forward_items<V8>(out, lse, qkv, T, C, NH, begin, end, scratch);
}

size_t attention_backward_scratch(int T, int hs) { return attn::backward_scratch(T, hs); }

void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch) {
    attn::backward_items<V8>(dqkv, dout, qkv, out, lse, T, C, NH, begin, end, scratch);
}

}  // namespace bagualu::kernels::avx2

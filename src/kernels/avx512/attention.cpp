// AVX-512 causal attention (kernels/ops_avx512.h): the items of kernels/attention_items.h on
// 16-float registers, one per 16-row query block, for head sizes that are a multiple of 16.
// Each output element is the same chain of operations as in the AVX2 kernel (the same FMAs in
// the same key or column order, the exponential's polynomial lane for lane, the sums in
// double), so the two give the same bits (OpsAvx512.AttentionIsBitwiseTheAvx2Kernel).
// The all-ones masked (maskz) forms below are the unmasked instructions: GCC 12 takes the
// unmasked intrinsics' undefined pass-through operand for an uninitialised read.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_items.h"
#include "kernels/avx512/exp.h"
#include "kernels/ops_avx2.h"
#include "kernels/ops_avx512.h"

namespace bagualu::kernels::avx512 {

namespace {

struct V16 {
    using reg                       = __m512;
    static constexpr int width      = 16;
    static constexpr int score_keys = 12;  // 12 accumulators
    static constexpr int col_vecs   = 4;   // 16 accumulators of a weighted tile
    static reg zero() { return _mm512_setzero_ps(); }
    static reg load(const float* p) { return _mm512_load_ps(p); }
    static void store(float* p, reg x) { _mm512_store_ps(p, x); }
    static reg loadu(const float* p) { return _mm512_loadu_ps(p); }
    static void storeu(float* p, reg x) { _mm512_storeu_ps(p, x); }
    static reg set1(float x) { return _mm512_set1_ps(x); }
    static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
    static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
    static reg max(reg a, reg b) { return _mm512_maskz_max_ps(kAll, a, b); }
    static reg exp(reg x) { return exp_ps(x); }
    static void widen_add(double* s, reg p) {
        const __m512d lo = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, p, 0));
        const __m512d hi = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, p, 1));
        _mm512_storeu_pd(s, _mm512_add_pd(_mm512_loadu_pd(s), lo));
        _mm512_storeu_pd(s + 8, _mm512_add_pd(_mm512_loadu_pd(s + 8), hi));
    }
};

}  // namespace

size_t attention_forward_scratch(int T, int hs) { return attn::forward_scratch(T, hs); }

void attention_forward_items(float* out, float* lse, const float* qkv, int T, int C, int NH,
                             int64_t begin, int64_t end, float* scratch) {
    attn::forward_items<V16>(out, lse, qkv, T, C, NH, begin, end, scratch);
}

size_t attention_backward_scratch(int T, int hs) { return attn::backward_scratch(T, hs); }

void attention_backward_items(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int T, int C, int NH, int64_t begin, int64_t end,
                              float* scratch) {
    attn::backward_items<V16>(dqkv, dout, qkv, out, lse, T, C, NH, begin, end, scratch);
}

}  // namespace bagualu::kernels::avx512

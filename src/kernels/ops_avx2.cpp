// Threaded drivers of the AVX2 items (kernels/ops_avx2.h). Built
// for any x86-64 like the rest of kernels/, so the library templates instantiated here
// (parallel_for, std::vector) are portable code; only the item functions in kernels/avx2/ use
// AVX2 instructions. Work splits and scratch are the ones the items document.
#include "kernels/ops_avx2.h"

#include <vector>

#include "core/error.h"
#include "kernels/ops_generic.h"
#include "kernels/parallel_rows.h"

namespace bagualu::kernels::avx2 {

void attention_forward_with(AttentionForwardItems items, AttentionScratch scratch_floats,
                            float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    // One item per (b, h, query block): see attention_forward_items.
    const int64_t nqb  = (T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
    const int64_t work = int64_t{kAttentionQueryBlock} * T * (C / NH);
    parallel_rows(int64_t{B} * NH * nqb, work, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> buf;
        float* scratch = grow(buf, scratch_floats(T, C / NH));
        items(out, lse, qkv, T, C, NH, begin, end, scratch);
    });
}

void attention_backward_with(AttentionBackwardItems items, AttentionScratch scratch_floats,
                             float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int C, int NH) {
    // One item per (b, h), so each head's dk, dv are summed on one thread in one order.
    parallel_rows(int64_t{B} * NH, int64_t{T} * T * (C / NH), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> buf;
        float* scratch = grow(buf, scratch_floats(T, C / NH));
        items(dqkv, dout, qkv, out, lse, T, C, NH, begin, end, scratch);
    });
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    if (!attention_shape_supported(C / NH)) {
        generic::attention_forward(out, lse, qkv, B, T, C, NH);
        return;
    }
    attention_forward_with(attention_forward_items, attention_forward_scratch, out, lse, qkv, B, T,
                           C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    if (!attention_shape_supported(C / NH)) {
        generic::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    attention_backward_with(attention_backward_items, attention_backward_scratch, dqkv, dout, qkv,
                            out, lse, B, T, C, NH);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
    parallel_rows(N, C, [&](int64_t begin, int64_t end) {
        layernorm_backward_rows(dinp, dout, inp, weight, mean, rstd, begin, end, C);
    });
    // The column split of the generic kernel; each column's sum runs over all rows in order.
    parallel_cols(C, N, [&](int64_t c0, int64_t c1) {
        thread_local std::vector<double> buf;
        double* scratch = grow(buf, size_t(2 * (c1 - c0)));
        layernorm_backward_cols(dweight, dbias, dout, inp, mean, rstd, N, C, c0, c1, scratch);
    });
}

}  // namespace bagualu::kernels::avx2

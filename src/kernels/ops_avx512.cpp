// Threaded drivers of the AVX-512 attention items (kernels/ops_avx512.h). Built for any x86-64
// like the rest of kernels/, so the library templates instantiated here are portable code; only
// the item functions in kernels/avx512/ use AVX-512 instructions. Each item (a head) is computed
// whole by one thread, so any split over threads gives the same bits.
#include "kernels/ops_avx512.h"

#include "core/error.h"
#include "kernels/ops_avx2.h"
#include "kernels/parallel_rows.h"

namespace bagualu::kernels::avx512 {

// The AVX2 drivers' threading and scratch (kernels/ops_avx2.cpp) over these items.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    if (!attention_shape_supported(C / NH)) {
        avx2::attention_forward(out, lse, qkv, B, T, C, NH);
        return;
    }
    avx2::attention_forward_with(attention_forward_items, attention_forward_scratch, out, lse, qkv,
                                 B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    if (!attention_shape_supported(C / NH)) {
        avx2::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    avx2::attention_backward_with(attention_backward_items, attention_backward_scratch, dqkv, dout,
                                  qkv, out, lse, B, T, C, NH);
}

namespace {

// items(begin, end, scratch) over the (batch, head) pairs on the compute pool, each thread with
// a scratch of scratch_floats(T, hs) floats.
template <typename Items>
void over_heads(int B, int T, int C, int NH, size_t (*scratch_floats)(int, int), Items&& items) {
    BGL_CHECK(NH > 0 && C % NH == 0 && attention_bf16_shape_supported(C / NH),
              "bf16 attention needs a head size that is a multiple of 32: C = {}, NH = {}", C, NH);
    parallel_rows(int64_t{B} * NH, int64_t{T} * T * (C / NH), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> buf;
        items(begin, end, grow(buf, scratch_floats(T, C / NH)));
    });
}

}  // namespace

void attention_forward_bf16(bool tiles, float* out, float* lse, const float* qkv, int B, int T,
                            int C, int NH) {
    over_heads(B, T, C, NH, attention_bf16_forward_scratch,
               [&](int64_t begin, int64_t end, float* scratch) {
                   attention_forward_items_bf16(tiles, out, lse, qkv, T, C, NH, begin, end,
                                                scratch);
               });
}

void attention_backward_bf16(bool tiles, float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int T, int C, int NH,
                             uint16_t* dqkv16) {
    over_heads(B, T, C, NH, attention_bf16_backward_scratch,
               [&](int64_t begin, int64_t end, float* scratch) {
                   attention_backward_items_bf16(tiles, dqkv, dqkv16, dout, qkv, out, lse, T, C, NH,
                                                 begin, end, scratch);
               });
}

void attention_forward_bf16(bool tiles, uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                            int T, int C, int NH) {
    over_heads(B, T, C, NH, attention_bf16_forward_scratch,
               [&](int64_t begin, int64_t end, float* scratch) {
                   attention_forward_items_bf16(tiles, out16, lse, qkv16, T, C, NH, begin, end,
                                                scratch);
               });
}

void attention_backward_bf16(bool tiles, uint16_t* dqkv16, const float* dout, const uint16_t* qkv16,
                             const uint16_t* out16, const float* lse, int B, int T, int C, int NH) {
    over_heads(B, T, C, NH, attention_bf16_backward_scratch,
               [&](int64_t begin, int64_t end, float* scratch) {
                   attention_backward_items_bf16(tiles, dqkv16, dout, qkv16, out16, lse, T, C, NH,
                                                 begin, end, scratch);
               });
}

}  // namespace bagualu::kernels::avx512

// The local experts of an MoE layer: expert e is an MLP  y = W2_e gelu(W1_e x + b1_e) + b2_e,
// applied to its contiguous block of rows [offsets[e], offsets[e+1]) of the permuted buffer.
// Experts with zero rows are skipped. C = d_model, F = the experts' width (model.expert_d_ff,
// else d_ff), E = number of local experts.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/mixed.h"

namespace bagualu::moe {

// Expert e's tensors are at base + e * stride (strides in floats).
template <typename P>
struct ExpertTensors {
    P* fc_w            = nullptr;  // (E, F, C)
    P* fc_b            = nullptr;  // (E, F)
    P* proj_w          = nullptr;  // (E, C, F)
    P* proj_b          = nullptr;  // (E, C)
    size_t fc_w_stride = 0, fc_b_stride = 0, proj_w_stride = 0, proj_b_stride = 0;
};
using ExpertWeights = ExpertTensors<const float>;
using ExpertGrads   = ExpertTensors<float>;

// Mixed precision of the experts (model/precision.h): GEMM operands are rounded to `gemm` (the
// caller passes x and the weights already rounded), GEMM outputs to `act`; fp64: the GELU in FP64.
struct ExpertPrecision {
    Dtype gemm = Dtype::float32, act = Dtype::float32;
    bool fp64 = false;
};

// y: (rows, C). h: the pre-activation (rows, F), saved for backward: float32, or 16 bits when
// prec.act is a half type (kernels::KeptArray). g: (rows, F) scratch for gelu(h),
// the second product's operand: not kept, backward computes it again from h (the same kernel
// on the same values, so the same bits), which saves a (rows, F) array per layer.
// x_rows: nullptr, x being the (rows, C) permuted rows; or (rows) the row of x (the tokens,
// unpermuted) each permuted row is, read in place by the first product (no permuted copy; the
// same bits).
// y16: nullptr, or (rows, C) that takes y's 16 bits as well (prec.act a half type), narrowed in
// the second product's epilogue while each rectangle of y is in cache.
void experts_forward(float* y, const kernels::KeptArray& h, float* g, const float* x,
                     const ExpertWeights& w, const int32_t* offsets, int E, int C, int F,
                     const ExpertPrecision& prec = {}, const int32_t* x_rows = nullptr,
                     uint16_t* y16 = nullptr);

// dx: (rows, C), overwritten. dh: (rows, F) scratch (it holds gelu(h) first, then its
// gradient). Parameter grads +=. dy is rounded to prec.gemm in place where the products take
// floats; where they convert their operands (kernels::half_products_convert) dy and dh's
// gradient are used only as their 16 bits (kernels::narrow_dout, gelu_backward_dout) and dy is
// left as it was.
// bias_acc: nullptr, or (E, F + C) doubles for a backward split over several calls (rounds):
// the bias gradients' double sums then continue in it (+=) instead of being added to dw, and
// experts_bias_grad_flush adds them once, so that the result is bitwise that of one call.
// x, x_rows: as forward's.
// dy_rows, dy_scale: nullptr, dy being the (rows, C) output gradient; or (rows) each, row r of
// the output gradient being dy_scale[r] times dy's row dy_rows[r] (the combine's gradient, read
// from the tokens' output gradient: moe/dispatch.h slot_probs), each product rounded once to
// float and then narrowed as the products' 16-bit operand (kernels::narrow_dout_rows): the same
// bits as from the scaled copy, which is never written. Only where experts_gather_dy(prec) (dy
// is then not modified).
void experts_backward(float* dx, float* dh, ExpertGrads& dw, float* dy, const float* x,
                      const kernels::KeptArray& h, const ExpertWeights& w, const int32_t* offsets,
                      int E, int C, int F, const ExpertPrecision& prec = {},
                      double* bias_acc = nullptr, const int32_t* x_rows = nullptr,
                      const int32_t* dy_rows = nullptr, const float* dy_scale = nullptr);

// Where the experts suit it (many experts, none large, the largest one's (rows, F) floats within
// half of L2), experts_forward and experts_backward run each expert's whole chain (its products,
// GELU and bias sums) on one thread of the pool, whole experts handed out to the threads as they
// come free, so that the expert's rows of h, g, dy, dg and dh stay in that thread's cache
// between its products instead of each product and pass reading them back from memory over all
// experts (docs/results.md: the 64 experts of 96 of a fine-grained model). In float32 with
// float32 outputs, and in bf16 where the products convert and pack the float weights themselves
// (the tokens are then narrowed once for all experts first). Bitwise what the passes over all
// experts give. experts_run_whole: whether they do for these rows. set_whole_experts, for tests
// and benchmarks: false always runs the passes over all experts.
bool experts_run_whole(const ExpertPrecision& prec, int E, const int32_t* offsets, int F);
void set_whole_experts(bool on);

// Whether experts_backward can read a gathered, scaled output gradient under prec: where its
// products convert their operands to 16 bits (kernels::half_products_convert), so that the
// output gradient is narrowed once, into its 16-bit copy, whose rows it forms from dout. (On
// float products the scaled rows would be packed twice and summed for the bias, each pass
// forming them again; that cost more than writing them once: docs/results.md.)
bool experts_gather_dy(const ExpertPrecision& prec);

// dw.fc_b, dw.proj_b += bias_acc (E, F + C) for the experts with had_rows[e] != 0, as one
// experts_backward call adds its sums.
void experts_bias_grad_flush(ExpertGrads& dw, const double* bias_acc, const uint8_t* had_rows,
                             int E, int C, int F);

}  // namespace bagualu::moe

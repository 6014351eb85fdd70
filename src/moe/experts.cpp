#include "moe/experts.h"

#include "kernels/ops.h"

namespace bagualu::moe {

using kernels::gelu_backward;
using kernels::gelu_forward;
using kernels::linear_backward;
using kernels::linear_forward;

void experts_forward(float* y, float* h, float* g, const float* x, const ExpertWeights& w,
                     const int32_t* offsets, int E, int C, int F) {
    for (int e = 0; e < E; ++e) {
        const int64_t off = offsets[e];
        const int     n   = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        linear_forward(h + off * F, x + off * C, w.fc_w + e * w.fc_w_stride,
                       w.fc_b + e * w.fc_b_stride, n, C, F);
    }
    const int64_t rows = offsets[E];
    gelu_forward(g, h, static_cast<size_t>(rows * F));
    for (int e = 0; e < E; ++e) {
        const int64_t off = offsets[e];
        const int     n   = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        linear_forward(y + off * C, g + off * F, w.proj_w + e * w.proj_w_stride,
                       w.proj_b + e * w.proj_b_stride, n, F, C);
    }
}

void experts_backward(float* dx, float* dh, ExpertGrads& dw, const float* dy, const float* x,
                      const float* h, const float* g, const ExpertWeights& w,
                      const int32_t* offsets, int E, int C, int F) {
    for (int e = 0; e < E; ++e) {
        const int64_t off = offsets[e];
        const int     n   = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        linear_backward(dh + off * F, dw.proj_w + e * dw.proj_w_stride,
                        dw.proj_b + e * dw.proj_b_stride, dy + off * C, g + off * F,
                        w.proj_w + e * w.proj_w_stride, n, F, C);
    }
    const int64_t rows = offsets[E];
    gelu_backward(dh, h, dh, static_cast<size_t>(rows * F));
    for (int e = 0; e < E; ++e) {
        const int64_t off = offsets[e];
        const int     n   = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        linear_backward(dx + off * C, dw.fc_w + e * dw.fc_w_stride, dw.fc_b + e * dw.fc_b_stride,
                        dh + off * F, x + off * C, w.fc_w + e * w.fc_w_stride, n, C, F);
    }
}

}  // namespace bagualu::moe

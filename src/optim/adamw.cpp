#include "optim/adamw.h"

#include "core/error.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"

namespace bagualu::optim {

using model::MasterMode;

std::vector<MasterMode> master_modes(const model::ParamLayout& layout,
                                     const model::PrecisionPolicy& prec, bool in_place) {
    std::vector<MasterMode> modes;
    for (const model::ParamSpec& s : layout.specs()) {
        const MasterMode m = prec.master_mode(s);
        modes.push_back(in_place && m == MasterMode::master ? MasterMode::none : m);
    }
    return modes;
}

Moments::Moments(size_t n, Dtype dtype) : n_(n), dtype_(dtype) {
    BGL_CHECK(dtype != Dtype::float16, "AdamW moments in fp16: only float32 or bf16");
    if (dtype == Dtype::float32) {
        m_ = Buffer<float>(n);
        v_ = Buffer<float>(n);
    } else {
        m16_ = Buffer<uint16_t>(n);  // bf16 zero is all zero bits
        v16_ = Buffer<uint16_t>(n);
    }
}

MomentsRef Moments::ref() { return {m_.data(), v_.data(), m16_.data(), v16_.data()}; }

void adamw_update(MasterMode mode, Dtype dtype, bool fp64, float* param, float* master, float* grad,
                  const MomentsRef& mo, size_t n, float lr, const AdamWHyper& h, bool decay,
                  int step, float grad_scale) {
    const auto adamw = fp64 ? kernels::adamw_update_f64 : kernels::adamw_update;
    const float wd   = decay ? h.weight_decay : 0.0f;
    // the update of param in place (float32, or half without master) on the run's moments
    const auto in_place = [&](float scale) {
        if (mo.bf16()) {
            kernels::adamw_update_bf16_moments(dtype, fp64, param, nullptr, grad, mo.m16, mo.v16, n,
                                               lr, h.beta1, h.beta2, h.eps, wd, step, scale);
        } else {
            adamw(param, grad, mo.m, mo.v, n, lr, h.beta1, h.beta2, h.eps, wd, step, scale);
        }
    };
    switch (mode) {
        case MasterMode::none:
            in_place(grad_scale);
            break;
        case MasterMode::master:
            if (mo.bf16()) {
                kernels::adamw_update_bf16_moments(dtype, fp64, param, master, grad, mo.m16, mo.v16,
                                                   n, lr, h.beta1, h.beta2, h.eps, wd, step,
                                                   grad_scale);
            } else {
                kernels::adamw_update_rounded(dtype, fp64, param, master, grad, mo.m, mo.v, n, lr,
                                              h.beta1, h.beta2, h.eps, wd, step, grad_scale);
            }
            break;
        case MasterMode::half:
            // the half gradient is the scaled one rounded: scaled first
            if (grad_scale != 1.0f) kernels::scale_inplace(grad, grad_scale, n);
            kernels::round_inplace(grad, n, dtype);
            in_place(1.0f);
            kernels::round_inplace(param, n, dtype);
            break;
    }
}

}  // namespace bagualu::optim

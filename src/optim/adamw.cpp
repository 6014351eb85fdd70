#include "optim/adamw.h"

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

void adamw_update(MasterMode mode, Dtype dtype, bool fp64, float* param, float* master, float* grad,
                  float* m, float* v, size_t n, float lr, const AdamWHyper& h, bool decay, int step,
                  float grad_scale) {
    const auto adamw = fp64 ? kernels::adamw_update_f64 : kernels::adamw_update;
    const float wd   = decay ? h.weight_decay : 0.0f;
    switch (mode) {
        case MasterMode::none:
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step, grad_scale);
            break;
        case MasterMode::master:
            kernels::adamw_update_rounded(dtype, fp64, param, master, grad, m, v, n, lr, h.beta1,
                                          h.beta2, h.eps, wd, step, grad_scale);
            break;
        case MasterMode::half:
            // the half gradient is the scaled one rounded: scaled first
            if (grad_scale != 1.0f) kernels::scale_inplace(grad, grad_scale, n);
            kernels::round_inplace(grad, n, dtype);
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step, 1.0f);
            kernels::round_inplace(param, n, dtype);
            break;
    }
}

}  // namespace bagualu::optim

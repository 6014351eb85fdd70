#include "optim/adamw.h"

#include "kernels/mixed.h"
#include "kernels/ops.h"

namespace bagualu::optim {

using model::MasterMode;

std::vector<MasterMode> master_modes(const model::ParamLayout& layout,
                                     const model::PrecisionPolicy& prec) {
    std::vector<MasterMode> modes;
    for (const model::ParamSpec& s : layout.specs()) modes.push_back(prec.master_mode(s));
    return modes;
}

void adamw_update(MasterMode mode, Dtype dtype, bool fp64, float* param, float* master, float* grad,
                  float* m, float* v, size_t n, float lr, const AdamWHyper& h, bool decay,
                  int step) {
    const auto adamw = fp64 ? kernels::adamw_update_f64 : kernels::adamw_update;
    const float wd   = decay ? h.weight_decay : 0.0f;
    switch (mode) {
        case MasterMode::none:
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            break;
        case MasterMode::master:
            adamw(master, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            kernels::round_copy(param, master, n, dtype);
            break;
        case MasterMode::half:
            kernels::round_inplace(grad, n, dtype);
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            kernels::round_inplace(param, n, dtype);
            break;
    }
}

}  // namespace bagualu::optim

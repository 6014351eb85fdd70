// AdamW on one run of a tensor's elements (the whole tensor, or the piece of it in a ParO shard)
// under the tensor's precision mode, with the kernels of kernels/ops.h and kernels/mixed.h.
// Math only: no communication, no allocation; which elements a rank updates and where their
// moments live is the caller's (dist/paro/).
#pragma once
#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "model/param_layout.h"
#include "model/precision.h"

namespace bagualu::optim {

struct AdamWHyper {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    double grad_clip = 1.0;  // global-norm clip; 0 disables
};

// [layout specs]: how the optimizer keeps each tensor under prec (model::MasterMode).
// in_place (model::masters_in_place): the O2 tensors are their own FP32 masters, updated in
// place as float32 tensors are (MasterMode::none).
std::vector<model::MasterMode> master_modes(const model::ParamLayout& layout,
                                            const model::PrecisionPolicy& prec,
                                            bool in_place = false);

// AdamW on n elements of one tensor under its precision mode: a float32 parameter in place; a
// half one (O2) on its FP32 master, then the parameter = the master rounded to dtype; a half
// one without master (O3) on half gradients in place, then rounded again. param, grad, m, v,
// master: (n); master unused unless mode is master. fp64: the update in double precision
// (precision.fp64_sensitive). decay: apply the weight decay. step: 1-based, the steps taken.
// grad_scale: the gradient is grad * grad_scale (the global-norm clip), as if grad had been
// scaled in place first (kernels::scale_inplace): the same bits, without that pass where the
// kernels fold it in; grad is left unscaled then (scaled, and rounded, under MasterMode::half).
void adamw_update(model::MasterMode mode, Dtype dtype, bool fp64, float* param, float* master,
                  float* grad, float* m, float* v, size_t n, float lr, const AdamWHyper& h,
                  bool decay, int step, float grad_scale = 1.0f);

}  // namespace bagualu::optim

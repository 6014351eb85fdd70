// AdamW on one run of a tensor's elements (the whole tensor, or the piece of it in a ParO shard)
// under the tensor's precision mode, with the kernels of kernels/ops.h and kernels/mixed.h.
// Math only: no communication, no allocation; which elements a rank updates and where their
// moments live is the caller's (dist/paro/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "model/param_layout.h"
#include "model/precision.h"

namespace bagualu::optim {

struct AdamWHyper {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    double grad_clip = 1.0;  // global-norm clip; 0 disables
};

// Where AdamW's first and second moments of a run of elements live: float32 arrays (m, v), or
// bf16 bits (m16, v16: precision.moments = "bf16"). One pair is set; at(i) views element i on.
struct MomentsRef {
    float* m      = nullptr;
    float* v      = nullptr;
    uint16_t* m16 = nullptr;
    uint16_t* v16 = nullptr;
    bool bf16() const { return m16 != nullptr; }
    MomentsRef at(size_t i) const {
        return bf16() ? MomentsRef{nullptr, nullptr, m16 + i, v16 + i}
                      : MomentsRef{m + i, v + i, nullptr, nullptr};
    }
};

// The moments of n elements, zero at the start: float32 or bf16 (dtype).
class Moments {
   public:
    Moments() = default;
    Moments(size_t n, Dtype dtype);
    MomentsRef ref();
    size_t size() const { return n_; }
    Dtype dtype() const { return dtype_; }
    size_t bytes() const { return 2 * n_ * (dtype_ == Dtype::float32 ? 4 : 2); }

   private:
    size_t n_    = 0;
    Dtype dtype_ = Dtype::float32;
    Buffer<float> m_, v_;
    Buffer<uint16_t> m16_, v16_;
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
// master: (n); master unused unless mode is master. The moments (mo, n of them) in float32 or
// bf16: a bf16 update is the float32 one on the widened moments, which are then rounded back
// (kernels::adamw_update_bf16_moments). fp64: the update in double precision
// (precision.fp64_sensitive). decay: apply the weight decay. step: 1-based, the steps taken.
// grad_scale: the gradient is grad * grad_scale (the global-norm clip), as if grad had been
// scaled in place first (kernels::scale_inplace): the same bits, without that pass where the
// kernels fold it in; grad is left unscaled then (scaled, and rounded, under MasterMode::half).
void adamw_update(model::MasterMode mode, Dtype dtype, bool fp64, float* param, float* master,
                  float* grad, const MomentsRef& mo, size_t n, float lr, const AdamWHyper& h,
                  bool decay, int step, float grad_scale = 1.0f);

// The runs of pieces 0..n-1 that one adamw_update call can take: fn(first, end) for each
// maximal run [first, end) in which joins(i) holds for every piece i after the first (piece i
// continues piece i - 1 in the parameters, gradients, moments and masters, under the same mode
// and decay). The update is elementwise, so one call over a run gives the bits of one call per
// piece, with one pass over the compute threads instead of one a piece (a layer of 64 experts
// holds 256 tensors).
template <typename Joins, typename Fn>
void for_each_run(size_t n, Joins&& joins, Fn&& fn) {
    size_t first = 0;
    for (size_t i = 1; i <= n; ++i) {
        if (i < n && joins(i)) continue;
        fn(first, i);
        first = i;
    }
}

}  // namespace bagualu::optim

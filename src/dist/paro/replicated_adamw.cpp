#include "dist/paro/replicated_adamw.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "dist/comm/collectives.h"
#include "dist/paro/spaces.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "optim/grad_clip.h"

namespace bagualu::dist::paro {

using model::MasterMode;

ReplicatedAdamW::ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                 const optim::AdamWHyper& hyper, HelperThread* helper,
                                 const model::PrecisionPolicy& prec, bool masters_in_place)
    : layout_(layout),
      par_(par),
      hyper_(hyper),
      prec_(prec),
      modes_(optim::master_modes(layout, prec, masters_in_place)),
      segs_(make_segments(layout)),
      moments_(layout.total_floats(), prec.moments),
      maps_(make_space_maps(layout, par, kDefaultBucketFloats)),
      reduce_world_(reduction_comm(par.world())),
      reduce_edp_(reduction_comm(par.edp())) {
    // FP32 masters of the O2 tensors only, one after the other
    size_t n = 0;
    for (size_t i = 0; i < modes_.size(); ++i) {
        master_at_.push_back(n);
        if (modes_[i] == MasterMode::master) n += layout.spec(i).numel;
    }
    master_ = Buffer<float>(n);
    std::vector<size_t> ready;
    for (const Segment& s : segs_) ready.push_back(s.begin);
    schedule_ = std::make_unique<ReduceSchedule>(
        std::move(ready), helper,
        [this](size_t u, bool on_helper) { reduce_segment(u, on_helper); });
}

ReplicatedAdamW::~ReplicatedAdamW() { schedule_->drain(); }

double ReplicatedAdamW::step(float* params, float* grads, double lr, int64_t step) {
    finish_reduction(grads);
    if (loss_scale_ != 1) {
        kernels::scale_inplace(grads, static_cast<float>(1.0 / loss_scale_),
                               layout_.total_floats());
    }
    const double norm = global_grad_norm(grads, segs_, &par_);
    skipped_          = !std::isfinite(norm);
    if (skipped_) {
        ++n_skipped_;
        return norm;
    }
    const float clip = optim::clip_factor(norm, hyper_.grad_clip);  // applied by the update
    const auto joins = [this](size_t i) {
        const model::ParamSpec &a = layout_.spec(i - 1), &b = layout_.spec(i);
        return modes_[i] == modes_[i - 1] && b.decay == a.decay && b.offset == a.offset + a.numel &&
               (modes_[i] != MasterMode::master || master_at_[i] == master_at_[i - 1] + a.numel);
    };
    optim::for_each_run(layout_.specs().size(), joins, [&](size_t first, size_t end) {
        const model::ParamSpec& s = layout_.spec(first);
        const size_t n = layout_.spec(end - 1).offset + layout_.spec(end - 1).numel - s.offset;
        float* master  = master_.data() + master_at_[first];
        if (modes_[first] == MasterMode::master && !masters_ready_) {
            std::copy(params + s.offset, params + s.offset + n, master);
        }
        optim::adamw_update(modes_[first], prec_.dtype, prec_.fp64_sensitive, params + s.offset,
                            master, grads + s.offset, moments_.ref().at(s.offset), n,
                            static_cast<float>(lr), hyper_, s.decay,
                            static_cast<int>(step - n_skipped_), clip);
    });
    masters_ready_ = true;
    return norm;
}

MemoryFootprint ReplicatedAdamW::footprint() const {
    const size_t bytes = layout_.total_floats() * sizeof(float);
    return MemoryFootprint{bytes, bytes, moments_.bytes() + master_.size() * sizeof(float), 0};
}

const float* ReplicatedAdamW::master_of(size_t, const ShardPiece& p) const {
    if (modes_[p.spec] != MasterMode::master || !masters_ready_) return nullptr;
    return master_.data() + master_at_[p.spec] + p.elem_offset;
}

void ReplicatedAdamW::masters_loaded(float* params) {
    for (size_t i = 0; i < modes_.size(); ++i) {
        if (modes_[i] != MasterMode::master) continue;
        const model::ParamSpec& s = layout_.spec(i);
        float* master             = master_.data() + master_at_[i];
        std::copy(params + s.offset, params + s.offset + s.numel, master);
        kernels::round_copy(params + s.offset, master, s.numel, prec_.dtype);
    }
    masters_ready_ = true;
}

std::vector<StateSpace> ReplicatedAdamW::state_spaces() {
    return {StateSpace{&maps_[0], &par_.world(), moments_.ref(), true},
            StateSpace{&maps_[1], &par_.edp(), moments_.ref(), true}};
}

void ReplicatedAdamW::reduce_segment(size_t i, bool on_helper) {
    if (par_.size() == 1) return;
    const Segment& s = segs_[i];
    std::span<float> g(grads_ + s.begin, s.end - s.begin);
    if (par_.nodes() > 1) {
        // over nodes: the mean in the node order of collectives.h (two-level or one-level,
        // the same bits); experts: the edp mean / EP = the edp sum / P
        if (s.expert) {
            if (par_.edp_size() > 1) {
                dist::allreduce_mean(*reduce_edp_, par_.edp_nodes(), par_.two_level(), g,
                                     par_.coll_algo());
            }
            if (par_.ep_size() > 1) {
                scale_floats(g.data(), 1.0f / static_cast<float>(par_.ep_size()), g.size(),
                             on_helper);
            }
        } else {
            dist::allreduce_mean(*reduce_world_, par_.world_nodes(), par_.two_level(), g,
                                 par_.coll_algo());
        }
        return;
    }
    if (s.expert) {
        if (par_.edp_size() > 1) reduce_edp_->allreduce_sum(g);
    } else {
        reduce_world_->allreduce_sum(g);
    }
    scale_floats(g.data(), 1.0f / static_cast<float>(par_.size()), g.size(), on_helper);
}

}  // namespace bagualu::dist::paro

// The replicated AdamW: every rank reduces the whole gradient array (all-reduce of each Segment:
// over the world for dense tensors, over the edp group for experts; grad_sync.h) and keeps m and
// v of all its local parameters, FP32 masters of its O2 tensors (beside them, or in them: bf16's
// masters in place). For checkpoints its state is
// cut into the pieces of make_space_maps, so each rank writes a distinct part of it.
#pragma once
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "dist/paro/grad_sync.h"
#include "dist/paro/optimizer.h"
#include "dist/paro/shard_map.h"
#include "model/param_layout.h"
#include "model/precision.h"
#include "optim/adamw.h"

namespace bagualu::dist::paro {

class ReplicatedAdamW final : public Optimizer {
   public:
    // helper: the thread that reduces during backward (nullptr: reduce in step()).
    // masters_in_place: the O2 tensors are their own FP32 masters, updated in place
    // (model::masters_in_place), with no master copy.
    ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                    const optim::AdamWHyper& hyper, HelperThread* helper,
                    const model::PrecisionPolicy& prec, bool masters_in_place = false);
    ~ReplicatedAdamW() override;

    double step(float* params, float* grads, double lr, int64_t step) override;
    MemoryFootprint footprint() const override;
    bool partitioned() const override { return false; }
    std::vector<StateSpace> state_spaces() override;
    const float* master_of(size_t space, const ShardPiece& p) const override;
    void masters_loaded(float* params) override;

   private:
    // The replicated reduction of segment i (grad_sync.h): sum over the world (dense) or the
    // edp group (experts), then / P.
    void reduce_segment(size_t i, bool on_helper);

    const model::ParamLayout& layout_;
    dist::ParallelContext& par_;
    optim::AdamWHyper hyper_;
    model::PrecisionPolicy prec_;
    std::vector<model::MasterMode> modes_;  // [layout specs]
    std::vector<Segment> segs_;
    optim::Moments moments_;         // [layout floats]
    Buffer<float> master_;           // FP32 masters of the O2 tensors
    std::vector<size_t> master_at_;  // [layout specs] offset of a tensor's master
    bool masters_ready_ = false;
    std::vector<ShardMap> maps_;  // checkpoint pieces only
    std::unique_ptr<dist::Comm> reduce_world_, reduce_edp_;
};

}  // namespace bagualu::dist::paro

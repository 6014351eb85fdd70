// The Optimizer base (the reduction hand-off) and make_optimizer, which picks the replicated
// AdamW or ParO.
#include "dist/paro/optimizer.h"

#include "core/error.h"
#include "dist/paro/partitioned_adamw.h"
#include "dist/paro/replicated_adamw.h"

namespace bagualu::dist::paro {

void Optimizer::begin_reduction(float* grads) {
    BGL_CHECK(!schedule_->armed(), "begin_reduction twice before step()");
    grads_ = grads;
    schedule_->begin();
}

void Optimizer::finish_reduction(float* grads) {
    BGL_CHECK(!schedule_->armed() || grads == grads_,
              "step() got another gradient array than begin_reduction()");
    grads_         = grads;
    reduce_wait_s_ = schedule_->finish();
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par,
                                          const model::PrecisionPolicy& prec, HelperThread* helper,
                                          bool masters_in_place) {
    const TrainSection& t = cfg.train;
    const optim::AdamWHyper hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                                  static_cast<float>(t.eps), static_cast<float>(t.weight_decay),
                                  t.grad_clip};
    if (cfg.partition_optimizer(par.size())) {
        BGL_CHECK(!masters_in_place, "make_optimizer: ParO keeps its masters in its shards");
        return std::make_unique<PartitionedAdamW>(
            layout, par, hyper, paro_bucket_floats(cfg, par.size()), helper, prec);
    }
    return std::make_unique<ReplicatedAdamW>(layout, par, hyper, helper, prec, masters_in_place);
}

}  // namespace bagualu::dist::paro

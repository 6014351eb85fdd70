// The Optimizer base (the reduction hand-off) and make_optimizer, which picks the replicated
// AdamW or ParO.
#include "dist/paro/optimizer.h"

#include <algorithm>

#include "core/buffer.h"
#include "core/error.h"
#include "dist/comm/collectives.h"
#include "dist/paro/partitioned_adamw.h"
#include "dist/paro/replicated_adamw.h"

namespace bagualu::dist::paro {

void allgather_space(const StateSpace& sp, float* params) {
    const ShardMap& map = *sp.map;
    if (map.numel() == 0 || map.ranks() == 1) return;
    Buffer<float> bucket(map.bucket_size());
    const float* own = bucket.data() + static_cast<size_t>(map.rank()) * map.piece_size();
    for (size_t b = 0; b < map.num_buckets(); ++b) {
        map.pack_own(b, params, bucket.data());
        dist::all_gather(*sp.comm, {own, map.piece_size()}, {bucket.data(), map.bucket_size()});
        map.unpack(b, bucket.data(), params, false);
    }
}

void Optimizer::masters_over(float* params) {
    const std::vector<StateSpace> spaces = state_spaces();
    for (size_t si = 0; si < spaces.size(); ++si) {
        for (const ShardPiece& p : spaces[si].map->pieces()) {
            if (const float* m = master_of(si, p)) std::copy(m, m + p.len, params + p.flat_offset);
        }
        allgather_space(spaces[si], params);
    }
}

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

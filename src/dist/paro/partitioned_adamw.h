// ParO, the partitioned optimizer (docs/parallelism.md): gradients reduce-scattered in buckets,
// AdamW (optim/adamw.h) on this rank's shard of each space only, updated parameters
// all-gathered. Dense spaces are split over the world, expert spaces over the edp group.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "dist/paro/shard_map.h"
#include "dist/paro/spaces.h"
#include "model/param_layout.h"
#include "model/precision.h"
#include "optim/adamw.h"

namespace bagualu::dist::paro {

// ParO's optimizer state of one space: the shard's m and v, in shard order (map.pieces() say
// which tensor elements they are). The master weights of float32 tensors are the parameters
// themselves, read through the pieces' flat offsets; a space of half-stored tensors (mixed
// precision O2) keeps its FP32 master shard beside m and v, and its parameters travel in the
// all-gather as half values.
struct ShardState {
    ShardMap map;
    optim::Moments moments;             // [shard_size()] m and v (precision.moments)
    float grad_scale = 1;               // applied after the mean: 1 dense, 1/EP experts
    bool expert      = false;           // split over the edp group (else the world)
    Dtype dtype      = Dtype::float32;  // storage dtype of every tensor in the space
    Buffer<float> master;  // [shard_size()] when some piece is model::MasterMode::master
};

// ParO over the layout of one rank; the state a checkpoint needs is shards().
class PartitionedAdamW final : public Optimizer {
   public:
    // bucket_floats: the most floats of one bucket (all ranks' pieces together).
    // helper: the thread that reduces during backward (nullptr: reduce in step()).
    // prec: which tensors are half-stored (their own spaces, FP32 masters, half all-gather).
    PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                     const optim::AdamWHyper& hyper, size_t bucket_floats = kDefaultBucketFloats,
                     HelperThread* helper = nullptr, const model::PrecisionPolicy& prec = {});
    ~PartitionedAdamW() override;
    double step(float* params, float* grads, double lr, int64_t step) override;
    MemoryFootprint footprint() const override;
    bool partitioned() const override { return true; }
    std::vector<StateSpace> state_spaces() override;
    const float* master_of(size_t space, const ShardPiece& p) const override;
    void masters_loaded(float* params) override;
    // [0] dense parameters, split over the world; [1] experts, split over the edp group; with
    // half-stored tensors [2] and [3] the same for those (empty spaces otherwise).
    const std::vector<ShardState>& shards() const { return shards_; }

   private:
    struct Unit {
        size_t space = 0, bucket = 0;
    };
    const model::ParamLayout& layout_;
    // Reduce-scatter of one bucket into this rank's shard of grads_.
    void reduce_bucket(const Unit& u, bool on_helper);
    // The steps of step(): scaling of the spaces on one rank (no reduce-scatter), the global
    // norm, AdamW on this rank's shard (gradients times clip), the all-gather of one space.
    void scale_unsplit_spaces(float* grads);
    double shard_grad_norm(const float* grads);
    void update_shards(float* params, float* grads, float lr, int step, float clip);
    void all_gather_space(size_t space, float* params);
    dist::Comm& comm_of(size_t space);
    // The node layout of that group (two-level collectives, docs/parallelism.md).
    const dist::NodeLayout& nodes_of(size_t space) const;
    dist::ParallelContext& par_;
    // The reductions' own communicators (duplicates of world and edp), so the helper thread's
    // collectives never mix with the main thread's on the same communicator.
    std::unique_ptr<dist::Comm> reduce_world_, reduce_edp_;
    std::vector<Unit> units_;
    optim::AdamWHyper hyper_;
    model::PrecisionPolicy prec_;
    std::vector<model::MasterMode> modes_;  // [layout specs]
    bool masters_ready_ = false;
    Buffer<uint16_t> bucket16_;  // half all-gather payload
    size_t n_floats_ = 0;
    std::vector<ShardState> shards_;  // [2]: dense, expert
    Buffer<float> bucket_;            // [max bucket_size()]
    // shard_grad_norm's runs: every piece of every shard, in order (start, length)
    std::vector<const float*> norm_at_;
    std::vector<size_t> norm_len_;
};

}  // namespace bagualu::dist::paro

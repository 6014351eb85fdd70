// AdamW over the MoDa layout: gradient reduction, global-norm clipping and the update, either
// replicated (all-reduce; m and v for all local parameters on every rank) or ParO (gradients
// reduce-scattered in buckets, each rank updates only its shard of the optimizer state: dense
// over all ranks, experts over their edp group; updated parameters all-gathered). Same results
// up to float rounding (docs/parallelism.md). Does not own the parameters or gradients.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "dist/parallel.h"
#include "model/param_layout.h"
#include "model/precision.h"
#include "train/shard_map.h"

namespace bagualu::train {

// Bytes this rank holds for training state (not activations).
struct MemoryFootprint {
    size_t param_bytes = 0;  // the local parameter array
    size_t grad_bytes  = 0;  // the local gradient array
    size_t optim_bytes = 0;  // AdamW m and v (and a master copy where one exists)
    size_t comm_bytes  = 0;  // bucket buffers of the reduce-scatter / all-gather
};

struct AdamWHyper {
    float  beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    double grad_clip = 1.0;  // global-norm clip; 0 disables
};

class Optimizer {
   public:
    virtual ~Optimizer() = default;
    // grads: this rank's gradient array after backward (the sums of its own micro-batches);
    // reduced in place (on ParO only this rank's shard is reduced). Clips to the global norm,
    // updates params at 1-based `step` with learning rate lr; params are complete on every rank
    // afterwards. Returns the global gradient norm before clipping. Collective over the world.
    virtual double step(float* params, float* grads, double lr, int64_t step) = 0;
    virtual MemoryFootprint footprint() const = 0;
    // True for ParO.
    virtual bool partitioned() const = 0;

    // Dynamic loss scaling: the gradients of the following steps arrive multiplied by `scale`;
    // step() divides it out (on this rank's shard for ParO) before the norm. A step whose
    // gradients hold an inf or NaN anywhere (the global norm is not finite) changes no parameter
    // and no optimizer state, and skipped() says so until the next step; AdamW's bias correction
    // counts only the steps taken (step minus the steps skipped so far).
    void set_loss_scale(double scale) { loss_scale_ = scale; }
    bool skipped() const { return skipped_; }

   protected:
    double  loss_scale_ = 1;
    bool    skipped_    = false;
    int64_t n_skipped_  = 0;
};

// ParO's optimizer state of one space: the shard's m and v, in shard order (map.pieces() say
// which tensor elements they are). The master weights of float32 tensors are the parameters
// themselves, read through the pieces' flat offsets; a space of half-stored tensors (mixed
// precision O2) keeps its FP32 master shard beside m and v, and its parameters travel in the
// all-gather as half values.
struct ShardState {
    ShardMap      map;
    Buffer<float> m, v;  // [shard_size()]
    float         grad_scale = 1;  // applied after the mean: 1 dense, 1/EP experts
    bool          expert     = false;  // split over the edp group (else the world)
    Dtype         dtype      = Dtype::float32;  // storage dtype of every tensor in the space
    Buffer<float> master;  // [shard_size()] when some piece is model::MasterMode::master
};

// ParO over the layout of one rank; the state a checkpoint needs is shards().
class PartitionedAdamW final : public Optimizer {
   public:
    // bucket_floats: the most floats of one bucket (all ranks' pieces together).
    // prec: which tensors are half-stored (their own spaces, FP32 masters, half all-gather).
    PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                     const AdamWHyper& hyper, size_t bucket_floats = kDefaultBucketFloats,
                     const model::PrecisionPolicy& prec = {});
    double          step(float* params, float* grads, double lr, int64_t step) override;
    MemoryFootprint footprint() const override;
    bool            partitioned() const override { return true; }
    // [0] dense parameters, split over the world; [1] experts, split over the edp group; with
    // half-stored tensors [2] and [3] the same for those (empty spaces otherwise).
    const std::vector<ShardState>& shards() const { return shards_; }

    static constexpr size_t kDefaultBucketFloats = size_t{1} << 22;  // 16 MiB

   private:
    dist::Comm& comm_of(size_t space);
    dist::ParallelContext&  par_;
    AdamWHyper              hyper_;
    model::PrecisionPolicy  prec_;
    std::vector<model::MasterMode> modes_;  // [layout specs]
    bool                    masters_ready_ = false;
    Buffer<uint16_t>        bucket16_;  // half all-gather payload
    size_t                  n_floats_ = 0;
    std::vector<ShardState> shards_;  // [2]: dense, expert
    Buffer<float>           bucket_;  // [max bucket_size()]
};

// Replicated or ParO per cfg.optimizer.partition and the number of ranks; mixed precision per
// cfg.precision (FP32 masters for O2 tensors, rounding for O3 ones).
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par);

// This process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 when unknown.
size_t peak_rss_bytes();

}  // namespace bagualu::train

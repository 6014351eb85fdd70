// The optimizer interface of a training run over the MoDa layout: gradient reduction,
// global-norm clipping and the AdamW update, either replicated (replicated_adamw.h: all-reduce;
// m and v for all local parameters on every rank) or ParO (partitioned_adamw.h: gradients
// reduce-scattered in buckets, each rank updates only its shard of the optimizer state: dense
// over all ranks, experts over their edp group; updated parameters all-gathered). Same results
// up to float rounding (docs/parallelism.md). Does not own the parameters or gradients.
// Both can start the gradient reduction during the last backward of a step, on the helper thread
// (reduce_schedule.h), with bitwise the same results as reducing in step().
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "config/config.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "dist/paro/reduce_schedule.h"
#include "dist/paro/shard_map.h"
#include "model/param_layout.h"
#include "model/precision.h"
#include "optim/adamw.h"

namespace bagualu::dist::paro {

// Bytes this rank holds for training state (not activations).
struct MemoryFootprint {
    size_t param_bytes = 0;  // the local parameter array
    size_t grad_bytes  = 0;  // the local gradient array
    size_t optim_bytes = 0;  // AdamW m and v (float32 or bf16), and a master copy where one exists
    size_t comm_bytes  = 0;  // bucket buffers of the reduce-scatter / all-gather
};

// What a checkpoint saves of the optimizer, per space (dense parameters, experts): the map whose
// pieces this rank writes and reads, the group the space is split over, and where the pieces'
// AdamW moments live. Every rank of the group holds distinct pieces; together they cover the
// space, so each element is written exactly once.
struct StateSpace {
    const ShardMap* map = nullptr;
    dist::Comm* comm    = nullptr;
    optim::MomentsRef moments;  // float32 or bf16 (precision.moments)
    bool flat_indexed = false;  // moments at piece.flat_offset (replicated), else shard_offset
};

// Collective over sp.comm: fills every rank's params outside its own pieces of sp from the
// ranks that own them.
void allgather_space(const StateSpace& sp, float* params);

class Optimizer {
   public:
    virtual ~Optimizer() = default;
    // grads: this rank's gradient array after backward (the sums of its own micro-batches);
    // reduced in place (on ParO only this rank's shard is reduced). Clips to the global norm,
    // updates params at 1-based `step` with learning rate lr; params are complete on every rank
    // afterwards. Returns the global gradient norm before clipping. Collective over the world.
    virtual double step(float* params, float* grads, double lr, int64_t step) = 0;
    virtual MemoryFootprint footprint() const                                 = 0;
    // True for ParO.
    virtual bool partitioned() const = 0;
    // [dense, experts]: the state a checkpoint saves and restores.
    virtual std::vector<StateSpace> state_spaces() = 0;

    // Overlap (with a helper thread, else no-ops): call begin_reduction before the last backward
    // of a step, and grads_ready(from) whenever backward has finished grads[from, end); the
    // reductions of the parts that are complete then run on the helper while backward goes on,
    // and step() waits for them. Collective over the world, in the same order on every rank.
    void begin_reduction(float* grads);
    void grads_ready(size_t from) { schedule_->grads_ready(from); }
    // True when reductions run on a helper thread.
    bool overlapped() const { return schedule_->overlapped(); }
    // Seconds the last step() spent before every gradient was reduced (waiting for the helper
    // thread, or reducing inline): the communication backward did not hide.
    double reduce_wait_s() const { return reduce_wait_s_; }

    // Dynamic loss scaling: the gradients of the following steps arrive multiplied by `scale`;
    // step() divides it out (on this rank's shard for ParO) before the norm. A step whose
    // gradients hold an inf or NaN anywhere (the global norm is not finite) changes no parameter
    // and no optimizer state, and skipped() says so until the next step; AdamW's bias correction
    // counts only the steps taken (step minus the steps skipped so far).
    void set_loss_scale(double scale) { loss_scale_ = scale; }
    bool skipped() const { return skipped_; }
    int64_t steps_skipped() const { return n_skipped_; }
    void set_steps_skipped(int64_t n) { n_skipped_ = n; }  // resuming from a checkpoint

    // Checkpoints: the FP32 master weights of piece p of state_spaces()[space], or nullptr when
    // the parameters are their own masters (float32 tensors; O3 ones, which have none).
    virtual const float* master_of(size_t space, const ShardPiece& p) const = 0;
    // After a checkpoint has put the master weights into every rank's params: take them as
    // the masters and round the half-stored parameters to their dtype.
    virtual void masters_loaded(float* params) = 0;
    // Collective over the world: params (a copy of this rank's parameters) with the FP32 master
    // weights written over the half-stored tensors' rounded values, gathered from the ranks
    // that own them: the weights a checkpoint's "param/" holds (nothing changes where the
    // parameters are their own masters).
    void masters_over(float* params);

   protected:
    // Runs the reduction units (see reduce_schedule.h) and records the wait.
    void finish_reduction(float* grads);
    std::unique_ptr<ReduceSchedule> schedule_;  // set by the constructor of each optimizer
    float* grads_         = nullptr;            // the array being reduced
    double reduce_wait_s_ = 0;
    double loss_scale_    = 1;
    bool skipped_         = false;
    int64_t n_skipped_    = 0;
};

// Replicated or ParO per cfg.optimizer.partition and the number of ranks; mixed precision per
// prec, the run's policy (FP32 masters for O2 tensors, rounding for O3 ones). helper: the thread
// that reduces gradients during backward (nullptr: no overlap). masters_in_place: the O2
// tensors are their own FP32 masters (model::masters_in_place, GPT::keep_masters_in_place; the
// replicated optimizer only). Collective over the world.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par,
                                          const model::PrecisionPolicy& prec,
                                          HelperThread* helper  = nullptr,
                                          bool masters_in_place = false);

}  // namespace bagualu::dist::paro

// AdamW over the MoDa layout: gradient reduction, global-norm clipping and the update, either
// replicated (all-reduce; m and v for all local parameters on every rank) or ParO (gradients
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
#include "core/buffer.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "model/param_layout.h"
#include "train/reduce_schedule.h"
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

// What a checkpoint saves of the optimizer, per space (dense parameters, experts): the map whose
// pieces this rank writes and reads, the group the space is split over, and where the pieces'
// AdamW moments live. Every rank of the group holds distinct pieces; together they cover the
// space, so each element is written exactly once.
struct StateSpace {
    const ShardMap* map  = nullptr;
    dist::Comm*     comm = nullptr;
    float*          m    = nullptr;
    float*          v    = nullptr;
    bool flat_indexed    = false;  // moments at piece.flat_offset (replicated), else shard_offset
};

// The two spaces of a layout: [0] dense tensors split over the world, [1] experts over the edp
// group (the ranks holding the same experts).
std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, dist::ParallelContext& par,
                                      size_t bucket_floats);
std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, int world_size, int world_rank,
                                      int edp_size, int edp_rank, size_t bucket_floats);

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
    void    set_loss_scale(double scale) { loss_scale_ = scale; }
    bool    skipped() const { return skipped_; }
    int64_t steps_skipped() const { return n_skipped_; }
    void    set_steps_skipped(int64_t n) { n_skipped_ = n; }  // resuming from a checkpoint

    // Checkpoints: the FP32 master weights of piece p of state_spaces()[space], or nullptr when
    // the parameters are their own masters (float32 tensors; O3 ones, which have none).
    virtual const float* master_of(size_t space, const ShardPiece& p) const = 0;
    // After a checkpoint has put the master weights into every rank's params: take them as
    // the masters and round the half-stored parameters to their dtype.
    virtual void masters_loaded(float* params) = 0;

   protected:
    // Runs the reduction units (see reduce_schedule.h) and records the wait.
    void finish_reduction(float* grads);
    std::unique_ptr<ReduceSchedule> schedule_;   // set by the constructor of each optimizer
    float*                          grads_ = nullptr;  // the array being reduced
    double                          reduce_wait_s_ = 0;
    double                          loss_scale_ = 1;
    bool                            skipped_    = false;
    int64_t                         n_skipped_  = 0;
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
    // helper: the thread that reduces during backward (nullptr: reduce in step()).
    // prec: which tensors are half-stored (their own spaces, FP32 masters, half all-gather).
    PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                     const AdamWHyper& hyper, size_t bucket_floats = kDefaultBucketFloats,
                     HelperThread* helper = nullptr, const model::PrecisionPolicy& prec = {});
    ~PartitionedAdamW() override;
    double          step(float* params, float* grads, double lr, int64_t step) override;
    MemoryFootprint footprint() const override;
    bool            partitioned() const override { return true; }
    std::vector<StateSpace> state_spaces() override;
    const float*    master_of(size_t space, const ShardPiece& p) const override;
    void            masters_loaded(float* params) override;
    // [0] dense parameters, split over the world; [1] experts, split over the edp group; with
    // half-stored tensors [2] and [3] the same for those (empty spaces otherwise).
    const std::vector<ShardState>& shards() const { return shards_; }

    // 4 MiB: small enough that a model of a few million parameters per rank has several
    // buckets to reduce while backward still runs.
    static constexpr size_t kDefaultBucketFloats = size_t{1} << 20;

   private:
    struct Unit {
        size_t space = 0, bucket = 0;
    };
    const model::ParamLayout& layout_;
    // Reduce-scatter of one bucket into this rank's shard of grads_.
    void reduce_bucket(const Unit& u, bool on_helper);
    dist::Comm& comm_of(size_t space);
    dist::ParallelContext&  par_;
    // The reductions' own communicators (duplicates of world and edp), so the helper thread's
    // collectives never mix with the main thread's on the same communicator.
    std::unique_ptr<dist::Comm> reduce_world_, reduce_edp_;
    std::vector<Unit>       units_;
    AdamWHyper              hyper_;
    model::PrecisionPolicy  prec_;
    std::vector<model::MasterMode> modes_;  // [layout specs]
    bool                    masters_ready_ = false;
    Buffer<uint16_t>        bucket16_;  // half all-gather payload
    size_t                  n_floats_ = 0;
    std::vector<ShardState> shards_;  // [2]: dense, expert
    Buffer<float>           bucket_;  // [max bucket_size()]
};

// ParO's spaces as PartitionedAdamW builds them on one rank, without state or communication:
// [dense, expert] of float32 tensors, then [dense, expert] of half-stored ones when the policy
// has any. Dense spaces are split over the world, expert spaces over the edp group.
struct ParoSpace {
    ShardMap map;
    bool     expert = false;
    Dtype    dtype  = Dtype::float32;  // storage dtype of every tensor in the space
    bool     master = false;           // some piece of this rank's shard keeps an FP32 master
};
std::vector<ParoSpace> paro_spaces(const model::ParamLayout& layout, const model::PrecisionPolicy& prec,
                                   int world_size, int world_rank, int edp_size, int edp_rank,
                                   size_t bucket_floats);

// What the optimizer make_optimizer builds holds on a rank, computed without building it or its
// maps (bagualu plan): equal to its footprint() (tests/mpi). Under ParO the shard sizes are the
// same on every rank; a space's master shard is counted when the space holds an O2 tensor (a
// rank whose shard of it is all padding has none).
MemoryFootprint optimizer_footprint(const model::ParamLayout& layout,
                                    const model::PrecisionPolicy& prec, bool partitioned,
                                    int world_size, int edp_size,
                                    size_t bucket_floats = PartitionedAdamW::kDefaultBucketFloats);

// The shard floats of the optimizer's state spaces (Optimizer::state_spaces()), an upper bound
// of any rank's pieces (less than 16 floats per tensor above rank 0's): a checkpoint snapshot
// holds three times the pieces (master, m, v; train/checkpointing.h). bucket_floats is ParO's;
// the replicated optimizer's maps always use the default.
size_t state_piece_floats(const model::ParamLayout& layout, const model::PrecisionPolicy& prec,
                          bool partitioned, int world_size, int edp_size,
                          size_t bucket_floats = PartitionedAdamW::kDefaultBucketFloats);

// ParO's bucket target on `ranks` ranks: parallel.bucket_mib, but at least kMinPieceFloats for
// each rank. Every bucket is a reduce-scatter and an all-gather over all the ranks of its space,
// whose latency grows with them; a fixed size would shrink to a few floats per rank at scale
// (4 MiB over 96,000 ranks is 11 floats each) and make the step latency-bound.
inline constexpr size_t kMinPieceFloats = 1024;  // 4 KiB per rank
size_t paro_bucket_floats(const TrainConfig& cfg, int ranks);

// Replicated or ParO per cfg.optimizer.partition and the number of ranks; mixed precision per
// prec, the run's policy (FP32 masters for O2 tensors, rounding for O3 ones). helper: the thread that
// reduces gradients during backward (nullptr: no overlap). Collective over the world.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext&        par,
                                          const model::PrecisionPolicy& prec,
                                          HelperThread*                 helper = nullptr);

// This process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 when unknown.
size_t peak_rss_bytes();

}  // namespace bagualu::train

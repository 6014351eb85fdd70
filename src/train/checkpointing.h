// Checkpoints of a training run (docs/checkpoint-format.md) on top of io/checkpoint: periodic,
// sharded, asynchronous writes and resuming from the newest usable one, in any layout.
//
// Every rank owns distinct pieces of each space (Optimizer::state_spaces(): the ParO shard, or
// an even split of the replicated state) and saves, for each piece, the FP32 parameters (the
// master weights), AdamW's m and v. save() copies them into a snapshot buffer — the only stall
// of the step loop — and the I/O helper thread writes <dir>/step_N.tmp/rank_R.safetensors while
// training goes on. Once every rank's write has finished (the trainer learns it from a flag
// summed with the step's loss), finalize() has rank 0 write the manifest, rename the directory
// into place and delete checkpoints beyond checkpoint.keep. Loading reads each rank's pieces
// by tensor name and element range from whatever files hold them, then all-gathers the
// parameters, so a checkpoint written at (P, EP) loads at any valid (P', EP').
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "io/checkpoint/checkpoint.h"
#include "model/param_layout.h"
#include "moe/balance_bias.h"

namespace bagualu::train {

// What the trainer records in a manifest's state, typed.
// One split of a blend as a checkpoint records it (data.blend).
struct BlendSourceState {
    std::string data;  // the split as data.blend names it
    int64_t epoch = 0, position = 0, windows = 0;
    double deficit = 0;
};

struct TrainerState {
    int64_t epoch = 0, position = 0;  // the sampler cursor
    int64_t windows = 0;              // data.train's windows when it was written; 0: not recorded
    std::vector<BlendSourceState> blend;  // a blend's splits instead (then epoch etc. are 0)
    bool has_loss_scale   = false;        // absent in checkpoints of FP32 runs' first format
    double loss_scale     = 1;
    int64_t clean_steps   = 0;
    int64_t steps_skipped = 0;
    // With model.balance_bias_rate > 0: every MoE layer's routing bias (moe/balance_bias.h),
    // float32 values written as JSON numbers of 17 significant digits, so they read back exactly.
    moe::BalanceBiases balance_bias;
};
// Throws InputError naming source and the field when a field is missing or mistyped.
TrainerState parse_trainer_state(const nlohmann::json& state, const std::string& source);

struct ResumePoint {
    int64_t step = 0;      // optimizer steps done
    nlohmann::json state;  // the manifest's state: sampler cursor and counters
    TrainerState trainer;  // the same, checked and typed
    std::string dir;       // the checkpoint that was loaded
    // whether its run scaled the loss (fp16): otherwise its loss scale is 1 and means nothing
    // to a run that scales
    bool loss_scaled = false;
    // training settings of [model] that differ from its run's (balancing and router losses):
    // the key, this run's value, the checkpoint's
    std::vector<KeyDifference> changed;
};

class Checkpointer {
   public:
    // layout: this rank's parameter layout. Collective over par.world() (rank 0 removes
    // unfinished step_*.tmp directories of an earlier run).
    Checkpointer(const TrainConfig& cfg, const model::ParamLayout& layout,
                 dist::paro::Optimizer& opt, dist::ParallelContext& par);
    ~Checkpointer();  // waits for a write in progress; does not finalize it
    Checkpointer(const Checkpointer&)            = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;

    const std::string& root() const { return root_; }

    // Collective. The newest complete checkpoint whose files pass their size and xxh64 checks
    // (a bad one is reported on stderr and skipped for the one before), loaded into params and
    // the optimizer. nullopt when root holds no complete checkpoint; InputError when it holds
    // some but none is usable, or when the usable one does not fit the model.
    std::optional<ResumePoint> load_latest(float* params);
    // Collective. Loads the checkpoint in dir (file hashes checked by rank 0 when verify).
    ResumePoint load(const std::string& dir, float* params, bool verify = true);

    // Collective when a previous checkpoint is still unfinished (it is finished first).
    // Snapshots this rank's pieces after optimizer step `step` and queues their write.
    void save(int64_t step, const nlohmann::json& state, const float* params);
    // 1 while this rank's write is queued or running, else 0: the trainer sums it over ranks.
    double busy() const;
    // True between save() and the finalize() of that checkpoint.
    bool pending() const { return pending_; }
    // Collective: waits for this rank's write, gathers every rank's file record, and rank 0
    // queues the commit (manifest written and fsynced, directory renamed, older ones pruned) on
    // the I/O helper. A failed write on any rank ends every rank with its message.
    void finalize();
    // Collective, at the end of training: finalizes and waits for the last commit.
    void close();
    // Seconds the step loop spent in save() and finalize() (snapshot copies and waits; the
    // flush of close() at the end of the run is not counted).
    double stall_seconds() const { return stall_s_; }
    // Seconds this rank's I/O helper spent writing checkpoint files (what a synchronous
    // checkpoint would have stalled the step loop); the bytes they hold.
    double write_seconds() const { return write_s_; }
    uint64_t bytes_written() const { return bytes_; }
    // The last checkpoint committed ("" if none); complete after close().
    const std::string& last_committed() const { return last_; }

   private:
    size_t snapshot_bytes();  // bytes of this rank's pieces, three kinds (slice_bytes each)

    const TrainConfig& cfg_;
    const model::ParamLayout& layout_;
    dist::paro::Optimizer& opt_;
    dist::ParallelContext& par_;
    std::string root_;
    std::function<void()> write_job_, commit_job_;  // io_'s jobs (alive for FunctionRef)
    HelperThread io_;                               // writes snapshots; one per run
    HelperThread::Ticket ticket_ = 0, commit_ticket_ = 0;
    bool pending_ = false;
    int64_t step_ = 0;
    nlohmann::json state_;
    Buffer<std::byte> snapshot_;  // the slices one after another
    std::vector<io::ckpt::Slice> slices_;
    io::ckpt::FileRecord record_;
    std::string tmp_dir_, last_;
    double stall_s_ = 0, write_s_ = 0;
    uint64_t bytes_ = 0;
};

// A checkpoint's model as one full FP32 parameter array in the layout of model::make_layout
// (what export writes). Reads the config from the manifest.
struct CheckpointModel {
    TrainConfig cfg;
    int64_t step = 0;
    Buffer<float> params;
    moe::BalanceBiases biases;  // the trainer state's balance_bias (empty when off)
};
CheckpointModel read_checkpoint_model(const std::string& dir);

// What would stop a resume from reading the checkpoint at dir, whose files have passed their
// checks: for every tensor its config's model implies (parameters and both moments), whether it
// is there with that shape and reads whole (slices covering it exactly, each in its file with the
// shape and dtype the manifest declares). One line per failing tensor; empty when all read.
std::vector<std::string> unreadable_tensors(const std::string& dir);

}  // namespace bagualu::train

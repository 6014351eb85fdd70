// The training loop: data, model, AdamW, schedule, clipping, gradient accumulation, periodic
// validation, metrics.jsonl, progress line, and the exported model and loss chart at the end.
// Runs on one process or on P ranks in the MoDa layout (dist/parallel.h): each rank trains on
// its slice of every global batch; gradients are reduced and the optimizer state replicated or
// partitioned (ParO) as docs/parallelism.md describes. Deterministic for a given config.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "config/config.h"
#include "dist/parallel.h"

namespace bagualu::train {

struct TrainOptions {
    bool force = false;  // replace a previous run in the run directory
    bool quiet = false;  // no progress line or samples (tests)
    // Steps only (bagualu bench train): no run directory, log lines, metrics, evaluation or
    // export; nothing is written. The steps themselves are the same.
    bool dry_run = false;
    // Called on every rank after each optimizer step with the step index, its seconds and the
    // seconds the optimizer waited for the gradient reduction (Optimizer::reduce_wait_s).
    std::function<void(int64_t step, double seconds, double reduce_wait_s)> on_step;
    // When set, holds this rank's seconds blocked on training data so far (DataLoader::
    // wait_seconds), updated before each on_step.
    double* data_wait_s = nullptr;
};

struct TrainSummary {
    double final_loss          = 0;  // train loss of the last step
    double final_val_loss      = 0;
    double val_unigram_entropy = -1;  // < 0 when the data has no meta.json
    double tokens_per_s        = 0;
    int64_t steps              = 0;
    int64_t skipped_steps      = 0;  // fp16: steps skipped for an inf/NaN gradient
    double final_loss_scale    = 1;
    double peak_gflops         = 0;  // this rank's measured fp32 peak
    double flops_per_token     = 0;  // model FLOPs of forward + backward per token
    double data_wait_s         = 0;  // this rank's seconds blocked on training data
    // this rank's backward passes whose LM head computed its logits again (GPT::head_recomputes)
    int64_t head_recomputes = 0;
    std::string run_dir;
    std::string model_dir;
    // A run stopped by a signal (core/stop_signal.h) after `steps` steps: the signal (0: ran to
    // the end) and the checkpoint written there ("" if it could not be: a dry run).
    int stop_signal = 0;
    std::string stop_checkpoint;
};

// par: the process layout (nullptr: one process). Collective over par->world().
// Input problems found before the first step end every rank with one message (exit 2).
TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opt = {},
                          dist::ParallelContext* par = nullptr);

}  // namespace bagualu::train

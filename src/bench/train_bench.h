// `bagualu bench train`: times real training steps (run_training in its dry-run mode: nothing is
// written) and reports tokens/s, model FLOP/s, MFU against the measured fp32 peak, peak resident
// memory (VmHWM) per rank, and the step time split by phase (train/phase_timer.h). Collective
// over par->world(); rank 0 prints a table or one JSON object. Step times are rank 0's.
#pragma once
#include <cstdint>

#include "config/config.h"
#include "dist/parallel.h"

namespace bagualu::bench {

struct TrainBenchOptions {
    int64_t steps  = 10;  // timed steps
    int64_t warmup = 2;   // untimed steps first
    bool    json   = false;
};

// Returns 0. cfg: the run to time; its steps, evaluation and logging settings are replaced.
int run_train_bench(const TrainConfig& cfg, const TrainBenchOptions& options,
                    dist::ParallelContext& par);

}  // namespace bagualu::bench

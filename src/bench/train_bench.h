// `bagualu bench train`: times real training steps (run_training in its dry-run mode: nothing is
// written) and reports tokens/s, model FLOP/s, MFU against the measured fp32 peak, peak resident
// memory (VmHWM) per rank, and the step time split by phase (core/phase_timer.h). Collective
// over par->world(); rank 0 prints a table or one JSON object. Step times are rank 0's. The JSON
// also names the CPU (cpu_model, half_features: its 16-bit features) and, per GEMM of a step
// (gemm_backends: phase, gemm, m, n, k, f32, bf16), the backend that GEMM ran on.
// With compare_overlap it instead times the same steps with parallel.overlap_grad_reduce off and
// on, alternating runs, and reports the median step time of each and their ratio.
#pragma once
#include <cstdint>

#include "config/config.h"
#include "dist/parallel.h"

namespace bagualu::bench {

struct TrainBenchOptions {
    int64_t steps  = 10;  // timed steps
    int64_t warmup = 2;   // untimed steps first
    bool json      = false;
    // Off/on pairs of runs of warmup + steps each (compare_overlap only).
    bool compare_overlap = false;
    int repeats          = 3;
};

// Returns 0. cfg: the run to time; its steps, evaluation and logging settings are replaced.
int run_train_bench(const TrainConfig& cfg, const TrainBenchOptions& options,
                    dist::ParallelContext& par);

}  // namespace bagualu::bench

// `bagualu bench train`: times real training steps (run_training in its dry-run mode: nothing is
// written) and reports tokens/s, model FLOP/s, MFU against the measured fp32 peak, peak resident
// memory (VmHWM) per rank, and the step time split by phase (core/phase_timer.h). Collective
// over par->world(); rank 0 prints a table or one JSON object. Step times are rank 0's. The JSON
// also names the CPU (cpu_model, half_features: its 16-bit features) and, per GEMM of a step
// (gemm_backends: phase, gemm, m, n, k, f32, bf16), the backend that GEMM ran on, and what the
// attention core runs on (attention_core: "bf16 on amx tiles", "bf16 on avx512_bf16 dots",
// "fp64" or "float32 (<isa>)"; also printed in the table).
// With compare_overlap it instead times the same steps with parallel.overlap_grad_reduce off and
// on, alternating runs, and reports the median step time of each and their ratio.
// compare_settings times several settings of one model side by side (`--compare`): rounds of one
// run per setting, each round starting at the next setting, and reports per setting the median
// step time, tokens/s, the median over rounds of its speed against the first setting's in the
// same round, and the phases; with `isolate` each run is a process of its own, which also gives
// each setting's peak resident memory (one process otherwise holds every run).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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
    // compare_settings: each run in a fresh process of this binary, its peak RSS compared too
    // (one rank only)
    bool isolate = false;
};

// One setting of `bench train --compare`: its label (the overrides as given), its config and the
// process layout made for it.
struct BenchSetting {
    std::string label;
    TrainConfig cfg;
    dist::ParallelContext* par = nullptr;
};

// Collective over the settings' world. options.repeats rounds; needs at least two settings.
int compare_settings(std::vector<BenchSetting> settings, const TrainBenchOptions& options);

// Returns 0. cfg: the run to time; its steps, evaluation and logging settings are replaced.
int run_train_bench(const TrainConfig& cfg, const TrainBenchOptions& options,
                    dist::ParallelContext& par);

}  // namespace bagualu::bench

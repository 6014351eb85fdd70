// The run directory (train.run_dir) of a training run: what rank 0 checks and prepares before
// the first step, and how a resumed run's metrics are cut back to its checkpoint.
#pragma once
#include <cstdint>
#include <string>

#include "config/config.h"

namespace bagualu::train {

// Refuses to mix a new run into a directory that holds an earlier one (its metrics or its
// checkpoints), unless resuming it or forced to replace it (then removes the old checkpoints).
// Creates the directory. InputError on refusal or when it cannot be created.
void prepare_run_dir(const TrainConfig& cfg, bool force, bool resume);

// Keeps the lines of a resumed run's metrics.jsonl up to its checkpoint's step (the steps after
// it are trained again), through a temporary file and a rename.
void trim_metrics(const std::string& path, int64_t step);

}  // namespace bagualu::train

// Checkpoint I/O benchmark: writes a checkpoint-sized set of float slices the way the trainer
// does (ckpt::write_slices + write_manifest + commit, into a fresh directory) and, side by side
// in each repeat, the same number of bytes as one plain file (write + fsync); then reads both
// back cold (page cache dropped for the files): CheckpointReader, hashes verified, reading every
// tensor, against a plain read. Reports median MB/s of each and checkpoint/plain ratios. Works
// in a temporary directory under `dir` that it removes. With a stall_config it also measures
// what an asynchronous checkpoint costs the training loop. The CLI (`bagualu bench io`) parses the
// options.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"

namespace bagualu::bench {

struct IoBenchOptions {
    size_t bytes = size_t{256} << 20;  // payload per checkpoint (float data)
    int repeats  = 5;                  // timed rounds (median); each writes and reads both
    std::string dir;                   // parent of the scratch directory; empty: system temp dir
    bool json = false;                 // one JSON object instead of the table
    // The step-loop pause of asynchronous checkpoints (bench/checkpoint_stall.h), measured by
    // training this config twice: stall_steps steps, a checkpoint every stall_every.
    std::optional<TrainConfig> stall_config;
    int64_t stall_steps = 12, stall_every = 4;
};

// Returns 0. Throws InputError when `dir` is unusable or the options are out of range.
int run_io_bench(const IoBenchOptions& options);

}  // namespace bagualu::bench

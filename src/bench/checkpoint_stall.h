// The pause an asynchronous checkpoint puts into the step loop: the config's model is trained
// twice for the same steps, without checkpoints and with one every `every` steps (written to a
// temporary directory, removed afterwards), and the time between consecutive steps is compared.
// Reported beside the time the I/O helper spent writing, which is what a synchronous checkpoint
// would have cost. Collective over par.world(); every rank gets rank 0's figures.
#pragma once
#include <cstdint>
#include <string>

#include "config/config.h"
#include "dist/parallel.h"

namespace bagualu::bench {

struct CheckpointStall {
    int64_t checkpoints   = 0;  // written in the run with checkpoints
    double step_s         = 0;  // median time between steps, run without checkpoints
    double after_ckpt_s   = 0;  // median time between a checkpoint step and the next one
    double stall_s        = 0;  // after_ckpt_s - step_s: what a checkpoint costs the loop
    double snapshot_s     = 0;  // per checkpoint: the loop's own time in save/finalize
    double write_s        = 0;  // per checkpoint: the I/O helper's write time (rank 0)
    double bytes_per_rank = 0;  // per checkpoint (rank 0)
};

// dir: where the temporary run directories go.
CheckpointStall measure_checkpoint_stall(TrainConfig cfg, int64_t steps, int64_t every,
                                         const std::string& dir, dist::ParallelContext& par);

}  // namespace bagualu::bench

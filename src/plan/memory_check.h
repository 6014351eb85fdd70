// Whether a training run fits in the memory of the machine it starts on, checked before the
// model is built: the planner's bytes per rank (footprint.h, the same sizes the implementation
// allocates, within 1% of them in tests/unit/plan) times the ranks that share the machine,
// against what those ranks may still allocate (core/proc_memory.h: MemAvailable and the control
// groups' limits that Slurm and containers set). A run that cannot fit ends at once with one
// line, instead of being killed by the kernel once its pages are touched, minutes later and on
// one rank. train.check_memory = false skips it. The same for the checkpoints' disk space.
#pragma once
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/proc_memory.h"
#include "plan/footprint.h"

namespace bagualu::plan {

// Bytes per rank of cfg on `ranks` ranks, ranks_per_node to a node, `threads` compute threads
// a rank: what footprint() counts, less the process baseline (already allocated, so already
// outside MemAvailable).
Memory run_memory(const TrainConfig& cfg, int ranks, int ranks_per_node, int threads);

// Throws InputError naming `where` (the config) when ranks_here x the run's bytes per rank
// exceed left.bytes.
void check_memory_fits(const TrainConfig& cfg, const std::string& where, int ranks,
                       int ranks_per_node, int ranks_here, int threads, const MemoryLeft& left);

// Bytes of one checkpoint of cfg on `ranks` ranks, ranks_per_node to a node: the FP32 parameter,
// m and v of every parameter once, over all ranks (train/checkpointing.cpp; the manifest and the
// files' headers, a few KiB, aside).
double checkpoint_bytes(const TrainConfig& cfg, int ranks, int ranks_per_node);

// With checkpoint.every > 0, against free_bytes on the checkpoint directory's file system: throws
// InputError naming `dir` when one checkpoint cannot fit (the first write would fail, hours into
// the run); returns a warning when the checkpoints kept (checkpoint.keep, and the one being
// written beside them; every one when keep = 0) cannot, else "".
std::string check_checkpoint_space(const TrainConfig& cfg, const std::string& dir,
                                   uint64_t free_bytes, int ranks, int ranks_per_node);

}  // namespace bagualu::plan

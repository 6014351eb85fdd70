// Whether a training run fits in the memory of the machine it starts on, checked before the
// model is built: the planner's bytes per rank (footprint.h, the same sizes the implementation
// allocates, within 1% of them in tests/unit/plan) times the ranks that share the machine,
// against what those ranks may still allocate (core/proc_memory.h: MemAvailable and the control
// groups' limits that Slurm and containers set). A run that cannot fit ends at once with one
// line, instead of being killed by the kernel once its pages are touched, minutes later and on
// one rank. train.check_memory = false skips it. The same for the checkpoints' disk space.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/proc_memory.h"
#include "plan/footprint.h"

namespace bagualu::plan {

// The footprint of cfg on `ranks` ranks, ranks_per_node to a node, `threads` compute threads a
// rank, and order_bytes of data order tables (plan::data_order_bytes, read once for all ranks),
// without the process baseline (already allocated, so already outside MemAvailable). Throws
// InputError where the planner cannot count the layout.
Footprint run_footprint(const TrainConfig& cfg, int ranks, int ranks_per_node, int threads,
                        uint64_t order_bytes);

// Throws InputError naming `where` (the config) when ranks_here x m.total() (a rank's bytes)
// exceed left.bytes.
void check_memory_fits(const Memory& m, const std::string& where, int ranks_here,
                       const MemoryLeft& left);

// Bytes of one checkpoint of a model of params_full parameters: the FP32 parameter, m and v of
// every parameter once, over all ranks (train/checkpointing.cpp; the manifest and the files'
// headers, a few KiB, aside); m and v of moment_bytes each (2: precision.moments = "bf16").
inline double checkpoint_bytes(uint64_t params_full, size_t moment_bytes = 4) {
    return (4.0 + 2.0 * static_cast<double>(moment_bytes)) * static_cast<double>(params_full);
}

// With checkpoint.every > 0, one checkpoint of `one` bytes against free_bytes on the checkpoint
// directory's file system (UINT64_MAX: unknown, not checked): throws InputError naming `dir` when
// it cannot fit (the first write would fail, hours into the run); returns a warning when the
// checkpoints kept (checkpoint.keep, and the one being written beside them; every one when
// keep = 0) cannot, else "".
std::string check_checkpoint_space(const TrainConfig& cfg, double one, const std::string& dir,
                                   uint64_t free_bytes);

}  // namespace bagualu::plan

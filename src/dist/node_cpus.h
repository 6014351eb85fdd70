// Core scheduling across the ranks of one machine. A launcher often gives several ranks the same
// CPU mask: OpenMPI binds to the socket (or NUMA node) from three ranks up, and not at all with
// --bind-to none or when oversubscribed. Each rank's compute pool would then take every CPU of
// the mask and pin its workers to the same first CPUs as the others': the ranks' spinning
// threads share cores and wait on the scheduler. The ranks that were given one and the same mask
// split it instead, each its own contiguous part (ranks in order, parts as equal as the count
// allows); with more such ranks than CPUs, each gets one CPU, shared in turn. Ranks whose masks
// differ keep theirs (a launcher that bound each rank to its cores, Slurm's --cpus-per-task).
#pragma once
#include <vector>

#include "dist/comm/comm.h"

namespace bagualu::dist {

// This rank's part of `mine` (ascending CPU numbers below CPU_SETSIZE): collective over `node`,
// the ranks on this machine (Comm::split_shared()); each of them calls it.
std::vector<int> node_cpu_share(Comm& node, const std::vector<int>& mine);

// The part of `cpus` (one mask, ascending) that the j-th of g ranks given it takes.
std::vector<int> cpu_part(const std::vector<int>& cpus, int j, int g);

}  // namespace bagualu::dist

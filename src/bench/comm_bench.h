// Communication benchmark: for message sizes min_bytes..max_bytes (x4 steps), times all-to-all(v)
// and reduce-scatter + all-gather two ways: the MPI library's (MPI_Reduce_scatter_block, sum, +
// MPI_Allgather) and ours (reduce_scatter_mean + all_gather, collectives.h). Reports medians over
// repeats (each repeat: the slowest rank) and bus bandwidth; rank 0 prints a table or one JSON
// object. Collective over `comm`. The CLI (`bagualu bench comm`) parses the options.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/proc_memory.h"
#include "dist/comm/comm.h"

namespace bagualu::bench {

struct CommBenchOptions {
    size_t min_bytes   = size_t{4} << 10;   // per-rank message size, first row
    size_t max_bytes   = size_t{64} << 20;  // last row (sizes grow x4)
    int repeats        = 10;                // timed runs per size and operation
    int warmup         = 2;                 // untimed runs first
    bool json          = false;             // one JSON object instead of the table
    int ranks_per_node = 0;                 // every R consecutive ranks a node; 0: shared memory
};

// Returns 0; prints on rank 0 only.
int run_comm_bench(dist::Comm& comm, const CommBenchOptions& options);

// Bytes one rank holds at once for the row of `bytes` on `ranks` ranks: the all-to-all's send
// and receive buffers, still held while the reduce-scatter's input, gathered output and shard
// are allocated. UINT64_MAX where that count would not fit in 64 bits.
uint64_t comm_bench_rank_bytes(size_t bytes, int ranks);

// Refuses a largest message of max_bytes that cannot run on `ranks` ranks, `ranks_here` of them
// on this machine, whose ranks may allocate `left` (core/proc_memory.h memory_left(): the least
// of MemAvailable and the cgroup limits' room; UINT64_MAX: unknown, not checked):
// byte counts beyond 64 bits, buffers beyond that memory, or, on several ranks, a block per rank
// beyond the int count of one MPI call. Throws InputError with the reason; the caller names the
// option. Not collective: the caller makes every rank end with one message.
void check_comm_bench_size(size_t max_bytes, int ranks, int ranks_here, const MemoryLeft& left);

}  // namespace bagualu::bench

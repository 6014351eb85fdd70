// Per-process tallies of what each kind of collective was asked to move: calls and payload bytes,
// counted where the call enters the communication layer (MpiComm, LocalComm, collectives.h).
// `bagualu plan` predicts the same numbers; a run reports them so the two can be compared exactly.
// Payload: allreduce and broadcast the buffer, allgather and scatter bytes_per_rank, alltoall(v)
// the sum of the send counts (the block to itself included), reduce-scatter the whole input,
// all_gather the whole output, sendrecv send_bytes. Our own collectives are built on sendrecv, so
// their hops are tallied under sendrecv as well as under their own kind. Relaxed atomics: cheap,
// thread-safe.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace bagualu::dist {

enum class CommKind {
    allreduce,              // Comm::allreduce_sum / allreduce_max
    allgather,              // Comm::allgather
    alltoall,               // Comm::alltoall (one count per peer)
    alltoallv,              // Comm::alltoallv_bytes
    broadcast,              // Comm::broadcast
    reduce_scatter_native,  // Comm::reduce_scatter_sum_native
    sendrecv,               // Comm::sendrecv
    reduce_scatter,         // collectives.h reduce_scatter_mean*
    all_gather,             // collectives.h all_gather
    scatter,                // Comm::scatter
};
inline constexpr size_t kNumCommKinds = 10;

const char* comm_kind_name(CommKind k);

struct CommCount {
    uint64_t calls = 0;
    uint64_t bytes = 0;
};

// A snapshot of the counters, indexed by CommKind.
struct CommTally {
    std::array<CommCount, kNumCommKinds> by_kind{};

    CommCount& operator[](CommKind k) { return by_kind[static_cast<size_t>(k)]; }
    const CommCount& operator[](CommKind k) const { return by_kind[static_cast<size_t>(k)]; }
    // Element-wise difference: what happened between two snapshots.
    CommTally operator-(const CommTally& o) const;
    CommTally operator+(const CommTally& o) const;
};

// Adds one call of `bytes` payload bytes to kind k.
void count_comm(CommKind k, uint64_t bytes);
// The counters since process start.
CommTally comm_tally();

// Bytes the expert-parallel all-to-alls (ParallelContext::ep_alltoallv) sent to ranks of other
// nodes since process start: what crosses the network, flat or hierarchical alike.
void count_inter_node_a2a(uint64_t bytes);
uint64_t inter_node_a2a_bytes();

}  // namespace bagualu::dist

// All-to-all(v) algorithms on top of Comm, with the semantics of Comm::alltoallv_bytes (counts
// and displacements [size()] in elements of elem_bytes bytes):
//   alltoallv_pairwise      P-1 sendrecv steps (r+k, r-k); any counts, also beyond INT_MAX.
//   alltoallv_hierarchical  gather to one leader per node, exchange between leaders, scatter
//                           within the node: fewer, larger inter-node messages.
// Neither knows anything about experts or tokens; dispatch builds the counts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dist/comm/comm.h"

namespace bagualu::dist {

void alltoallv_pairwise(Comm& comm, const void* send, std::span<const int64_t> send_counts,
                        std::span<const int64_t> send_displs, void* recv,
                        std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                        size_t elem_bytes);

// Node layout of one comm, built once (collective) and reused by every hierarchical call.
struct NodeGroups {
    std::unique_ptr<Comm> node;             // [not null] ranks of this node, node rank 0 leads
    std::unique_ptr<Comm> leaders;          // [not null on leaders only] one rank per node
    std::vector<int> node_of;               // [rank] -> node index (its leader's leaders rank)
    std::vector<int> node_rank_of;          // [rank] -> rank within its node
    std::vector<std::vector<int>> members;  // [node][node rank] -> rank
};

// node: the ranks to treat as one node; nullptr means comm.split_shared() (real nodes). Tests
// pass comm.split(rank / k, rank) to fake several nodes on one machine.
NodeGroups make_node_groups(Comm& comm, std::unique_ptr<Comm> node = nullptr);

void alltoallv_hierarchical(Comm& comm, NodeGroups& groups, const void* send,
                            std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_displs, void* recv,
                            std::span<const int64_t> recv_counts,
                            std::span<const int64_t> recv_displs, size_t elem_bytes);

}  // namespace bagualu::dist

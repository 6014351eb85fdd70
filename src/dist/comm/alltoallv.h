// All-to-all(v) algorithms on top of Comm, with the semantics of Comm::alltoallv_bytes (counts
// and displacements [size()] in elements of elem_bytes bytes):
//   alltoallv_pairwise      P-1 sendrecv steps (r+k, r-k); any counts, also beyond INT_MAX.
//   alltoallv_hierarchical  gather to one leader per node, exchange between leaders, scatter
//                           within the node: fewer, larger inter-node messages.
//   alltoallv_grid          two phases over a grid of G rows of S consecutive ranks: within the
//                           row, then within the column; S - 1 + G - 1 messages a rank instead
//                           of P - 1, each byte sent twice (for many ranks in few switch groups).
//   alltoall_bruck          equal blocks in ceil(log2 P) sendrecv steps (Bruck et al., 1997)
//                           instead of P-1, each forwarding about half of the blocks: for small
//                           blocks over many ranks, where the P-1 latencies dominate.
// Neither knows anything about experts or tokens; dispatch builds the counts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dist/comm/collectives.h"
#include "dist/comm/comm.h"

namespace bagualu::dist {

void alltoallv_pairwise(Comm& comm, const void* send, std::span<const int64_t> send_counts,
                        std::span<const int64_t> send_displs, void* recv,
                        std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                        size_t elem_bytes);

// send, recv: size() blocks of block_bytes, block i for / from rank i (as an all-to-all with
// equal counts). Blocks travel through intermediate ranks: round k (2^k < P) sends to rank
// r + 2^k the blocks whose offset (destination - r mod P) has bit k set and receives as many
// from r - 2^k, so the busiest rank sends about ceil(log2 P) * P / 2 blocks in all.
void alltoall_bruck(Comm& comm, const void* send, size_t block_bytes, void* recv);
// Whether an all-to-all of equal blocks of `block` bytes over P ranks runs alltoall_bruck rather
// than the direct exchange: forced by halving_doubling (parallel.collectives = "halving", the
// logarithmic algorithms), never under ring; automatic: over more than kRingMaxRanks ranks with
// blocks of at most kLatencyBoundShardBytes, where the direct exchange's P - 1 latencies dominate.
bool use_bruck(CollAlgo algo, int P, size_t block);
// Sendrecv steps and bytes one rank sends in alltoall_bruck over P ranks with blocks of `block`
// bytes (the planner's model; counted exactly by tests).
struct BruckTraffic {
    int hops          = 0;
    double sent_bytes = 0;
};
BruckTraffic bruck_traffic(int P, double block);

// The grid of a comm of P = G x S ranks: rank g * S + s sits in row g (the S consecutive ranks
// g * S ...) and column s (ranks s, S + s, ...). Built once (collective over the comm).
struct GridGroups {
    std::unique_ptr<Comm> row;  // [not null] this rank's row, ordered by s
    std::unique_ptr<Comm> col;  // [not null] this rank's column, ordered by g
};
// row_size must divide comm.size().
GridGroups make_grid_groups(Comm& comm, int row_size);
// The rows of the grid for an exchange over `ranks` ranks in switch groups of `group` ranks
// (parallel.a2a_grid): gcd(group, ranks), so that rows tile both; 0 when that leaves one phase
// (a gcd of 1, or of all the ranks): the direct exchange.
int grid_rows(int group, int ranks);

// The all-to-all(v) of the comm the grid was made of, in two phases. 1: inside the row, each
// rank sends to rank (g, s') everything bound for column s' (after exchanging those blocks'
// sizes); 2: inside the column, each rank forwards to (g', s) what it holds for it. Data
// movement only: recv is the same as the direct exchange's.
void alltoallv_grid(GridGroups& grid, const void* send, std::span<const int64_t> send_counts,
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
    // Leaders only, optional: the leaders' exchange runs alltoallv_grid over this grid of the
    // leaders comm instead of one direct exchange (parallel.a2a_grid).
    std::unique_ptr<GridGroups> leader_grid;
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

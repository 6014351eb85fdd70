// Our own reduce-scatter / all-gather, built on Comm::sendrecv, for flat arrays of any length n
// (n need not divide by P): rank r's shard is [n*r/P, n*(r+1)/P). The reduce-scatter computes
// the MEAN by online averaging: each hop folds `mean += (x - mean) * w` with w = (contributions
// in x) / (contributions so far), in float32 even for bf16/fp16 payloads, so the partial result
// never exceeds max|x| and cannot overflow where a sum would (1024 fp16 values near 60000).
// Payloads travel in their own dtype (bf16/fp16 halve the bytes); each hop rounds once.
// Does not do: gradient bucketing, overlap with compute, or sums (use Comm::allreduce_sum).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dist/comm/comm.h"

namespace bagualu::dist {

struct ShardInfo {
    size_t offset;
    size_t size;
};

// Elements [offset, offset + size) of an n-element array belong to `rank` of P.
ShardInfo shard_of(size_t n, int rank, int P);

// ring:             P-1 steps to the neighbour, any P; bandwidth-optimal, latency P-1 hops.
// halving_doubling: recursive halving (reduce-scatter) / doubling (all-gather), log2(P) steps
//                   between partners r ^ d when P is a power of two, same bytes as the ring.
//                   Other P: with p2 = bit_floor(P) and e = P - p2, ranks 2v and 2v+1 (v < e)
//                   act as one (virtual rank v, run by 2v+1; rank q >= 2e is virtual q - e):
//                   the reduce-scatter starts with 2v handing its array to 2v+1 (two hops,
//                   half by half), which folds it in, and ends with 2v+1 sending 2v its shard;
//                   the all-gather starts with 2v's shard going to 2v+1 and ends with 2v+1
//                   sending 2v the whole array. A virtual rank's fold weight is the share of
//                   contributions its partner's half stands for (1/2 over a power of two).
// automatic:        halving_doubling when P is a power of two and the whole array is at most
//                   kSmallMessageBytes, or when P > kRingMaxRanks and a shard is at most
//                   kLatencyBoundShardBytes (the ring's P-1 latencies then outweigh the second
//                   transfer of the whole array the pairs cost); else ring.
enum class CollAlgo { automatic, ring, halving_doubling };
constexpr size_t kSmallMessageBytes      = size_t{256} << 10;
constexpr int kRingMaxRanks              = 64;
constexpr size_t kLatencyBoundShardBytes = size_t{64} << 10;

// The algorithm a call over P ranks whose whole array is `bytes` runs (automatic resolved).
CollAlgo resolve_algo(CollAlgo algo, int P, size_t bytes);
// One call's traffic with the resolved algorithm over P ranks, an array of `bytes`: the most
// Comm::sendrecv hops a rank makes, the bytes through the busiest rank's link (received or
// sent, whichever is more), and the bytes a rank sends on the mean. Ring and power-of-two
// halving/doubling: P-1 or log2(P) hops, (P-1)/P of the array both ways; other P: log2(p2) + 3
// hops (reduce-scatter) or + 2 (all-gather), one more whole array through the pairs' links.
// `bagualu plan` counts and times the calls with it.
struct CollTraffic {
    int hops               = 0;
    double busiest_bytes   = 0;
    double mean_sent_bytes = 0;
};
CollTraffic coll_traffic(CollAlgo resolved, int P, double bytes, bool all_gather);

// in: (n) on every rank. out: (shard_of(n, rank, P).size), the mean over ranks of that shard.
// out may alias in's own shard (in-place use); it may not overlap the rest of in.
void reduce_scatter_mean(Comm& comm, std::span<const float> in, std::span<float> out,
                         CollAlgo algo = CollAlgo::automatic);
void reduce_scatter_mean_bf16(Comm& comm, std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo = CollAlgo::automatic);
void reduce_scatter_mean_fp16(Comm& comm, std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo = CollAlgo::automatic);

// shard: this rank's (shard_of(n, rank, P).size) elements. out: (n), every rank's shard in place.
// shard may already sit at its place inside out.
void all_gather(Comm& comm, std::span<const float> shard, std::span<float> out,
                CollAlgo algo = CollAlgo::automatic);
void all_gather(Comm& comm, std::span<const uint16_t> shard, std::span<uint16_t> out,
                CollAlgo algo = CollAlgo::automatic);

// In place: data (n) becomes the mean over ranks, identical bits on every rank.
// = reduce_scatter_mean into this rank's shard of data, then all_gather.
void allreduce_mean(Comm& comm, std::span<float> data, CollAlgo algo = CollAlgo::automatic);
void allreduce_mean_bf16(Comm& comm, std::span<uint16_t> data, CollAlgo algo = CollAlgo::automatic);
void allreduce_mean_fp16(Comm& comm, std::span<uint16_t> data, CollAlgo algo = CollAlgo::automatic);

// ---- over nodes ----
// The node layout of a comm: `nodes` nodes of `per_node` ranks each. The node comm holds this
// rank's node (ordered by rank), the cross comm the ranks with the same node rank (ordered by
// node). A comm whose nodes hold different numbers of its ranks is treated as one node.
struct NodeLayout {
    int nodes = 1, per_node = 1;
    std::unique_ptr<Comm> node, cross;  // [not null when nodes > 1]
    std::vector<int> members;           // [node * per_node + node rank] -> rank in the comm
};
// Collective over comm. node_id: any number naming this rank's node, equal exactly on the
// ranks of one node (the world rank of the node's first rank). Nodes are ordered by their
// lowest rank in comm.
NodeLayout make_node_layout(Comm& comm, int node_id);

// The mean over the ranks of a comm spanning several nodes (layout.nodes > 1) is defined as the
// mean over nodes (in node order, by the algorithm `algo` resolves to for N ranks and the
// node-rank's region) of the means inside each node (by the algorithm for per_node ranks and
// the whole array), whatever the traffic:
//   two_level = true:  reduce-scatter inside the node (each node rank gets the region of the
//                      ranks with its node rank), then across nodes among ranks with the same
//                      node rank; a rank sends (L-1)/L of the array inside its node and
//                      (N-1)/N of its region, 1/L of the array, across nodes.
//   two_level = false: one level: every rank sends each other rank that rank's shard directly
//                      (P-1 sendrecv hops, (P-1)/P of the array, as the ring), and the owner
//                      folds the P contributions in the order above. Costs a receive buffer of
//                      P shards and P-1 messages where halving/doubling would send log2(P).
// Both give the same bits. With one node both are the plain calls above (same bits as today).
// The all-gather has no arithmetic: two_level runs it across nodes, then inside the node.
void reduce_scatter_mean(Comm& comm, const NodeLayout& layout, bool two_level,
                         std::span<const float> in, std::span<float> out,
                         CollAlgo algo = CollAlgo::automatic);
void reduce_scatter_mean_bf16(Comm& comm, const NodeLayout& layout, bool two_level,
                              std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo = CollAlgo::automatic);
void reduce_scatter_mean_fp16(Comm& comm, const NodeLayout& layout, bool two_level,
                              std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo = CollAlgo::automatic);
void all_gather(Comm& comm, const NodeLayout& layout, bool two_level, std::span<const float> shard,
                std::span<float> out, CollAlgo algo = CollAlgo::automatic);
void all_gather(Comm& comm, const NodeLayout& layout, bool two_level,
                std::span<const uint16_t> shard, std::span<uint16_t> out,
                CollAlgo algo = CollAlgo::automatic);
void allreduce_mean(Comm& comm, const NodeLayout& layout, bool two_level, std::span<float> data,
                    CollAlgo algo = CollAlgo::automatic);

// The online-averaging fold on one buffer: out[i] = mean[i] + (x[i] - mean[i]) * w, computed in
// float32 (w = contributions in x / total contributions). out may alias mean or x elementwise.
void fold_mean(float* out, const float* mean, const float* x, size_t n, float w);
void fold_mean_bf16(uint16_t* out, const uint16_t* mean, const uint16_t* x, size_t n, float w);
void fold_mean_fp16(uint16_t* out, const uint16_t* mean, const uint16_t* x, size_t n, float w);

}  // namespace bagualu::dist

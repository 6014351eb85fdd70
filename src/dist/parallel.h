// The MoDa process layout: P ranks; each MoE layer's experts are spread over EP consecutive
// ranks (an expert-parallel group, `ep`), and the P/EP groups are data-parallel replicas of each
// other: ranks holding the same experts form an expert-data-parallel group (`edp`).
// Dense parameters are replicated on all P ranks (data parallel over `world`).
//   ep_rank  = rank % EP     edp_rank = rank / EP
//   rank r holds global experts [ep_rank * E/EP, (ep_rank + 1) * E/EP) of every MoE layer.
// Nodes: from the MPI shared-memory split, or every ranks_per_node consecutive ranks (tests);
// the node layouts of world and edp (node and cross-node comms) serve the two-level collectives.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "config/enums.h"
#include "dist/comm/alltoallv.h"
#include "dist/comm/collectives.h"
#include "dist/comm/comm.h"

namespace bagualu::dist {

// parallel.collectives as the algorithm our collectives take (collectives.h).
inline CollAlgo coll_algo_of(Collectives c) {
    return c == Collectives::ring      ? CollAlgo::ring
           : c == Collectives::halving ? CollAlgo::halving_doubling
                                       : CollAlgo::automatic;
}

class ParallelContext {
   public:
    // Collective over world. ep_size must divide world.size().
    ParallelContext(Comm& world, int ep_size, bool hierarchical_a2a);
    // ranks_per_node: 0 = the shared-memory split (real nodes), else every ranks_per_node
    // consecutive ranks form a node. hierarchical_a2a: "auto" = when the world spans more than
    // one node. reduce_group: the first level of the two-level reductions, every reduce_group
    // consecutive ranks (0 = the node); two_level: "auto" = when there is more than one.
    ParallelContext(Comm& world, int ep_size, NodeSwitch hierarchical_a2a, int ranks_per_node,
                    NodeSwitch two_level, int reduce_group = 0);
    // A single process: every group is the process itself.
    static std::unique_ptr<ParallelContext> single();

    Comm& world() { return *world_; }
    Comm& ep() { return *ep_; }
    Comm& edp() { return *edp_; }
    int rank() const { return rank_; }
    int size() const { return size_; }
    int ep_size() const { return ep_size_; }
    int ep_rank() const { return ep_rank_; }
    int edp_size() const { return size_ / ep_size_; }
    int edp_rank() const { return rank_ / ep_size_; }

    // The first-level groups of the two-level reductions (the nodes unless reduce_group): how
    // many, 1 when they differ in size
    int nodes() const { return world_nodes_.nodes; }
    // The nodes when the world spans several, each of as many consecutive ranks (0 otherwise):
    // then data.readers = auto gives one reader a node.
    int consecutive_nodes() const { return consecutive_nodes_; }
    // Whether those groups are parallel.reduce_group's rather than the nodes
    bool reduce_groups() const { return reduce_groups_; }
    bool two_level() const { return two_level_; }
    bool hierarchical_a2a() const { return hierarchical_; }
    // The nodes of the expert-parallel group (EP > 1; nullptr for EP = 1): its node comm, and
    // each EP rank's node and rank within it (the node-deduplicated dispatch, node_dispatcher.h).
    NodeGroups* ep_nodes() { return ep_nodes_.get(); }
    // parallel.node_dedup resolved by the caller: the MoE layers exchange tokens once per node
    // (moe/node_dispatcher.h). Off by default; needs EP > 1.
    void set_node_dedup(bool on) { node_dedup_ = on && ep_nodes_ != nullptr; }
    // parallel.collectives: the algorithm of the optimizers' reduce-scatters, all-gathers and
    // all-reduces (collectives.h); automatic unless set.
    void set_collectives(Collectives c) { coll_algo_ = coll_algo_of(c); }
    // Ranks of the expert all-to-all's exchange: the EP group's nodes (their leaders) when the
    // all-to-all is hierarchical, else the EP group.
    int a2a_exchange_ranks() const { return hierarchical_ ? ep_node_count() : ep_size_; }
    // parallel.a2a_grid: switch groups of `group` exchange ranks; that exchange then runs in two
    // phases over rows of dist::grid_rows(group, a2a_exchange_ranks()) ranks
    // (dist::alltoallv_grid). Collective over the world; no grid with EP = 1.
    void set_a2a_grid(int group);
    // The grid's rows in use, 0 = the direct exchange.
    int a2a_grid() const { return a2a_grid_; }
    CollAlgo coll_algo() const { return coll_algo_; }
    bool node_dedup() const { return node_dedup_; }
    // Nodes the expert-parallel group spans (1 for EP = 1).
    int ep_node_count() const {
        return ep_nodes_ ? static_cast<int>(ep_nodes_->members.size()) : 1;
    }
    const NodeLayout& world_nodes() const { return world_nodes_; }
    const NodeLayout& edp_nodes() const { return edp_nodes_; }

    // All-to-all(v) over the expert-parallel group, flat or hierarchical per the config. The
    // bytes sent to ranks of other nodes are tallied (counters.h inter_node_a2a_bytes).
    void ep_alltoallv(const void* send, std::span<const int64_t> send_counts,
                      std::span<const int64_t> send_displs, void* recv,
                      std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                      size_t elem_bytes);

   private:
    ParallelContext() = default;
    Comm* world_      = nullptr;            // [not null]
    std::unique_ptr<Comm> owned_world_;     // only for single()
    std::unique_ptr<Comm> ep_, edp_;        // [not null]
    std::unique_ptr<NodeGroups> ep_nodes_;  // [not null iff EP > 1]
    std::unique_ptr<GridGroups> ep_grid_;   // flat exchange over a grid (set_a2a_grid)
    int a2a_grid_      = 0;
    bool hierarchical_ = false, node_dedup_ = false;
    int consecutive_nodes_ = 0;
    CollAlgo coll_algo_    = CollAlgo::automatic;
    NodeLayout world_nodes_, edp_nodes_;
    bool two_level_ = false, reduce_groups_ = false;
    int rank_ = 0, size_ = 1, ep_size_ = 1, ep_rank_ = 0;
};

}  // namespace bagualu::dist

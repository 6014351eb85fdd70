#include "dist/parallel.h"

#include "core/error.h"
#include "dist/comm/counters.h"

namespace bagualu::dist {

ParallelContext::ParallelContext(Comm& world, int ep_size, bool hierarchical_a2a)
    : ParallelContext(world, ep_size, hierarchical_a2a ? NodeSwitch::on : NodeSwitch::off, 0,
                      NodeSwitch::off) {}

ParallelContext::ParallelContext(Comm& world, int ep_size, NodeSwitch hierarchical_a2a,
                                 int ranks_per_node, NodeSwitch two_level, int reduce_group)
    : world_(&world), rank_(world.rank()), size_(world.size()), ep_size_(ep_size) {
    BGL_CHECK(ep_size >= 1 && size_ % ep_size == 0, "EP {} does not divide {} ranks", ep_size,
              size_);
    BGL_CHECK(ranks_per_node >= 0 && (ranks_per_node == 0 || size_ % ranks_per_node == 0),
              "{} ranks per node do not divide {} ranks", ranks_per_node, size_);
    BGL_CHECK(reduce_group >= 0 && (reduce_group == 0 || size_ % reduce_group == 0),
              "reduction groups of {} ranks do not divide {} ranks", reduce_group, size_);
    ep_rank_ = rank_ % ep_size;
    ep_      = world.split(rank_ / ep_size, rank_);
    edp_     = world.split(rank_ % ep_size, rank_);
    // a node is named by the world rank of its first rank
    int node_id = rank_ - (ranks_per_node > 0 ? rank_ % ranks_per_node : 0);
    if (ranks_per_node == 0) world.split_shared()->broadcast(&node_id, sizeof(int), 0);
    // the reductions' first level: the node, or reduce_group consecutive ranks
    reduce_groups_      = reduce_group > 0;
    const int reduce_id = reduce_groups_ ? rank_ - rank_ % reduce_group : node_id;
    world_nodes_        = make_node_layout(world, reduce_id);
    edp_nodes_          = make_node_layout(*edp_, reduce_id);
    two_level_          = switch_on(two_level, world_nodes_.nodes > 1);
    // the all-to-all follows the real nodes (unequal ones counting as one, as for the
    // reductions): their layout is the reductions' unless reduce_group replaced it
    NodeLayout own;
    if (reduce_groups_) own = make_node_layout(world, node_id);
    const NodeLayout& real = reduce_groups_ ? own : world_nodes_;
    const bool multi       = real.nodes > 1;
    // nodes of consecutive ranks (as mpirun places them by default): data.readers = auto's
    bool consecutive = true;
    for (size_t q = 0; q < real.members.size(); ++q) consecutive &= real.members[q] == int(q);
    consecutive_nodes_ = multi && consecutive ? real.nodes : 0;
    const bool hier    = switch_on(hierarchical_a2a, multi);
    if (ep_size > 1) {
        ep_nodes_ =
            std::make_unique<NodeGroups>(make_node_groups(*ep_, ep_->split(node_id, ep_->rank())));
        hierarchical_ = hier;
    }
}

std::unique_ptr<ParallelContext> ParallelContext::single() {
    std::unique_ptr<ParallelContext> p(new ParallelContext());
    p->owned_world_         = make_local_comm();
    p->world_               = p->owned_world_.get();
    p->ep_                  = make_local_comm();
    p->edp_                 = make_local_comm();
    p->world_nodes_.members = {0};
    p->edp_nodes_.members   = {0};
    return p;
}

void ParallelContext::set_a2a_grid(int group) {
    const int rows = grid_rows(group, a2a_exchange_ranks());
    if (rows == 0 || !ep_nodes_) return;
    a2a_grid_ = rows;
    if (!hierarchical_) {
        ep_grid_ = std::make_unique<GridGroups>(make_grid_groups(*ep_, rows));
    } else if (ep_nodes_->leaders) {
        ep_nodes_->leader_grid =
            std::make_unique<GridGroups>(make_grid_groups(*ep_nodes_->leaders, rows));
    }
}

void ParallelContext::ep_alltoallv(const void* send, std::span<const int64_t> send_counts,
                                   std::span<const int64_t> send_displs, void* recv,
                                   std::span<const int64_t> recv_counts,
                                   std::span<const int64_t> recv_displs, size_t elem_bytes) {
    if (ep_nodes_) {
        const auto& node_of = ep_nodes_->node_of;
        const int mine      = node_of[static_cast<size_t>(ep_rank_)];
        int64_t away        = 0;
        for (size_t q = 0; q < send_counts.size(); ++q) {
            if (node_of[q] != mine) away += send_counts[q];
        }
        count_inter_node_a2a(static_cast<uint64_t>(away) * elem_bytes);
    }
    if (hierarchical_) {
        alltoallv_hierarchical(*ep_, *ep_nodes_, send, send_counts, send_displs, recv, recv_counts,
                               recv_displs, elem_bytes);
    } else if (ep_grid_) {
        alltoallv_grid(*ep_grid_, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                       elem_bytes);
    } else {
        ep_->alltoallv_bytes(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                             elem_bytes);
    }
}

}  // namespace bagualu::dist

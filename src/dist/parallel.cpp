#include "dist/parallel.h"

#include "core/error.h"

namespace bagualu::dist {

ParallelContext::ParallelContext(Comm& world, int ep_size, bool hierarchical_a2a)
    : world_(&world), rank_(world.rank()), size_(world.size()), ep_size_(ep_size) {
    BGL_CHECK(ep_size >= 1 && size_ % ep_size == 0, "EP {} does not divide {} ranks", ep_size, size_);
    ep_rank_ = rank_ % ep_size;
    ep_      = world.split(rank_ / ep_size, rank_);
    edp_     = world.split(rank_ % ep_size, rank_);
    if (hierarchical_a2a && ep_size > 1) ep_nodes_ = std::make_unique<NodeGroups>(make_node_groups(*ep_));
}

std::unique_ptr<ParallelContext> ParallelContext::single() {
    std::unique_ptr<ParallelContext> p(new ParallelContext());
    p->owned_world_ = make_local_comm();
    p->world_       = p->owned_world_.get();
    p->ep_          = make_local_comm();
    p->edp_         = make_local_comm();
    return p;
}

void ParallelContext::ep_alltoallv(const void* send, std::span<const int64_t> send_counts,
                                   std::span<const int64_t> send_displs, void* recv,
                                   std::span<const int64_t> recv_counts,
                                   std::span<const int64_t> recv_displs, size_t elem_bytes) {
    if (ep_nodes_) {
        alltoallv_hierarchical(*ep_, *ep_nodes_, send, send_counts, send_displs, recv, recv_counts,
                               recv_displs, elem_bytes);
    } else {
        ep_->alltoallv_bytes(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                             elem_bytes);
    }
}

}  // namespace bagualu::dist

// The node-deduplicated exchange of an MoE layer (parallel.node_dedup), for an expert-parallel
// group spread over several nodes. TokenDispatcher sends a token once per routed slot, so a
// token with two experts on node B crosses the network to B twice. Here it crosses once:
//   stage 1 (EP all-to-all)   rank s sends each token once to every node b holding one of its
//                             experts, to s's relay on b (b's rank whose rank within b is s's
//                             rank within its node, modulo b's size), with the token's slots
//                             on b: expert ids and gate weights;
//   stage 2 (node all-to-all) the relay copies the row to the ranks of its node holding those
//                             experts, which order their rows [local expert][source][token]
//                             exactly as TokenDispatcher does;
//   combine                   the expert outputs go back to the relay, which sums its slots'
//                             weighted outputs (sum_k w_k y_k in slot order, in float32) and
//                             sends one row per token home, where the token's rows from its
//                             nodes are added in relay order.
// Backward makes the same moves: the output gradient crosses once per node (float32); the relay
// computes dprobs_k = <dout, y_k> from the outputs it kept and dy_k = w_k dout (rounded to the
// payload type, as the layer rounds dy); the experts' input gradients come back summed per node,
// with the dprobs.
// The experts get exactly TokenDispatcher's rows in its order, so their outputs and weight
// gradients are bitwise the same. A token whose slots all live on one node (model.route_nodes =
// 1) gets bitwise the same output and input gradient as through unpermute / permute_backward
// (dispatch.h); a token spread over several nodes differs only in the order of its per-node sums.
// One round only: the layer uses TokenDispatcher when more rows arrive than its budget. The
// relay's buffers follow what it serves (grown, never shrunk).
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "dist/parallel.h"

namespace bagualu::moe {

class NodeDispatcher {
   public:
    // E global experts, top-K slots per token, C floats per row. par.ep_size() > 1.
    NodeDispatcher(dist::ParallelContext& par, int E, int K, int C);

    // Plans one micro-batch from this rank's routing: expert_idx, probs (N, K), -1 = dropped.
    // Collective over the expert-parallel group.
    void plan(const int32_t* expert_idx, const float* probs, int N);
    // The offsets (El + 1) of the rows each local expert receives.
    const int32_t* local_offsets() const { return local_offsets_.data(); }

    // x (N, C) tokens -> x_local (local_rows, C), rows in the payload type (dtype.h to_half).
    void dispatch(float* x_local, const float* x, Dtype payload);
    // y_local (local_rows, C) -> out (N, C) = sum_k probs[t, k] y_k, overwritten. y travels to
    // the relays in the payload type (exact when it holds its values), the sums in float32.
    void combine(float* out, const float* y_local, Dtype payload);
    // dout (N, C) -> dy_local (local_rows, C): probs[t, k] dout[t] rounded to payload.
    void dispatch_grad(float* dy_local, const float* dout, Dtype payload);
    // dx_local (local_rows, C) -> dx (N, C) = sum_k dx_k, overwritten, and dprobs (N, K) =
    // <dout[t], y_k> (0 for dropped slots), overwritten.
    void combine_grad(float* dx, float* dprobs, const float* dx_local, Dtype payload);

   private:
    // An all-to-all of rows of `width` floats, blocks in rank order: over the EP group (counted
    // as inter-node where it crosses) or over this node's ranks. Half payloads round each value.
    void move(bool ep, const float* send, const std::vector<int64_t>& send_rows, float* recv,
              const std::vector<int64_t>& recv_rows, int width, Dtype payload);
    // Stage 1 of a token move: each entry's token row of x (N, C) to its relay; returns the
    // relay's received rows (one per entry it serves).
    const float* send_tokens(const float* x, Dtype payload);
    // Stage 2 to the experts: the relay's rows in s2_ (stage-2 send layout) to the ranks of its
    // node, placed into dst_local (local_rows, C) in the experts' order.
    void deliver(float* dst_local, Dtype payload);
    // Stage 2 back: the experts' rows src_local (local_rows, C) to their relays, into dst (grown
    // to the stage-2 send layout); returns dst's data.
    float* collect(std::vector<float>& dst, const float* src_local, Dtype payload);
    // out (N, C) = for each token, the sum (from zero, in relay order) of the first C floats of
    // its entries' rows of `back` (rows of `width` floats, in entry order).
    void add_home(float* out, const float* back, size_t width) const;

    dist::ParallelContext& par_;
    dist::NodeGroups& nodes_;
    int El_, K_, C_, P_, my_node_, L_;  // L_: ranks of this node
    int n_ = 0;
    // source side
    std::vector<int> relay_of_node_;                // [nodes] EP rank
    std::vector<int64_t> send1_rows_, recv1_rows_;  // [P] entries to / from each rank
    std::vector<int32_t> ent_tok_;                  // [entries sent] token of each entry
    std::vector<int32_t> tok_ent_start_, tok_ent_;  // CSR [N + 1]: a token's entries
    std::vector<int32_t> slot_ent_;                 // [N * K] entry of each slot, or -1
    std::vector<int32_t> meta_send_;                // [entries sent * 2K] experts, weights
    // relay side
    std::vector<int32_t> meta_recv_;                // [entries received * 2K]
    std::vector<int64_t> pos2_;                     // [entries received * K] stage-2 row
    std::vector<int64_t> send2_rows_, recv2_rows_;  // [L] rows to / from each node rank
    std::vector<int64_t> cnt2_, rcnt2_;             // [L * P * El]
    std::vector<float> dprobs_rel_;                 // [entries received * K]
    // expert side: (row in the stage-2 receive buffer, local row, rows) per (expert, source)
    struct Block {
        int64_t src = 0, dst = 0, n = 0;
    };
    std::vector<Block> blocks_;
    std::vector<int32_t> local_offsets_;  // [El + 1]
    // row buffers, grown as needed
    std::vector<float> s1_, r1_, s2_, r2_, ykept_;
    std::vector<uint16_t> h_send_, h_recv_;
    // plan and move scratch, kept so that a step allocates nothing once the sizes are reached
    std::vector<int32_t> stamp_, entry_at_;
    std::vector<int64_t> cursor_, next_, pe_, ped_, at_, sc_, sd_, rc_, rd_;
};

}  // namespace bagualu::moe

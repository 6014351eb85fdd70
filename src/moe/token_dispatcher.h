// Moves routed token rows between the ranks of an expert-parallel group (EP > 1), in the
// Megatron stages, local steps apart from the communication:
//   dispatch_preprocess  exchange per-expert counts (all-to-all in the EP group: each peer
//                        gets the counts of its own experts), derive
//                        send/recv counts and the local experts' row offsets
//   token_dispatch       all-to-all: rows for global experts of peer q go to q
//   dispatch_postprocess reorder received rows from [source][local expert] to
//                        [local expert][source], so each local expert's rows are contiguous
//   combine_preprocess / token_combine: the exact reverse, bringing expert outputs home.
// Row order inside a (source, expert) chunk is preserved, so combine(dispatch(x)) == x.
// Backward uses the same two moves on gradients: d(dispatch) = combine and vice versa.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "dist/parallel.h"

namespace bagualu::moe {

class TokenDispatcher {
   public:
    // E global experts, C floats per row, max_rows rows this rank sends at most (N*K),
    // max_recv rows it can receive at most (moe_layer.h max_local_rows; 0: EP * max_rows).
    TokenDispatcher(dist::ParallelContext& par, int E, int C, int max_rows, int64_t max_recv = 0);

    // tokens_per_expert: (E) this rank's rows per global expert, in the permuted order.
    void dispatch_preprocess(const int32_t* tokens_per_expert);
    // Rows received for the local experts, and their offsets (E_local + 1).
    int            local_rows() const { return local_offsets_.back(); }
    const int32_t* local_offsets() const { return local_offsets_.data(); }
    // Most rows that can arrive.
    int64_t max_local_rows() const { return max_recv_; }

    // x_perm: (sum tokens_per_expert, C) expert-major over global experts.
    // x_local: (local_rows, C) expert-major over local experts.
    // payload: the dtype rows travel in; bf16 / fp16 halve the bytes and round each value to
    // that type (exact when the rows already hold its values).
    void dispatch(float* x_local, const float* x_perm, Dtype payload = Dtype::float32);
    // The reverse: y_local (local_rows, C) -> y_perm (sum tokens_per_expert, C).
    void combine(float* y_perm, const float* y_local, Dtype payload = Dtype::float32);

   private:
    dist::ParallelContext& par_;
    int                    E_, El_, C_, max_rows_, ep_size_;
    int64_t                max_recv_;
    std::vector<int64_t>   mine_;             // [E] this rank's rows per global expert
    std::vector<int64_t>   counts_;           // [ep_size * El] rows from rank s to local expert e
    std::vector<int64_t>   count_counts_, count_displs_;  // [ep_size]: El each, q * El
    std::vector<int64_t>   send_counts_, send_displs_, recv_counts_, recv_displs_;  // [ep_size], floats
    std::vector<int32_t>   local_offsets_;    // [El + 1]
    Buffer<float>          staging_;          // (max(max_recv, max_rows), C), [source][local expert] order
    Buffer<uint16_t>       send16_, recv16_;  // half payloads, as large as staging_
    void exchange_half(const float* send, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& send_displs, float* recv,
                       const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& recv_displs, Dtype payload);
};

}  // namespace bagualu::moe

// Moves routed token rows between the ranks of an expert-parallel group (EP > 1), in the
// Megatron stages, local steps apart from the communication:
//   dispatch_preprocess  exchange per-expert counts (all-to-all in the EP group: each peer
//                        gets the counts of its own experts) and all-reduce the largest receipt;
//                        only when it exceeds the budget, send back to every source where its
//                        rows start in each expert's sequence and the expert's total, and cut
//                        every rank's received rows into rounds (RowRounds)
//   set_round            the send/recv counts and the local experts' row offsets of one round
//   token_dispatch       all-to-all: rows of the round for global experts of peer q go to q
//   dispatch_postprocess reorder received rows from [source][local expert] to
//                        [local expert][source], so each local expert's rows are contiguous
//   combine_preprocess / token_combine: the exact reverse, bringing expert outputs home.
// Row order inside a (source, expert) chunk is preserved, so combine(dispatch(x)) == x.
// Backward uses the same two moves on gradients: d(dispatch) = combine and vice versa.
//
// Rounds bound the memory: a rank receives at most `budget` rows per round whatever the routing.
// Expert e's rows, in source order, form one sequence (the order of a single round); round r
// takes the next contiguous piece of it, starting at a multiple of `block` rows, so each
// expert's rows reach the experts in the same order and weight-gradient blocks whatever the
// budget. Every rank then learns every expert's total, so all agree on the number of rounds
// without a further collective.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "dist/parallel.h"

namespace bagualu::moe {

// The cut of one rank's local experts' row sequences into rounds, with no communication.
// Round r takes, for local experts e = 0, 1, ... in turn, the rest of e's rows if they fit in
// what is left of `budget`, else as many whole blocks of `block` rows as fit: so every piece
// starts at a multiple of `block` of its expert's sequence. Needs budget >= block.
class RowRounds {
   public:
    RowRounds() = default;
    // totals: (El) rows of each local expert over all sources.
    void reset(const int64_t* totals, int El, int64_t budget, int64_t block);
    // Rounds needed in all (>= 1; 1 when every row fits).
    int rounds() const { return rounds_; }
    // Moves to round r: 0 or the round after the current one.
    void set_round(int r);
    // Of the current round, expert e's piece [lo(e), hi(e)) of its sequence.
    int64_t lo(int e) const { return lo_[static_cast<size_t>(e)]; }
    int64_t hi(int e) const { return hi_[static_cast<size_t>(e)]; }

   private:
    void advance();
    std::vector<int64_t> totals_, lo_, hi_;  // [El]
    int64_t budget_ = 0, block_ = 1;
    int rounds_ = 1, round_ = -1;
};

// Seconds the expert all-to-alls of this process took since the last reset: raw, inside the
// row exchanges on whichever thread ran them; exposed, the part the computing thread spent
// in them or waiting for them (moe_layer.cpp adds its waits on overlapped chunks).
// pieces: the exchanges of pieces (dispatch_chunk / combine_chunk) among them; beside_shared:
// the dispatches that ran while the shared experts computed (moe_layer.h).
struct A2aSeconds {
    double raw = 0, exposed = 0;
    int64_t pieces = 0, beside_shared = 0;
};
A2aSeconds a2a_seconds();
void reset_a2a_seconds();
void add_a2a_seconds(double raw, double exposed);
void count_dispatch_beside_shared();

class TokenDispatcher {
   public:
    // E global experts, C floats per row, max_rows rows this rank sends at most (N*K),
    // budget rows it receives per round (moe_layer.h moe_rows_budget), block the rows of an
    // expert's weight-gradient block (rounds start on multiples of it; budget >= block).
    // chunks: pieces a round is cut into for overlap (1 = none; see chunks()).
    TokenDispatcher(dist::ParallelContext& par, int E, int C, int max_rows, int64_t budget,
                    int64_t block, int chunks = 1);

    // tokens_per_expert: (E) this rank's rows per global expert, in the permuted order.
    // Afterwards the dispatcher is at round 0.
    void dispatch_preprocess(const int32_t* tokens_per_expert);
    // Rounds this micro-batch needs, the same on every rank of the EP group.
    int rounds() const { return rounds_; }
    // With chunks > 1 (constructor) and one round: the pieces the round is cut into, so that
    // the exchange of one overlaps the experts of another (moe_layer.h); 1 otherwise. Chunk c
    // has its own region of rows [chunk_base(c), + chunk_offsets(c)[El]) in the local buffers.
    int chunks() const { return n_chunks_; }
    int64_t chunk_base(int c) const { return chunks_[static_cast<size_t>(c)].recv_base; }
    const int32_t* chunk_offsets(int c) const {
        return chunks_[static_cast<size_t>(c)].offsets.data();
    }
    // dispatch / combine of chunk c alone: x_local and y_local are the whole buffers (the chunk's
    // rows go to or come from its region), x_perm / y_perm as for dispatch / combine. Chunks
    // may be exchanged on another thread than the one computing, one exchange at a time.
    void dispatch_chunk(int c, float* x_local, const float* x_perm, Dtype payload);
    void combine_chunk(int c, float* y_perm, const float* y_local, Dtype payload);
    // Moves to round r (0 or the one after the current).
    void set_round(int r);
    // Rows received for the local experts in the current round, and their offsets (E_local + 1).
    int local_rows() const { return local_offsets_.back(); }
    const int32_t* local_offsets() const { return local_offsets_.data(); }
    // Most rows that can arrive in one round.
    int64_t budget() const { return budget_; }

    // x_perm: (sum tokens_per_expert, C) expert-major over global experts; the current round's
    // rows of it are sent. x_local: (local_rows, C) expert-major over local experts.
    // payload: the dtype rows travel in; bf16 / fp16 halve the bytes and round each value to
    // that type (exact when the rows already hold its values).
    // exposed: whether the seconds count as exposed (false on a helper thread, whose waiter
    // counts its own wait).
    void dispatch(float* x_local, const float* x_perm, Dtype payload = Dtype::float32,
                  bool exposed = true);
    // The reverse: y_local (local_rows, C) -> the current round's rows of y_perm.
    void combine(float* y_perm, const float* y_local, Dtype payload = Dtype::float32);

   private:
    dist::ParallelContext& par_;
    int E_, El_, C_, max_rows_, ep_size_;
    int64_t budget_, block_;
    int rounds_ = 1;
    std::vector<int64_t> mine_;    // [E] this rank's rows per global expert
    std::vector<int64_t> counts_;  // [ep_size * El] rows from rank s to local expert e
    std::vector<int64_t> count_counts_, count_displs_;  // [ep_size]: El each, q * El
    std::vector<int64_t> starts_out_, starts_in_;       // [2 E]: (start, total) per expert, out: of
                                                        // each source in my experts, in: mine
    std::vector<int64_t> pair_counts_, pair_displs_;    // [ep_size]: 2 El each, 2 q El
    std::vector<RowRounds> peer_rounds_;  // [ep_size] the rounds of each peer's experts
    std::vector<int64_t> round_counts_;   // [ep_size * El] rows from s to e this round
    std::vector<int64_t> send_rows_;      // [E] this round: first row (x_perm) and count
    std::vector<int64_t> send_first_;     //     per global expert of what this rank sends
    std::vector<int64_t> send_counts_, send_displs_, recv_counts_,
        recv_displs_;                     // [ep_size], floats
    std::vector<int32_t> local_offsets_;  // [El + 1]
    Buffer<float> staging_;               // (budget, C), [source][local expert] order
    Buffer<float> send_staging_;          // (max_rows, C), a round's outgoing rows (rounds > 1)
    Buffer<uint16_t> send16_, recv16_;    // half payloads, as large as the larger staging
    // the pieces of a round (plan_chunks): a piece's plan and where its rows sit in the send
    // staging (send_base) and in the receive staging and local buffers (recv_base), in rows
    struct Chunk {
        std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;  // [ep_size]
        std::vector<int64_t> send_rows, send_first;                               // [E]
        std::vector<int64_t> round_counts;                                        // [ep * El]
        std::vector<int32_t> offsets;                                             // [El + 1]
        int64_t send_base = 0, recv_base = 0;
    };
    int chunks_wanted_ = 1, n_chunks_ = 1;
    std::vector<Chunk> chunks_;
    int plan_peer_rounds(int64_t budget);
    void plan_chunks(int64_t most);
    void plan_piece(int r);
    void set_recv_counts();
    void gather_send(float* dst, const float* x_perm, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& first) const;
    void scatter_back(float* y_perm, const float* src, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& first) const;
    // The all-to-all of float rows, in the payload's type (timed: a2a_seconds()).
    void exchange(const float* send, const std::vector<int64_t>& send_counts,
                  const std::vector<int64_t>& send_displs, float* recv,
                  const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                  Dtype payload);
    void exchange_half(const float* send, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& send_displs, float* recv,
                       const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& recv_displs, Dtype payload);
};

}  // namespace bagualu::moe

// One MoE feed-forward layer:
//   forward:  router (gate, capacity / SWIPE) -> routing -> permute -> shared experts
//             -> [dispatch] -> experts -> [combine] -> unpermute (weighted sum; dropped slots
//             contribute nothing) + the shared experts' outputs
//   backward: the same steps in reverse order.
// The experts' rows go through buffers of a fixed budget of rows per rank (moe_rows_budget);
// when more rows than that arrive, the experts run in several rounds through the same buffers
// (token_dispatcher.h), and backward recomputes each round's expert forward instead of saving
// it. Results are bitwise the same for any budget (docs/parallelism.md, "Bounded MoE memory").
// With parallel.node_dedup, a forward whose rows take one round, unpieced, moves each token once
// per node instead (node_dispatcher.h): the experts compute the very same rows.
// The S shared experts (model.n_shared_experts) are FFNs every token passes through, replicated
// on every rank. With MoEShape::overlap_shared and a helper thread, they compute while the
// routed rows travel (forward; and backward with S = 1), with bitwise the same results.
// With expert parallelism (EP > 1) this rank holds E/EP of the E experts; dispatch/combine are
// the all-to-all moves of TokenDispatcher. The Router (router.h) sums its statistics over all
// ranks, so the aux loss is the same number on every rank and for any layout.
// Owns the state saved between forward and backward, sized once for max_tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "core/helper_thread.h"
#include "dist/parallel.h"
#include "moe/experts.h"
#include "moe/node_dispatcher.h"
#include "moe/router.h"
#include "moe/token_dispatcher.h"

namespace bagualu::moe {

struct MoEWeights {
    const float* gate_w  = nullptr;  // (E, C), no bias
    const float* noise_w = nullptr;  // (E, C), noisy gate only
    ExpertWeights experts;           // the local experts
    ExpertWeights shared;            // the S shared experts (S > 0 only)
};
struct MoEGrads {
    float* gate_w  = nullptr;
    float* noise_w = nullptr;
    ExpertGrads experts;
    ExpertGrads shared;
};

struct MoEShape {
    int C = 0, F = 0, E = 0, K = 0;
    double aux_coef    = 0;
    GateConfig gate    = {};
    double rows_budget = 0;    // model.moe_rows_budget: see moe_rows_budget; 0 = unbounded
    int n_shared = 0, FS = 0;  // shared experts S and their width
    // parallel.a2a_chunks: with EP > 1 and one round, the round's all-to-all is cut into about
    // this many pieces, each exchanged while the experts compute another (1 = no overlap)
    int a2a_chunks = 1;
    // parallel.overlap_shared (with S > 0): with EP > 1, one round and one piece, the plain
    // dispatch runs on the helper thread (set_a2a_helper) while the shared experts compute
    bool overlap_shared = false;
    // Rounding of the experts' GEMM operands and outputs (model/precision.h); with a half
    // prec.act the expert pre-activations are kept in 16 bits. The all-to-all carries rows in the
    // half type wherever they already hold its values: tokens and output gradients going to the
    // experts at O1 and up, expert outputs and input gradients coming back at O2 and up, so
    // EP > 1 computes what one process does.
    ExpertPrecision prec = {};
};

// The most routed rows the local experts of one rank can receive in one micro-batch of
// max_tokens tokens per rank, EP ranks per expert-parallel group: every routed row of the group
// arriving at this rank (EP * max_tokens * K).
int64_t max_local_rows(int64_t max_tokens, int K, int ep);

// The rows the local experts of one rank receive per round, which sizes every buffer of the
// dispatch, the experts and the combine: ceil(rows_budget * max_tokens * K), rows_budget being a
// multiple of the balanced load (each rank sends max_tokens * K rows, and receives as many when
// the routing is balanced, as SWIPE makes it in training), raised to kMaxTnDepthBlock (a round
// holds at least one weight-gradient block) and capped at max_local_rows (one round always
// suffices there). rows_budget <= 0: max_local_rows, the unbounded sizing.
// MoELayer and TokenDispatcher size their buffers with it; bagualu plan counts them with it.
int64_t moe_rows_budget(int64_t max_tokens, int K, int ep, double rows_budget);

// The routing, permuted rows and expert activations a layer keeps from forward to backward:
// everything of the layer's state but the Router's (except its (N, E) arrays, RouterKept) and
// its backward scratch. Layers of one shape may share one set when each layer's forward is run
// again right before its backward (train.recompute, model/gpt.h); the rest of the Router, whose
// routing and statistics the trainer reads after forward, stays per layer, and so do the few
// small per-round plans and sums (a forward run again rebuilds its plan; backward zeroes its
// sums). With several rounds, each layer's backward runs its rounds' expert forward again
// anyway, from the rows kept here.
struct MoEBuffers {
    Buffer<int32_t> row_of, token_of_row, offsets;
    Buffer<float> x_perm, y_perm, x_local, h, y_local;
    Buffer<uint16_t> y16;  // y_perm in 16 bits (MoELayer keep_y16_; y_perm is empty then)
    Buffer<uint16_t> h16;  // h in 16 bits (MoEShape::prec.act a half type; h is empty then)
    Buffer<float> ys, hs;  // shared experts
    Buffer<uint16_t> hs16;
    std::shared_ptr<RouterKept> router = std::make_shared<RouterKept>();
};
// A layer's backward working set: written and read within one layer's backward (dh and dhs also
// hold the GELU outputs within a forward, dxs a shared expert's output; the GELU outputs are not
// kept, backward computes them again from h), never from one layer's pass into another's, so
// every MoE layer of a model of one shape shares one set (GPT does), whatever train.recompute.
struct MoEScratch {
    Buffer<float> dy_perm, dy_local, dh, dx_local, dx_perm, dprobs;
    Buffer<float> probs_of_row;   // gather_dy_: each row's weight (moe/dispatch.h slot_probs)
    Buffer<float> dys, dhs, dxs;  // shared experts
    std::shared_ptr<RouterScratch> router = std::make_shared<RouterScratch>();
};

class MoELayer {
   public:
    // par: nullptr for a single process. shared, scratch: buffers to use instead of the
    // layer's own (sized by the first layer that gets them); nullptr: the layer's own.
    MoELayer(const MoEShape& shape, int max_tokens, dist::ParallelContext* par = nullptr,
             std::shared_ptr<MoEBuffers> shared  = nullptr,
             std::shared_ptr<MoEScratch> scratch = nullptr);

    // out: (N, C), overwritten. inp: (N, C). Returns the aux loss (already times aux_coef).
    double forward(float* out, const float* inp, const MoEWeights& w, int N);
    // dinp: (N, C), overwritten. Parameter grads +=. daux: d loss / d aux.
    void backward(float* dinp, MoEGrads& dw, const float* dout, const float* inp,
                  const MoEWeights& w, double daux);

    // Randomness and training/inference mode of the following forwards (router.h).
    void set_routing_context(const RoutingContext& ctx) { router_.set_context(ctx); }
    // The thread the pieces' all-to-alls run on (MoEShape::a2a_chunks > 1), so that they
    // overlap the experts; nullptr: the pieces are exchanged on the calling thread, in turn.
    // Results are bitwise the same either way, and as with a2a_chunks = 1.
    void set_a2a_helper(HelperThread* helper) { helper_ = helper; }
    void set_seq_len(int T) { router_.set_seq_len(T); }  // Router::set_seq_len

    // After forward, this rank's tokens: (E) rows routed to each global expert.
    const int32_t* tokens_per_expert() const { return router_.tokens_per_expert(); }
    // After forward: (E) rows routed to each expert summed over all ranks.
    const int64_t* global_tokens_per_expert() const {
        return router_.stats().tokens_per_expert.data();
    }
    // After forward: dropped / reassigned slots and router entropy over all ranks.
    const RoutingStats& routing_stats() const { return router_.stats(); }
    // The per-expert bias of the choice (balance_bias.h), float32, replicated on every rank.
    BalanceBias& balance_bias() { return router_.balance_bias(); }
    const BalanceBias& balance_bias() const { return router_.balance_bias(); }
    // After forward: (N, K) expert ids (-1: dropped) and gate weights.
    const int32_t* expert_idx() const { return router_.expert_idx(); }
    const float* probs() const { return router_.probs(); }
    int n_local_experts() const { return El_; }
    // Rows per round (moe_rows_budget) and the rounds the last forward took.
    int64_t rows_budget() const { return budget_; }
    int rounds() const { return rounds_; }

   private:
    // The rounds of the experts: through the dispatcher with EP > 1, by local copies otherwise.
    void begin_rounds();
    void set_round(int r);
    const int32_t* round_offsets() const;
    // tokens (EP 1 only): x_perm is the layer's input, its rows gathered through token_of_row_.
    void round_in(float* x_local, const float* x_perm, Dtype payload, bool tokens = false);
    void round_out(float* y_perm, const float* y_local, Dtype payload);
    // The pieces of one round (TokenDispatcher::chunks() > 1): the exchange of piece c + 1 and
    // the combine of piece c - 1 run on helper_ while the experts compute piece c.
    void run_chunks(bool backward, const MoEWeights& w, MoEGrads* dw);
    void chunk_exchange(int c, bool combine, bool backward);
    struct ChunkJob {
        MoELayer* layer = nullptr;
        int chunk       = 0;
        bool combine = false, backward = false;
        void operator()() const { layer->chunk_exchange(chunk, combine, backward); }
    };
    std::vector<ChunkJob> jobs_;  // [2 * chunks]: dispatch of piece c at 2c, its combine at 2c + 1
    HelperThread* helper_ = nullptr;

    MoEShape s_;
    int max_tokens_;
    int El_;  // local experts
    dist::ParallelContext* par_;
    std::unique_ptr<TokenDispatcher> dispatcher_;  // [not null iff EP > 1]
    // [not null iff EP > 1 and par->node_dedup()] used for a forward (and its backward) whose
    // rows take one round, unpieced: node_dispatcher.h
    std::unique_ptr<NodeDispatcher> node_dispatcher_;
    bool dedup_ = false;  // the last forward went through node_dispatcher_
    // No exchange (EP 1): the experts' input rows are read from the tokens through
    // token_of_row_, so x_perm_ is never formed: in place by the products in one round
    // (kernels/grouped_gemm.h's gathered operands), copied per round into x_local_ in rounds.
    bool gather_ = false;
    // gather_ in one round, on products that narrow their operands (experts_gather_dy): the
    // experts form their output gradient's 16-bit copy from the tokens' dout scaled by
    // probs_of_row_, so dy_perm_ is never formed (nor allocated)
    bool gather_dy_ = false;
    // gather_ in one round with bf16 activations: the experts' outputs y_perm (saved for the
    // combine's gradient) are kept as their 16 bits in y16_, narrowed as the second product
    // finishes each rectangle; the floats the combine reads in forward are formed in dx_perm()'s
    // storage, free until backward
    bool keep_y16_ = false;
    // The experts' input and, with gather_, the token each of its rows is (else nullptr).
    const float* experts_input(const float* inp) const { return gather_ ? inp : x_perm_.data(); }
    const int32_t* experts_rows() const { return gather_ ? token_of_row_.data() : nullptr; }
    Router router_;
    int n_          = 0;                 // tokens of the last forward
    int64_t budget_ = 0;                 // rows per round
    int64_t block_  = 1;                 // rows of a weight-gradient block
    int rounds_     = 1;                 // of the last forward
    RowRounds local_rounds_;             // EP == 1
    std::vector<int64_t> local_totals_;  // [E] EP == 1
    Buffer<int32_t> local_offsets_;      // (El + 1) EP == 1, the current round
    Buffer<double> bias_acc_;            // (El, F + C) bias gradient sums over rounds
    Buffer<uint8_t> had_rows_;           // (El)
    std::shared_ptr<MoEBuffers> buf_;    // this layer's, or shared with the other layers
    std::shared_ptr<MoEScratch> scr_;    // the same
    // saved for backward
    Buffer<int32_t>& row_of_       = buf_->row_of;        // (N*K)
    Buffer<int32_t>& token_of_row_ = buf_->token_of_row;  // (N*K)
    Buffer<int32_t>& offsets_      = buf_->offsets;       // (E+1)
    Buffer<float>& x_perm_         = buf_->x_perm;        // (N*K, C) expert-major; not gather_
    Buffer<float>& y_perm_         = buf_->y_perm;        // (N*K, C), or
    Buffer<uint16_t>& y16_         = buf_->y16;           // (N*K, C) in 16 bits (keep_y16_)
    Buffer<float>& x_local_        = buf_->x_local;       // (R, C), R = budget_ rows
    Buffer<float>& h_              = buf_->h;             // (R, F), or
    Buffer<uint16_t>& h16_         = buf_->h16;           // (R, F) in 16 bits
    Buffer<float>& y_local_        = buf_->y_local;       // (R, C)
    // shared experts: (N, C) summed output, (S, N, FS) pre-activations
    Buffer<float>& ys_      = buf_->ys;
    Buffer<float>& hs_      = buf_->hs;
    Buffer<uint16_t>& hs16_ = buf_->hs16;
    // the kept pre-activations from row `row` on: routed experts (R, F), shared (S, N, FS)
    kernels::KeptArray hidden(size_t row) {
        return kernels::KeptArray{h_.data(), h16_.data()}.rows_from(row, static_cast<size_t>(s_.F));
    }
    kernels::KeptArray shared_hidden(size_t row) {
        return kernels::KeptArray{hs_.data(), hs16_.data()}.rows_from(row,
                                                                      static_cast<size_t>(s_.FS));
    }
    // backward scratch
    Buffer<float>& dy_perm_  = scr_->dy_perm;
    Buffer<float>& dy_local_ = scr_->dy_local;
    Buffer<float>& dh_       = scr_->dh;
    Buffer<float>& dx_local_ = scr_->dx_local;
    Buffer<float>& dx_perm_  = scr_->dx_perm;  // (N*K, C), or none with alias_dx_
    // dx_perm_'s rows are dy_perm_'s: every path reads a row of the output gradient (the
    // experts, the exchange, a round) before the row of the input gradient at its place is
    // written, and reads none after; not with pieces (a piece's dispatch and the previous one's
    // combine are in flight together), nor with gather_dy_ (no dy_perm_)
    bool alias_dx_ = false;
    float* dx_perm() { return alias_dx_ ? dy_perm_.data() : dx_perm_.data(); }
    Buffer<float>& dprobs_       = scr_->dprobs;
    Buffer<float>& probs_of_row_ = scr_->probs_of_row;
    // shared experts: (N, C) (N, FS) (N, C)
    Buffer<float>& dys_ = scr_->dys;
    Buffer<float>& dhs_ = scr_->dhs;
    Buffer<float>& dxs_ = scr_->dxs;

    void shared_forward(const float* inp, const ExpertWeights& w, int N);
    // dprobs_ (and dy_perm, where not nullptr) from dout and the kept outputs
    void combine_grad(float* dy_perm, const float* dout);
    // Whether this forward's shared experts compute beside the plain dispatch (overlap_shared).
    bool shared_beside() const;
    // The plain one-round dispatch of `from` into `to` on helper_ while f() computes here.
    template <typename F>
    void dispatch_beside(float* to, const float* from, F&& f);
    struct DispatchJob {
        MoELayer* layer   = nullptr;
        float* to         = nullptr;
        const float* from = nullptr;
        void operator()() const {
            layer->dispatcher_->dispatch(to, from, layer->s_.prec.gemm, false);
        }
    };
    DispatchJob dispatch_job_;
    // dinp += the shared experts' input gradient; dinp = nullptr (S = 1 only): it stays in dxs_.
    void shared_backward(float* dinp, ExpertGrads& dw, const float* dout, const float* inp,
                         const ExpertWeights& w, int N);
};

}  // namespace bagualu::moe

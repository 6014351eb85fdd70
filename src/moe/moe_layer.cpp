#include "moe/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/phase_timer.h"
#include "kernels/grouped_gemm.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "moe/dispatch.h"

namespace bagualu::moe {

int64_t max_local_rows(int64_t max_tokens, int K, int ep) { return ep * max_tokens * K; }

int64_t moe_rows_budget(int64_t max_tokens, int K, int ep, double rows_budget) {
    const int64_t all = max_local_rows(max_tokens, K, ep);
    if (!(rows_budget > 0)) return all;
    const double want  = std::ceil(rows_budget * static_cast<double>(max_tokens * K));
    const int64_t rows = std::max<int64_t>(kernels::kMaxTnDepthBlock,
                                           static_cast<int64_t>(std::min(want, double(all))));
    return std::min(rows, all);
}

MoELayer::MoELayer(const MoEShape& s, int max_tokens, dist::ParallelContext* par,
                   std::shared_ptr<MoEBuffers> shared, std::shared_ptr<MoEScratch> scratch)
    : s_(s),
      max_tokens_(max_tokens),
      El_(s.E),
      par_(par),
      router_(s.C, s.E, s.K, s.aux_coef, s.gate, max_tokens, par,
              scratch ? scratch->router : nullptr, shared ? shared->router : nullptr),
      buf_(shared ? shared : std::make_shared<MoEBuffers>()),
      scr_(scratch ? scratch : std::make_shared<MoEScratch>()) {  // not moved: router_ reads them
    const int ep = par ? par->ep_size() : 1;
    BGL_CHECK(s.E % ep == 0, "{} experts over {} ranks", s.E, ep);
    El_            = s.E / ep;
    const size_t N = static_cast<size_t>(max_tokens), E = static_cast<size_t>(s.E),
                 K = static_cast<size_t>(s.K), C = static_cast<size_t>(s.C),
                 F = static_cast<size_t>(s.F);
    // rows this rank's experts take per round
    budget_        = moe_rows_budget(max_tokens, s.K, ep, s.rows_budget);
    const size_t R = static_cast<size_t>(budget_);
    // Rounds start on the weight-gradient blocks of the GEMM path; the ref and openblas paths
    // sum a group's whole depth at once, so there a split into rounds is not bitwise exact.
    const int blk = kernels::grouped_gemm_tn_depth_block();
    block_        = std::min<int64_t>(blk > 0 ? blk : kernels::kMaxTnDepthBlock, budget_);
    if (ep > 1) {
        dispatcher_ = std::make_unique<TokenDispatcher>(*par, s.E, s.C, static_cast<int>(N * K),
                                                        budget_, block_, s.a2a_chunks);
        if (par->node_dedup())
            node_dispatcher_ = std::make_unique<NodeDispatcher>(*par, s.E, s.K, s.C);
    }
    const bool rounds_possible = budget_ < max_local_rows(max_tokens, s.K, ep);
    // no exchange: the experts (or the rounds) read the tokens' rows in place
    gather_          = !dispatcher_;
    gather_dy_       = gather_ && !rounds_possible && experts_gather_dy(s.prec);
    keep_y16_        = gather_ && !rounds_possible && s.prec.act == Dtype::bfloat16;
    const size_t NKC = gather_ ? 0 : N * K * C;  // x_perm_
    if (rounds_possible || (dispatcher_ && s.a2a_chunks > 1)) {
        // per layer: the bias gradients' sums over rounds or pieces, and the rounds' plan
        bias_acc_ = Buffer<double>(static_cast<size_t>(El_) * (F + C));
        had_rows_ = Buffer<uint8_t>(static_cast<size_t>(El_));
        if (!dispatcher_ && rounds_possible) {
            local_totals_.assign(E, 0);
            local_offsets_ = Buffer<int32_t>(E + 1);
        }
    }
    const size_t NS  = s.n_shared > 0 ? N * static_cast<size_t>(s.n_shared * s.FS) : 0;
    const bool local = dispatcher_ || rounds_possible;  // rows of a round apart from x_perm
    const size_t RC  = local ? R * C : 0;
    const size_t S = static_cast<size_t>(s.n_shared), FS = static_cast<size_t>(s.FS);
    const bool half_h = s.prec.act != Dtype::float32;
    if (row_of_.size() > 0) {  // shared, and already sized by a layer of this shape
        BGL_CHECK(row_of_.size() == N * K && h_.size() + h16_.size() == R * F &&
                      h16_.size() == (half_h ? R * F : 0) && x_perm_.size() == NKC &&
                      y16_.size() == (keep_y16_ ? N * K * C : 0) && x_local_.size() == RC &&
                      hs_.size() + hs16_.size() == NS,
                  "MoE layers sharing buffers differ in shape");
    } else {
        row_of_       = Buffer<int32_t>(N * K);
        token_of_row_ = Buffer<int32_t>(N * K);
        offsets_      = Buffer<int32_t>(E + 1);
        x_perm_       = Buffer<float>(NKC);
        y_perm_       = Buffer<float>(keep_y16_ ? 0 : N * K * C);
        y16_          = Buffer<uint16_t>(keep_y16_ ? N * K * C : 0);
        x_local_      = Buffer<float>(RC);
        y_local_      = Buffer<float>(RC);
        // the pre-activations: in 16 bits when they hold half values (kernels::KeptArray)
        if (half_h) {
            h16_  = Buffer<uint16_t>(R * F);
            hs16_ = Buffer<uint16_t>(S * N * FS);
        } else {
            h_  = Buffer<float>(R * F);
            hs_ = Buffer<float>(S * N * FS);
        }
        if (S > 0) ys_ = Buffer<float>(N * C);
    }
    // the scratch: sized by the first layer, every other one of the same shape
    size_shared(dh_, R * F, "dh");
    size_shared(dy_perm_, gather_dy_ ? 0 : N * K * C, "dy_perm");
    size_shared(probs_of_row_, gather_dy_ ? N * K : 0, "probs_of_row");
    // the input gradients' rows in the output gradients' storage, whose last reader runs before
    // their first writer (but where pieces exchange both at once, or dy_perm_ is not formed)
    alias_dx_ = !gather_dy_ && !(dispatcher_ && s.a2a_chunks > 1);
    size_shared(dx_perm_, alias_dx_ ? 0 : N * K * C, "dx_perm");
    size_shared(dprobs_, N * K, "dprobs");
    size_shared(dy_local_, RC, "dy_local");
    size_shared(dx_local_, RC, "dx_local");
    size_shared(dys_, S > 0 ? N * C : 0, "dys");
    size_shared(dhs_, S > 0 ? N * FS : 0, "dhs");
    size_shared(dxs_, S > 0 ? N * C : 0, "dxs");
}

// ---- rounds ----

void MoELayer::begin_rounds() {
    if (dispatcher_) {
        dispatcher_->dispatch_preprocess(router_.tokens_per_expert());
        rounds_ = dispatcher_->rounds();
        return;
    }
    rounds_ = 1;
    if (local_totals_.empty()) return;  // the budget holds every row
    const int32_t* tpe = router_.tokens_per_expert();
    std::copy(tpe, tpe + s_.E, local_totals_.begin());
    local_rounds_.reset(local_totals_.data(), El_, budget_, block_);
    rounds_ = local_rounds_.rounds();
}

void MoELayer::set_round(int r) {
    if (dispatcher_) {
        dispatcher_->set_round(r);
        return;
    }
    local_rounds_.set_round(r);
    local_offsets_[0] = 0;
    for (int e = 0; e < El_; ++e) {
        const size_t i = static_cast<size_t>(e);
        local_offsets_[i + 1] =
            local_offsets_[i] + static_cast<int32_t>(local_rounds_.hi(e) - local_rounds_.lo(e));
    }
}

const int32_t* MoELayer::round_offsets() const {
    return dispatcher_ ? dispatcher_->local_offsets() : local_offsets_.data();
}

// x_local (round rows, C) <- the current round's rows of x_perm (tokens: x_perm is the
// layer's input, the rows gathered through token_of_row_).
void MoELayer::round_in(float* x_local, const float* x_perm, Dtype payload, bool tokens) {
    if (dispatcher_) {
        dispatcher_->dispatch(x_local, x_perm, payload);
        return;
    }
    const size_t C = static_cast<size_t>(s_.C);
    for (int e = 0; e < El_; ++e) {
        const size_t i = static_cast<size_t>(e);
        const size_t n = static_cast<size_t>(local_offsets_[i + 1] - local_offsets_[i]);
        const size_t row =
            static_cast<size_t>(offsets_[i]) + static_cast<size_t>(local_rounds_.lo(e));
        float* to = x_local + static_cast<size_t>(local_offsets_[i]) * C;
        if (!tokens) {
            std::memcpy(to, x_perm + row * C, sizeof(float) * n * C);
            continue;
        }
        for (size_t j = 0; j < n; ++j) {
            const auto t = static_cast<size_t>(token_of_row_[row + j]);
            std::memcpy(to + j * C, x_perm + t * C, sizeof(float) * C);
        }
    }
}

// The current round's rows of y_perm <- y_local (round rows, C).
void MoELayer::round_out(float* y_perm, const float* y_local, Dtype payload) {
    if (dispatcher_) {
        dispatcher_->combine(y_perm, y_local, payload);
        return;
    }
    const size_t C = static_cast<size_t>(s_.C);
    for (int e = 0; e < El_; ++e) {
        const size_t i = static_cast<size_t>(e);
        const size_t n = static_cast<size_t>(local_offsets_[i + 1] - local_offsets_[i]);
        const size_t row =
            static_cast<size_t>(offsets_[i]) + static_cast<size_t>(local_rounds_.lo(e));
        std::memcpy(y_perm + row * C, y_local + static_cast<size_t>(local_offsets_[i]) * C,
                    sizeof(float) * n * C);
    }
}

// ---- pieces of a round, overlapped ----

void MoELayer::chunk_exchange(int c, bool combine, bool backward) {
    if (!backward) {
        if (combine) {
            dispatcher_->combine_chunk(c, y_perm_.data(), y_local_.data(), s_.prec.act);
        } else {
            dispatcher_->dispatch_chunk(c, x_local_.data(), x_perm_.data(), s_.prec.gemm);
        }
    } else if (combine) {
        dispatcher_->combine_chunk(c, dx_perm(), dx_local_.data(), s_.prec.act);
    } else {
        dispatcher_->dispatch_chunk(c, dy_local_.data(), dy_perm_.data(), s_.prec.gemm);
    }
}

// Every rank submits the same exchanges in the same order (dispatch 0; then per piece c:
// dispatch c + 1, combine c), so the helper threads of the group meet in each collective.
// Piece c's rows have their own region of the local buffers and start on weight-gradient
// blocks of each expert's sequence, so the experts compute what one round computes.
void MoELayer::run_chunks(bool backward, const MoEWeights& w, MoEGrads* dw) {
    using Clock  = std::chrono::steady_clock;
    const int nc = dispatcher_->chunks();
    const int C = s_.C, F = s_.F;
    if (jobs_.size() < 2 * static_cast<size_t>(nc)) jobs_.resize(2 * static_cast<size_t>(nc));
    for (int c = 0; c < nc; ++c) {
        jobs_[2 * static_cast<size_t>(c)]     = {this, c, false, backward};
        jobs_[2 * static_cast<size_t>(c) + 1] = {this, c, true, backward};
    }
    // an exchange: queued on the helper, or run here (then all of it is exposed)
    auto start = [&](int j) -> HelperThread::Ticket {
        if (helper_) return helper_->submit(jobs_[static_cast<size_t>(j)]);
        const auto t0 = Clock::now();
        jobs_[static_cast<size_t>(j)]();
        add_a2a_seconds(0.0, std::chrono::duration<double>(Clock::now() - t0).count());
        return 0;
    };
    auto finish = [&](HelperThread::Ticket t) {
        if (!helper_) return;
        const auto t0 = Clock::now();
        helper_->wait(t);
        add_a2a_seconds(0.0, std::chrono::duration<double>(Clock::now() - t0).count());
    };
    if (backward) {
        std::fill(bias_acc_.data(), bias_acc_.data() + bias_acc_.size(), 0.0);
        std::fill(had_rows_.data(), had_rows_.data() + had_rows_.size(), uint8_t{0});
    }
    HelperThread::Ticket next = start(0), last = 0;
    for (int c = 0; c < nc; ++c) {
        finish(next);
        if (c + 1 < nc) next = start(2 * (c + 1));
        const size_t row = static_cast<size_t>(dispatcher_->chunk_base(c)), rc = row * C,
                     rf     = row * F;
        const int32_t* offs = dispatcher_->chunk_offsets(c);
        {
            PhaseScope phase(Phase::experts);
            if (!backward) {
                experts_forward(y_local_.data() + rc, hidden(row), dh_.data() + rf,
                                x_local_.data() + rc, w.experts, offs, El_, C, F, s_.prec);
            } else {
                experts_backward(dx_local_.data() + rc, dh_.data() + rf, dw->experts,
                                 dy_local_.data() + rc, x_local_.data() + rc, hidden(row),
                                 w.experts, offs, El_, C, F, s_.prec, bias_acc_.data());
            }
        }
        if (backward) {
            for (int e = 0; e < El_; ++e)
                had_rows_[static_cast<size_t>(e)] |= offs[e + 1] > offs[e];
        }
        last = start(2 * c + 1);
    }
    finish(last);
    if (backward)
        experts_bias_grad_flush(dw->experts, bias_acc_.data(), had_rows_.data(), El_, C, F);
}

// ---- forward / backward ----

double MoELayer::forward(float* out, const float* inp, const MoEWeights& w, int N) {
    BGL_CHECK(N <= max_tokens_, "MoE layer sized for {} tokens, got {}", max_tokens_, N);
    n_          = N;
    const int C = s_.C, E = s_.E, K = s_.K;
    const double aux = router_.forward(inp, w.gate_w, w.noise_w, N);

    build_routing(row_of_.data(), token_of_row_.data(), offsets_.data(), router_.expert_idx(),
                  router_.tokens_per_expert(), N, E, K);
    begin_rounds();
    dedup_            = node_dispatcher_ && rounds_ == 1 && dispatcher_->chunks() == 1;
    const bool beside = shared_beside();
    if (s_.n_shared > 0 && !beside) shared_forward(inp, w.shared, N);
    if (dedup_) {
        node_dispatcher_->plan(router_.expert_idx(), router_.probs(), N);
        node_dispatcher_->dispatch(x_local_.data(), inp, s_.prec.gemm);
        PhaseScope phase(Phase::experts);
        experts_forward(y_local_.data(), hidden(0), dh_.data(), x_local_.data(), w.experts,
                        node_dispatcher_->local_offsets(), El_, C, s_.F, s_.prec);
        phase.stop();
        node_dispatcher_->combine(out, y_local_.data(), s_.prec.act);
        if (s_.n_shared > 0) kernels::add_forward(out, out, ys_.data(), static_cast<size_t>(N) * C);
        return aux;
    }
    if (!gather_) {
        permute_forward(x_perm_.data(), inp, token_of_row_.data(), offsets_[static_cast<size_t>(E)],
                        C);
    }
    // the float outputs the combine reads: with keep_y16_ (one round, no exchange: the last
    // branch below) formed in the backward scratch, kept in y16_
    float* const y_out = keep_y16_ ? dx_perm() : y_perm_.data();
    if (rounds_ > 1) {
        // every round through the same buffers; backward recomputes h and g per round
        for (int r = 0; r < rounds_; ++r) {
            set_round(r);
            round_in(x_local_.data(), experts_input(inp), s_.prec.gemm, gather_);
            PhaseScope phase(Phase::experts);
            experts_forward(y_local_.data(), hidden(0), dh_.data(), x_local_.data(), w.experts,
                            round_offsets(), El_, C, s_.F, s_.prec);
            phase.stop();
            round_out(y_perm_.data(), y_local_.data(), s_.prec.act);
        }
    } else if (dispatcher_ && dispatcher_->chunks() > 1) {
        run_chunks(false, w, nullptr);
    } else if (dispatcher_) {
        if (beside) {
            dispatch_beside(x_local_.data(), x_perm_.data(),
                            [&] { shared_forward(inp, w.shared, N); });
        } else {
            dispatcher_->dispatch(x_local_.data(), x_perm_.data(), s_.prec.gemm);
        }
        PhaseScope phase(Phase::experts);
        experts_forward(y_local_.data(), hidden(0), dh_.data(), x_local_.data(), w.experts,
                        dispatcher_->local_offsets(), El_, C, s_.F, s_.prec);
        phase.stop();
        dispatcher_->combine(y_perm_.data(), y_local_.data(), s_.prec.act);
    } else {
        PhaseScope phase(Phase::experts);
        experts_forward(y_out, hidden(0), dh_.data(), experts_input(inp), w.experts,
                        offsets_.data(), El_, C, s_.F, s_.prec, experts_rows(),
                        keep_y16_ ? y16_.data() : nullptr);
    }
    unpermute_forward(out, y_out, router_.probs(), row_of_.data(), N, K, C);
    if (s_.n_shared > 0) kernels::add_forward(out, out, ys_.data(), static_cast<size_t>(N) * C);
    return aux;
}

// Shared expert i is one expert over all N rows: experts_forward with E = 1 and its weights.
static ExpertWeights shared_expert(const ExpertWeights& w, int i) {
    const size_t e = static_cast<size_t>(i);
    return {w.fc_w + e * w.fc_w_stride, w.fc_b + e * w.fc_b_stride, w.proj_w + e * w.proj_w_stride,
            w.proj_b + e * w.proj_b_stride};
}

void MoELayer::shared_forward(const float* inp, const ExpertWeights& w, int N) {
    PhaseScope phase(Phase::experts);
    const int C = s_.C, FS = s_.FS;
    const int32_t offsets[2] = {0, N};
    const size_t NC          = static_cast<size_t>(N) * C;
    // y_i into dxs_ (free until backward), summed in expert order into ys_
    for (int i = 0; i < s_.n_shared; ++i) {
        float* y = i == 0 ? ys_.data() : dxs_.data();
        experts_forward(y, shared_hidden(static_cast<size_t>(i) * N), dhs_.data(), inp,
                        shared_expert(w, i), offsets, 1, C, FS, s_.prec);
        if (i > 0) kernels::add_forward(ys_.data(), ys_.data(), y, NC);
    }
}

void MoELayer::shared_backward(float* dinp, ExpertGrads& dw, const float* dout, const float* inp,
                               const ExpertWeights& w, int N) {
    PhaseScope phase(Phase::experts);
    const int C = s_.C, FS = s_.FS;
    const int32_t offsets[2] = {0, N};
    const size_t NC          = static_cast<size_t>(N) * C;
    // experts_backward may round its output gradient in place: a copy of dout (rounding twice
    // changes nothing)
    std::copy(dout, dout + NC, dys_.data());
    for (int i = 0; i < s_.n_shared; ++i) {
        const ExpertWeights wi = shared_expert(w, i);
        const size_t e         = static_cast<size_t>(i);
        ExpertGrads gi{dw.fc_w + e * dw.fc_w_stride, dw.fc_b + e * dw.fc_b_stride,
                       dw.proj_w + e * dw.proj_w_stride, dw.proj_b + e * dw.proj_b_stride};
        experts_backward(dxs_.data(), dhs_.data(), gi, dys_.data(), inp,
                         shared_hidden(static_cast<size_t>(i) * N), wi, offsets, 1, C, FS, s_.prec);
        if (dinp) kernels::add_forward(dinp, dinp, dxs_.data(), NC);
    }
}

bool MoELayer::shared_beside() const {
    return s_.overlap_shared && s_.n_shared > 0 && helper_ && dispatcher_ && !dedup_ &&
           rounds_ == 1 && dispatcher_->chunks() == 1;
}

template <typename F>
void MoELayer::dispatch_beside(float* to, const float* from, F&& f) {
    dispatch_job_                = {this, to, from};
    const HelperThread::Ticket t = helper_->submit(dispatch_job_);
    count_dispatch_beside_shared();
    f();
    const auto t0 = std::chrono::steady_clock::now();
    helper_->wait(t);
    add_a2a_seconds(0.0,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The combine's gradient (moe/dispatch.h unpermute_backward) from the kept outputs.
void MoELayer::combine_grad(float* dy_perm, const float* dout) {
    if (keep_y16_) {
        unpermute_backward(dy_perm, dprobs_.data(), dout, y16_.data(), router_.probs(),
                           row_of_.data(), n_, s_.K, s_.C);
    } else {
        unpermute_backward(dy_perm, dprobs_.data(), dout, y_perm_.data(), router_.probs(),
                           row_of_.data(), n_, s_.K, s_.C);
    }
}

void MoELayer::backward(float* dinp, MoEGrads& dw, const float* dout, const float* inp,
                        const MoEWeights& w, double daux) {
    const int N = n_, C = s_.C, K = s_.K;
    // backward overlaps one shared expert: its input gradient waits in dxs_ for the end
    const bool beside = shared_beside() && s_.n_shared == 1;
    if (dedup_) {
        node_dispatcher_->dispatch_grad(dy_local_.data(), dout, s_.prec.gemm);
        PhaseScope phase(Phase::experts);
        experts_backward(dx_local_.data(), dh_.data(), dw.experts, dy_local_.data(),
                         x_local_.data(), hidden(0), w.experts, node_dispatcher_->local_offsets(),
                         El_, C, s_.F, s_.prec);
        phase.stop();
        // the tokens' input gradients from the experts, (N, C), into dx_perm_ (N K rows)
        node_dispatcher_->combine_grad(dx_perm(), dprobs_.data(), dx_local_.data(), s_.prec.act);
        router_.backward(dinp, dw.gate_w, dw.noise_w, dprobs_.data(), inp, w.gate_w, w.noise_w,
                         daux);
        kernels::add_forward(dinp, dinp, dx_perm(), static_cast<size_t>(N) * C);
        if (s_.n_shared > 0) shared_backward(dinp, dw.shared, dout, inp, w.shared, N);
        return;
    }
    // gather_dy_ (one round, no exchange: the last branch below): the experts form their output
    // gradient from dout as they narrow it, and the combine's gradient gives the dprobs only
    const bool gather_dy = gather_dy_ && experts_gather_dy(s_.prec);
    // the products stopped converting since this layer was made (kernels::bf16_float_operands)
    if (!gather_dy && dy_perm_.size() == 0)
        dy_perm_ = Buffer<float>(static_cast<size_t>(max_tokens_) * K * C);
    combine_grad(gather_dy ? nullptr : dy_perm_.data(), dout);
    if (dispatcher_) {
        // the adjoint of combine is dispatch, and of dispatch is combine
        kernels::round_inplace(dy_perm_.data(),
                               static_cast<size_t>(offsets_[static_cast<size_t>(s_.E)]) * C,
                               s_.prec.gemm);
    }
    if (rounds_ > 1) {
        // Per round: the rows again (the same values forward had), the expert forward again
        // for h and g, then the expert backward. The weight gradients see each expert's rows
        // in the same order and GEMM depth blocks as one round would, and the bias gradients
        // sum on in double across rounds, so the gradients are bitwise those of one round.
        std::fill(bias_acc_.data(), bias_acc_.data() + bias_acc_.size(), 0.0);
        std::fill(had_rows_.data(), had_rows_.data() + had_rows_.size(), uint8_t{0});
        for (int r = 0; r < rounds_; ++r) {
            set_round(r);
            round_in(x_local_.data(), experts_input(inp), s_.prec.gemm, gather_);
            round_in(dy_local_.data(), dy_perm_.data(), s_.prec.gemm);
            const int32_t* offs = round_offsets();
            PhaseScope phase(Phase::experts);
            experts_forward(y_local_.data(), hidden(0), dh_.data(), x_local_.data(), w.experts,
                            offs, El_, C, s_.F, s_.prec);
            experts_backward(dx_local_.data(), dh_.data(), dw.experts, dy_local_.data(),
                             x_local_.data(), hidden(0), w.experts, offs, El_, C, s_.F, s_.prec,
                             bias_acc_.data());
            phase.stop();
            for (int e = 0; e < El_; ++e) {
                had_rows_[static_cast<size_t>(e)] |= offs[e + 1] > offs[e];
            }
            round_out(dx_perm(), dx_local_.data(), s_.prec.act);
        }
        experts_bias_grad_flush(dw.experts, bias_acc_.data(), had_rows_.data(), El_, C, s_.F);
    } else if (dispatcher_ && dispatcher_->chunks() > 1) {
        run_chunks(true, w, &dw);
    } else if (dispatcher_) {
        if (beside) {  // the shared expert's gradients while dy travels; dinp gets it last
            dispatch_beside(dy_local_.data(), dy_perm_.data(),
                            [&] { shared_backward(nullptr, dw.shared, dout, inp, w.shared, N); });
        } else {
            dispatcher_->dispatch(dy_local_.data(), dy_perm_.data(), s_.prec.gemm);
        }
        PhaseScope phase(Phase::experts);
        experts_backward(dx_local_.data(), dh_.data(), dw.experts, dy_local_.data(),
                         x_local_.data(), hidden(0), w.experts, dispatcher_->local_offsets(), El_,
                         C, s_.F, s_.prec);
        phase.stop();
        dispatcher_->combine(dx_perm(), dx_local_.data(), s_.prec.act);
    } else {
        if (gather_dy) slot_probs(probs_of_row_.data(), router_.probs(), row_of_.data(), N, K);
        PhaseScope phase(Phase::experts);
        experts_backward(dx_perm(), dh_.data(), dw.experts,
                         gather_dy ? const_cast<float*>(dout) : dy_perm_.data(), experts_input(inp),
                         hidden(0), w.experts, offsets_.data(), El_, C, s_.F, s_.prec, nullptr,
                         experts_rows(), gather_dy ? token_of_row_.data() : nullptr,
                         gather_dy ? probs_of_row_.data() : nullptr);
    }
    router_.backward(dinp, dw.gate_w, dw.noise_w, dprobs_.data(), inp, w.gate_w, w.noise_w, daux);
    permute_backward(dinp, dx_perm(), row_of_.data(), N, K, C);
    if (beside) {
        kernels::add_forward(dinp, dinp, dxs_.data(), static_cast<size_t>(N) * C);
    } else if (s_.n_shared > 0) {
        shared_backward(dinp, dw.shared, dout, inp, w.shared, N);
    }
}

}  // namespace bagualu::moe

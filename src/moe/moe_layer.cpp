#include "moe/moe_layer.h"

#include "core/error.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "moe/dispatch.h"
#include "core/phase_timer.h"

namespace bagualu::moe {

int64_t max_local_rows(int64_t max_tokens, int K, int ep) { return ep * max_tokens * K; }

MoELayer::MoELayer(const MoEShape& s, int max_tokens, dist::ParallelContext* par,
                   std::shared_ptr<MoEBuffers> shared)
    : s_(s),
      max_tokens_(max_tokens),
      El_(s.E),
      par_(par),
      router_(s.C, s.E, s.K, s.aux_coef, s.gate, max_tokens, par),
      buf_(shared ? std::move(shared) : std::make_shared<MoEBuffers>()) {
    const int ep = par ? par->ep_size() : 1;
    BGL_CHECK(s.E % ep == 0, "{} experts over {} ranks", s.E, ep);
    El_ = s.E / ep;
    const size_t N = static_cast<size_t>(max_tokens), E = static_cast<size_t>(s.E),
                 K = static_cast<size_t>(s.K), C = static_cast<size_t>(s.C),
                 F = static_cast<size_t>(s.F);
    // rows this rank's experts may receive
    const size_t R = static_cast<size_t>(max_local_rows(max_tokens, s.K, ep));
    if (ep > 1) {
        dispatcher_ = std::make_unique<TokenDispatcher>(*par, s.E, s.C, static_cast<int>(N * K),
                                                        static_cast<int64_t>(R));
    }
    if (row_of_.size() > 0) {  // shared, and already sized by a layer of this shape
        BGL_CHECK(row_of_.size() == N * K && h_.size() == R * F && x_perm_.size() == N * K * C,
                  "MoE layers sharing buffers differ in shape");
        return;
    }
    row_of_            = Buffer<int32_t>(N * K);
    token_of_row_      = Buffer<int32_t>(N * K);
    offsets_           = Buffer<int32_t>(E + 1);
    x_perm_   = Buffer<float>(N * K * C);
    y_perm_   = Buffer<float>(N * K * C);
    h_        = Buffer<float>(R * F);
    g_        = Buffer<float>(R * F);
    dh_       = Buffer<float>(R * F);
    dy_perm_  = Buffer<float>(N * K * C);
    dx_perm_  = Buffer<float>(N * K * C);
    dprobs_   = Buffer<float>(N * K);
    if (dispatcher_) {
        x_local_  = Buffer<float>(R * C);
        y_local_  = Buffer<float>(R * C);
        dy_local_ = Buffer<float>(R * C);
        dx_local_ = Buffer<float>(R * C);
    }
}

double MoELayer::forward(float* out, const float* inp, const MoEWeights& w, int N) {
    BGL_CHECK(N <= max_tokens_, "MoE layer sized for {} tokens, got {}", max_tokens_, N);
    n_ = N;
    const int    C = s_.C, E = s_.E, K = s_.K;
    const double aux = router_.forward(inp, w.gate_w, w.noise_w, N);

    build_routing(row_of_.data(), token_of_row_.data(), offsets_.data(), router_.expert_idx(),
                  router_.tokens_per_expert(), N, E, K);
    permute_forward(x_perm_.data(), inp, token_of_row_.data(), offsets_[static_cast<size_t>(E)], C);
    if (dispatcher_) {
        dispatcher_->dispatch_preprocess(router_.tokens_per_expert());
        dispatcher_->dispatch(x_local_.data(), x_perm_.data(), prec_.gemm);
        PhaseScope phase(Phase::experts);
        experts_forward(y_local_.data(), h_.data(), g_.data(), x_local_.data(), w.experts,
                        dispatcher_->local_offsets(), El_, C, s_.F, prec_);
        phase.stop();
        dispatcher_->combine(y_perm_.data(), y_local_.data(), prec_.act);
    } else {
        PhaseScope phase(Phase::experts);
        experts_forward(y_perm_.data(), h_.data(), g_.data(), x_perm_.data(), w.experts,
                        offsets_.data(), El_, C, s_.F, prec_);
    }
    unpermute_forward(out, y_perm_.data(), router_.probs(), row_of_.data(), N, K, C);
    return aux;
}

void MoELayer::backward(float* dinp, MoEGrads& dw, const float* dout, const float* inp,
                        const MoEWeights& w, double daux) {
    const int N = n_, C = s_.C, K = s_.K;
    unpermute_backward(dy_perm_.data(), dprobs_.data(), dout, y_perm_.data(), router_.probs(),
                       row_of_.data(), N, K, C);
    if (dispatcher_) {
        // the adjoint of combine is dispatch, and of dispatch is combine
        kernels::round_inplace(dy_perm_.data(), static_cast<size_t>(offsets_[static_cast<size_t>(s_.E)]) * C,
                               prec_.gemm);
        dispatcher_->dispatch(dy_local_.data(), dy_perm_.data(), prec_.gemm);
        PhaseScope phase(Phase::experts);
        experts_backward(dx_local_.data(), dh_.data(), dw.experts, dy_local_.data(), x_local_.data(),
                         h_.data(), g_.data(), w.experts, dispatcher_->local_offsets(), El_, C, s_.F,
                         prec_);
        phase.stop();
        dispatcher_->combine(dx_perm_.data(), dx_local_.data(), prec_.act);
    } else {
        PhaseScope phase(Phase::experts);
        experts_backward(dx_perm_.data(), dh_.data(), dw.experts, dy_perm_.data(), x_perm_.data(),
                         h_.data(), g_.data(), w.experts, offsets_.data(), El_, C, s_.F, prec_);
    }
    router_.backward(dinp, dw.gate_w, dw.noise_w, dprobs_.data(), inp, w.gate_w, w.noise_w, daux);
    permute_backward(dinp, dx_perm_.data(), row_of_.data(), N, K, C);
}

}  // namespace bagualu::moe

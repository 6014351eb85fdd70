#include "moe/moe_layer.h"

#include "core/error.h"
#include "kernels/ops.h"
#include "moe/dispatch.h"
#include "moe/gate.h"

namespace bagualu::moe {

MoELayer::MoELayer(const MoEShape& s, int max_tokens) : s_(s), max_tokens_(max_tokens) {
    const size_t N = static_cast<size_t>(max_tokens), E = static_cast<size_t>(s.E),
                 K = static_cast<size_t>(s.K), C = static_cast<size_t>(s.C),
                 F = static_cast<size_t>(s.F);
    logits_            = Buffer<float>(N * E);
    softmax_full_      = Buffer<float>(N * E);
    probs_             = Buffer<float>(N * K);
    expert_idx_        = Buffer<int32_t>(N * K);
    tokens_per_expert_ = Buffer<int32_t>(E);
    row_of_            = Buffer<int32_t>(N * K);
    token_of_row_      = Buffer<int32_t>(N * K);
    offsets_           = Buffer<int32_t>(E + 1);
    x_perm_            = Buffer<float>(N * K * C);
    h_                 = Buffer<float>(N * K * F);
    g_                 = Buffer<float>(N * K * F);
    y_perm_            = Buffer<float>(N * K * C);
    dy_perm_           = Buffer<float>(N * K * C);
    dh_                = Buffer<float>(N * K * F);
    dx_perm_           = Buffer<float>(N * K * C);
    dprobs_            = Buffer<float>(N * K);
    dlogits_           = Buffer<float>(N * E);
}

double MoELayer::forward(float* out, const float* inp, const MoEWeights& w, int N) {
    BGL_CHECK(N <= max_tokens_, "MoE layer sized for {} tokens, got {}", max_tokens_, N);
    n_ = N;
    const int C = s_.C, E = s_.E, K = s_.K;
    kernels::linear_forward(logits_.data(), inp, w.gate_w, nullptr, N, C, E);
    const double aux =
        topk_gate_forward(probs_.data(), expert_idx_.data(), softmax_full_.data(),
                          tokens_per_expert_.data(), logits_.data(), N, E, K, s_.aux_coef);
    build_routing(row_of_.data(), token_of_row_.data(), offsets_.data(), expert_idx_.data(),
                  tokens_per_expert_.data(), N, E, K);
    permute_forward(x_perm_.data(), inp, token_of_row_.data(), N * K, C);
    experts_forward(y_perm_.data(), h_.data(), g_.data(), x_perm_.data(), w.experts,
                    offsets_.data(), E, C, s_.F);
    unpermute_forward(out, y_perm_.data(), probs_.data(), row_of_.data(), N, K, C);
    return aux;
}

void MoELayer::backward(float* dinp, MoEGrads& dw, const float* dout, const float* inp,
                        const MoEWeights& w, double daux) {
    const int N = n_, C = s_.C, E = s_.E, K = s_.K;
    unpermute_backward(dy_perm_.data(), dprobs_.data(), dout, y_perm_.data(), probs_.data(),
                       row_of_.data(), N, K, C);
    experts_backward(dx_perm_.data(), dh_.data(), dw.experts, dy_perm_.data(), x_perm_.data(),
                     h_.data(), g_.data(), w.experts, offsets_.data(), E, C, s_.F);
    topk_gate_backward(dlogits_.data(), dprobs_.data(), probs_.data(), expert_idx_.data(),
                       softmax_full_.data(), tokens_per_expert_.data(), N, E, K, s_.aux_coef,
                       daux);
    kernels::linear_backward(dinp, dw.gate_w, nullptr, dlogits_.data(), inp, w.gate_w, N, C, E);
    permute_backward(dinp, dx_perm_.data(), row_of_.data(), N, K, C);
}

}  // namespace bagualu::moe

#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/ops.h"
#include "moe/gate.h"

namespace bagualu::model {

using namespace kernels;

Generator::Generator(const ModelConfig& cfg, const float* params, moe::BalanceBiases biases)
    : cfg_(cfg),
      layout_(make_layout(cfg)),
      w_(resolve<const float>(layout_, cfg_, params)),
      biases_(std::move(biases)) {
    const size_t C = static_cast<size_t>(cfg.d_model), T = static_cast<size_t>(cfg.seq_len),
                 L = static_cast<size_t>(cfg.n_layer), F = static_cast<size_t>(cfg.d_ff);
    kcache_         = Buffer<float>(L * T * C);
    vcache_         = Buffer<float>(L * T * C);
    x_              = Buffer<float>(C);
    ln_             = Buffer<float>(C);
    qkv_            = Buffer<float>(3 * C);
    atty_           = Buffer<float>(C);
    tmp_            = Buffer<float>(C);
    const size_t FM = std::max(
        {F, static_cast<size_t>(cfg.shared_width()), static_cast<size_t>(cfg.expert_width())});
    h_           = Buffer<float>(FM);
    h2_          = Buffer<float>(FM);
    logits_      = Buffer<float>(static_cast<size_t>(cfg.vocab_size));
    scores_      = Buffer<float>(T);
    gate_logits_ = Buffer<float>(static_cast<size_t>(std::max(cfg.n_experts, 1)));
    if (cfg.product_keys > 0) gate_keys_ = Buffer<float>(static_cast<size_t>(cfg.gate_rows()));
    order_.resize(static_cast<size_t>(std::max(cfg.n_experts, 1)));
    choice_.resize(order_.size());
    limited_.resize(order_.size());
    softmax_.resize(order_.size());
    probs_.resize(order_.size());
}

const float* Generator::step(int32_t token) {
    BGL_CHECK(pos_ < cfg_.seq_len, "context full ({} tokens)", cfg_.seq_len);
    BGL_CHECK(token >= 0 && token < cfg_.vocab_size, "token {} outside the vocabulary", token);
    const int C = cfg_.d_model, F = cfg_.d_ff, NH = cfg_.n_head, hs = C / NH, T = cfg_.seq_len;
    const int p = pos_;
    float mean, rstd;
    for (int c = 0; c < C; ++c)
        x_[c] = w_.wte[static_cast<int64_t>(token) * C + c] + w_.wpe[p * C + c];
    size_t moe_i = 0;  // MoE blocks so far
    for (int l = 0; l < cfg_.n_layer; ++l) {
        const auto& w = w_.blocks[static_cast<size_t>(l)];
        float* kc     = kcache_.data() + static_cast<int64_t>(l) * T * C;
        float* vc     = vcache_.data() + static_cast<int64_t>(l) * T * C;
        layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), w.ln1_w, w.ln1_b, 1, C);
        linear_forward(qkv_.data(), ln_.data(), w.qkv_w, w.qkv_b, 1, C, 3 * C);
        std::copy(qkv_.data() + C, qkv_.data() + 2 * C, kc + static_cast<int64_t>(p) * C);
        std::copy(qkv_.data() + 2 * C, qkv_.data() + 3 * C, vc + static_cast<int64_t>(p) * C);
        const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
        for (int h = 0; h < NH; ++h) {
            const float* q = qkv_.data() + h * hs;
            double mx      = -INFINITY;
            for (int j = 0; j <= p; ++j) {
                const float* k = kc + static_cast<int64_t>(j) * C + h * hs;
                double s       = 0;
                for (int i = 0; i < hs; ++i) s += static_cast<double>(q[i]) * k[i];
                scores_[j] = static_cast<float>(s * scale);
                mx         = std::max(mx, static_cast<double>(scores_[j]));
            }
            double sum = 0;
            for (int j = 0; j <= p; ++j) sum += std::exp(scores_[j] - mx);
            float* o = atty_.data() + h * hs;
            for (int i = 0; i < hs; ++i) {
                double acc = 0;
                for (int j = 0; j <= p; ++j) {
                    acc += std::exp(scores_[j] - mx) / sum *
                           vc[static_cast<int64_t>(j) * C + h * hs + i];
                }
                o[i] = static_cast<float>(acc);
            }
        }
        linear_forward(tmp_.data(), atty_.data(), w.proj_w, w.proj_b, 1, C, C);
        add_forward(x_.data(), x_.data(), tmp_.data(), static_cast<size_t>(C));
        layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), w.ln2_w, w.ln2_b, 1, C);
        // tmp_ = one feed-forward of hidden width `width` on ln_: the dense MLP, an expert
        const auto ffn = [&](const float* fc_w, const float* fc_b, const float* proj_w,
                             const float* proj_b, int width) {
            linear_forward(h_.data(), ln_.data(), fc_w, fc_b, 1, C, width);
            gelu_forward(h2_.data(), h_.data(), static_cast<size_t>(width));
            linear_forward(tmp_.data(), h2_.data(), proj_w, proj_b, 1, width, C);
        };
        // expert e of ex (routed or shared)
        const auto expert = [&](const moe::ExpertTensors<const float>& ex, int e, int width) {
            ffn(ex.fc_w + e * ex.fc_w_stride, ex.fc_b + e * ex.fc_b_stride,
                ex.proj_w + e * ex.proj_w_stride, ex.proj_b + e * ex.proj_b_stride, width);
        };
        if (cfg_.is_moe_block(l)) {
            const int E = cfg_.n_experts, K = cfg_.top_k, FE = cfg_.expert_width();
            if (cfg_.product_keys > 0) {  // the keys' scores, then their sums (moe/gate.h)
                linear_forward(gate_keys_.data(), ln_.data(), w.gate_w, nullptr, 1, C,
                               cfg_.gate_rows());
                moe::expand_product_keys(gate_logits_.data(), gate_keys_.data(), 1,
                                         cfg_.product_keys, E / cfg_.product_keys);
            } else {
                linear_forward(gate_logits_.data(), ln_.data(), w.gate_w, nullptr, 1, C, E);
            }
            // The router's inference path (moe/router.cpp) on one token, with its kernels: the
            // choice ranks logit + balancing bias, kept to the token's best expert groups under
            // node-limited routing; the weights read the logits (every gate routes as plain
            // top-k at inference, docs/model.md, Gates).
            const float* gl   = gate_logits_.data();
            const float* bias = biases_.empty() ? nullptr : biases_[moe_i].data();
            ++moe_i;
            const float* ch = moe::choice_scores(gl, bias, choice_.data(), limited_.data(), 1, E,
                                                 cfg_.route_groups, cfg_.route_nodes, K);
            moe::rank_experts(order_.data(), ch, 1, E, K);
            if (cfg_.gate == GateKind::switch_top1) {
                moe::softmax_rows(softmax_.data(), nullptr, gl, 1, E);
            }
            moe::selected_weights(probs_.data(), order_.data(), gl, softmax_.data(), 1, E, K,
                                  cfg_.gate, cfg_.router_score);
            std::fill(atty_.data(), atty_.data() + C, 0.0f);
            for (int k = 0; k < K; ++k) {
                expert(w.experts, order_[static_cast<size_t>(k)], FE);
                const float pk = probs_[static_cast<size_t>(k)];
                for (int c = 0; c < C; ++c) atty_[c] += pk * tmp_[c];
            }
            // the shared experts, unweighted, after the routed sum (docs/model.md, MoE FFN)
            for (int i = 0; i < cfg_.n_shared_experts; ++i) {
                expert(w.shared, i, cfg_.shared_width());
                for (int c = 0; c < C; ++c) atty_[c] += tmp_[c];
            }
            add_forward(x_.data(), x_.data(), atty_.data(), static_cast<size_t>(C));
        } else {
            ffn(w.fc_w, w.fc_b, w.fcproj_w, w.fcproj_b, F);
            add_forward(x_.data(), x_.data(), tmp_.data(), static_cast<size_t>(C));
        }
    }
    layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), w_.lnf_w, w_.lnf_b, 1, C);
    linear_forward(logits_.data(), ln_.data(), w_.wte, nullptr, 1, C, cfg_.vocab_size);
    ++pos_;
    return logits_.data();
}

int32_t sample_token(const float* logits, int V, const SampleOptions& opt, Rng& rng) {
    if (opt.temperature <= 0) {
        return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    }
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    int k = (opt.top_k > 0 && opt.top_k < V) ? opt.top_k : V;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [logits](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::vector<double> p(static_cast<size_t>(k));
    const double mx = logits[idx[0]];
    double sum      = 0;
    for (int i = 0; i < k; ++i) {
        p[static_cast<size_t>(i)] =
            std::exp((logits[idx[static_cast<size_t>(i)]] - mx) / opt.temperature);
        sum += p[static_cast<size_t>(i)];
    }
    double u = rng.uniform() * sum;
    for (int i = 0; i < k; ++i) {
        u -= p[static_cast<size_t>(i)];
        if (u <= 0) return idx[static_cast<size_t>(i)];
    }
    return idx[static_cast<size_t>(k - 1)];
}

}  // namespace bagualu::model

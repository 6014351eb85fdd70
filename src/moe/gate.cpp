#include "moe/gate.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"

namespace bagualu::moe {

void topk_gate_forward(float* probs, int32_t* expert_idx, float* softmax_full,
                       int32_t* tokens_per_expert, const float* logits, int N, int E, int K) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* l = logits + t * E;
            // full softmax (for the aux loss), in double
            double mx = l[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
            double sum = 0;
            for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
            for (int e = 0; e < E; ++e) {
                softmax_full[t * E + e] = static_cast<float>(std::exp(l[e] - mx) / sum);
            }
            // top-k by insertion into the output row, in descending logit order; ties keep the
            // lower expert id first (it was inserted earlier and is only passed by a larger logit)
            int32_t* top = expert_idx + t * K;
            int      n   = 0;
            for (int32_t e = 0; e < E; ++e) {
                int j = n < K ? n : K;
                while (j > 0 && l[e] > l[top[j - 1]]) --j;
                if (j >= K) continue;
                for (int i = (n < K ? n : K - 1); i > j; --i) top[i] = top[i - 1];
                top[j] = e;
                if (n < K) ++n;
            }
            const double best = l[top[0]];
            double       s    = 0;
            for (int k = 0; k < K; ++k) s += std::exp(l[top[k]] - best);
            for (int k = 0; k < K; ++k) {
                probs[t * K + k] = static_cast<float>(std::exp(l[top[k]] - best) / s);
            }
        }
    });
    std::fill(tokens_per_expert, tokens_per_expert + E, 0);
    for (int64_t i = 0; i < static_cast<int64_t>(N) * K; ++i) ++tokens_per_expert[expert_idx[i]];
}

void gate_prob_sums(double* prob_sum, const float* softmax_full, int N, int E) {
    std::fill(prob_sum, prob_sum + E, 0.0);
    for (int64_t t = 0; t < N; ++t) {
        for (int e = 0; e < E; ++e) prob_sum[e] += softmax_full[t * E + e];
    }
}

double aux_loss(double* f, const int64_t* tokens_per_expert, const double* prob_sum,
                int64_t n_total, int E, int K, double aux_coef) {
    double aux = 0;
    for (int e = 0; e < E; ++e) {
        f[e] = n_total > 0 ? static_cast<double>(tokens_per_expert[e]) / (static_cast<double>(n_total) * K) : 0.0;
        aux += f[e] * (n_total > 0 ? prob_sum[e] / static_cast<double>(n_total) : 0.0);
    }
    return aux_coef * E * aux;
}

void topk_gate_backward(float* dlogits, const float* dprobs, const float* probs,
                        const int32_t* expert_idx, const float* softmax_full, const double* f,
                        int64_t n_total, int N, int E, int K, double aux_coef, double daux) {
    // aux part: d aux / d logits[t, j] = coef E / n_total * s_tj (f_j - sum_e s_te f_e)
    const double aux_scale = n_total > 0 ? daux * aux_coef * E / static_cast<double>(n_total) : 0.0;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            float*       dl = dlogits + t * E;
            const float* s  = softmax_full + t * E;
            if (aux_scale != 0) {
                double sf = 0;
                for (int e = 0; e < E; ++e) sf += s[e] * f[e];
                for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(aux_scale * s[e] * (f[e] - sf));
            } else {
                std::fill(dl, dl + E, 0.0f);
            }
            // softmax over the selected logits: dl_k = p_k (dp_k - sum_j p_j dp_j)
            const float* p  = probs + t * K;
            const float* dp = dprobs + t * K;
            double       pd = 0;
            for (int k = 0; k < K; ++k) pd += static_cast<double>(p[k]) * dp[k];
            for (int k = 0; k < K; ++k) {
                dl[expert_idx[t * K + k]] += static_cast<float>(p[k] * (dp[k] - pd));
            }
        }
    });
}

}  // namespace bagualu::moe

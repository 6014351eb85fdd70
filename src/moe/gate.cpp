// Gate kernels: top-k selection, softmax weights, aux loss and capacity, forward and backward.
#include "moe/gate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/parallel_rows.h"

namespace bagualu::moe {

void rank_experts(int32_t* preference, const float* logits, int N, int E, int R) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        kernels::rank_rows(preference + begin * R, logits + begin * E, end - begin, E, R);
    });
}

const float* choice_scores(const float* scores, const float* bias, float* biased, float* limited,
                           int N, int E, int G, int M, int K) {
    const float* choice = scores;
    if (bias) {
        for (int64_t t = 0; t < N; ++t) {
            for (int e = 0; e < E; ++e) biased[t * E + e] = scores[t * E + e] + bias[e];
        }
        choice = biased;
    }
    if (M > 0) {
        limit_to_groups(limited, choice, N, E, G, M, K);
        choice = limited;
    }
    return choice;
}

void selected_weights(float* probs, const int32_t* selected, const float* scores,
                      const float* softmax_full, int N, int E, int K, GateKind gate,
                      RouterScore score) {
    if (gate == GateKind::switch_top1) {
        full_prob_forward(probs, selected, softmax_full, N, E);
    } else if (score == RouterScore::sigmoid) {
        selected_sigmoid_forward(probs, selected, scores, N, E, K);
    } else {
        selected_softmax_forward(probs, selected, scores, N, E, K);
    }
}

void limit_to_groups(float* masked, const float* scores, int N, int E, int G, int M, int K) {
    const int per = E / G, top = (K + M - 1) / M;
    const float ninf = -std::numeric_limits<float>::infinity();
    parallel_for(N, [&](int64_t begin, int64_t end) {
        std::vector<double> group_score(static_cast<size_t>(G));
        std::vector<float> best(static_cast<size_t>(top));
        std::vector<uint8_t> keep(static_cast<size_t>(G));
        for (int64_t t = begin; t < end; ++t) {
            const float* sc = scores + t * E;
            for (int g = 0; g < G; ++g) {
                // the group's `top` largest scores, descending, by insertion
                int n = 0;
                for (int e = g * per; e < (g + 1) * per; ++e) {
                    int j = n;
                    while (j > 0 && sc[e] > best[static_cast<size_t>(j - 1)]) --j;
                    if (j >= top) continue;
                    for (int i = (n < top ? n : top - 1); i > j; --i)
                        best[static_cast<size_t>(i)] = best[static_cast<size_t>(i - 1)];
                    best[static_cast<size_t>(j)] = sc[e];
                    if (n < top) ++n;
                }
                double sum = 0;
                for (int i = 0; i < n; ++i) sum += best[static_cast<size_t>(i)];
                group_score[static_cast<size_t>(g)] = sum;
            }
            // the M best groups: a group is kept when fewer than M groups beat it (strictly
            // larger, or equal with a lower index)
            for (int g = 0; g < G; ++g) {
                int ahead = 0;
                for (int h = 0; h < G; ++h) {
                    const double a = group_score[static_cast<size_t>(h)],
                                 b = group_score[static_cast<size_t>(g)];
                    ahead += a > b || (a == b && h < g);
                }
                keep[static_cast<size_t>(g)] = ahead < M;
            }
            float* out = masked + t * E;
            for (int e = 0; e < E; ++e) out[e] = keep[static_cast<size_t>(e / per)] ? sc[e] : ninf;
        }
    });
}

double softmax_rows(float* softmax_full, double* entropy, const float* logits, int N, int E) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        // each exponential once (a grow-only row of the calling thread), and the entropy from
        // log p = (g - max) - log(sum): one exp an expert instead of two exps and a log, which
        // made this the largest part of a 64-expert router's forward
        thread_local std::vector<double> row;
        double* ex = kernels::grow(row, static_cast<size_t>(E));
        for (int64_t t = begin; t < end; ++t) {
            const float* l = logits + t * E;
            double mx      = l[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
            for (int e = 0; e < E; ++e) ex[e] = l[e] - mx;
            kernels::exp_f64(ex, ex, E);  // the row's exps at once (SIMD)
            double sum = 0;
            for (int e = 0; e < E; ++e) sum += ex[e];
            const double log_sum = std::log(sum);
            double h             = 0;
            for (int e = 0; e < E; ++e) {
                const double p          = ex[e] / sum;
                softmax_full[t * E + e] = static_cast<float>(p);
                if (p > 0) h -= p * ((l[e] - mx) - log_sum);
            }
            if (entropy) entropy[t] = h;
        }
    });
    double sum = 0;
    for (int64_t t = 0; entropy && t < N; ++t) sum += entropy[t];
    return sum;
}

void selected_softmax_forward(float* probs, const int32_t* selected, const float* logits, int N,
                              int E, int K) {
    // threaded over tokens, each exponential once (in a grow-only row of the calling thread)
    parallel_for(N, [&](int64_t begin, int64_t end) {
        thread_local std::vector<double> row;
        double* ex = kernels::grow(row, static_cast<size_t>(K));
        for (int64_t t = begin; t < end; ++t) {
            const float* l     = logits + t * E;
            const int32_t* sel = selected + t * K;
            double mx          = l[sel[0]];
            for (int k = 1; k < K; ++k) mx = std::max(mx, static_cast<double>(l[sel[k]]));
            double s = 0;
            for (int k = 0; k < K; ++k) {
                ex[k] = std::exp(l[sel[k]] - mx);
                s += ex[k];
            }
            for (int k = 0; k < K; ++k) probs[t * K + k] = static_cast<float>(ex[k] / s);
        }
    });
}

void selected_softmax_backward(float* dlogits, const float* dprobs, const float* probs,
                               const int32_t* selected, int N, int E, int K) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* p  = probs + t * K;
            const float* dp = dprobs + t * K;
            double pd       = 0;
            for (int k = 0; k < K; ++k) pd += static_cast<double>(p[k]) * dp[k];
            for (int k = 0; k < K; ++k) {
                dlogits[t * E + selected[t * K + k]] += static_cast<float>(p[k] * (dp[k] - pd));
            }
        }
    });
}

void selected_sigmoid_forward(float* probs, const int32_t* selected, const float* logits, int N,
                              int E, int K) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        thread_local std::vector<double> row;
        double* sg = kernels::grow(row, static_cast<size_t>(K));
        for (int64_t t = begin; t < end; ++t) {
            const float* l     = logits + t * E;
            const int32_t* sel = selected + t * K;
            double sum         = 0;
            for (int k = 0; k < K; ++k) {
                sg[k] = 1.0 / (1.0 + std::exp(-double(l[sel[k]])));
                sum += sg[k];
            }
            for (int k = 0; k < K; ++k) probs[t * K + k] = static_cast<float>(sg[k] / sum);
        }
    });
}

void selected_sigmoid_backward(float* dlogits, const float* dprobs, const float* probs,
                               const int32_t* selected, const float* logits, int N, int E, int K) {
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* p     = probs + t * K;
            const float* dp    = dprobs + t * K;
            const float* l     = logits + t * E;
            const int32_t* sel = selected + t * K;
            double pd = 0, sum = 0;
            for (int k = 0; k < K; ++k) {
                pd += static_cast<double>(p[k]) * dp[k];
                sum += 1.0 / (1.0 + std::exp(-double(l[sel[k]])));
            }
            for (int k = 0; k < K; ++k) {
                const double s = 1.0 / (1.0 + std::exp(-double(l[sel[k]])));
                dlogits[t * E + sel[k]] += static_cast<float>(s * (1 - s) * (dp[k] - pd) / sum);
            }
        }
    });
}

void full_prob_forward(float* probs, const int32_t* selected, const float* softmax_full, int N,
                       int E) {
    for (int64_t t = 0; t < N; ++t) probs[t] = softmax_full[t * E + selected[t]];
}

void full_prob_backward(float* dlogits, const float* dprobs, const int32_t* selected,
                        const float* softmax_full, int N, int E) {
    // p = s_e: d p / d g_j = s_e (delta_je - s_j)
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* s  = softmax_full + t * E;
            const int e     = selected[t];
            const double ge = static_cast<double>(dprobs[t]) * s[e];
            for (int j = 0; j < E; ++j)
                dlogits[t * E + j] += static_cast<float>(ge * ((j == e ? 1.0 : 0.0) - s[j]));
        }
    });
}

void topk_gate_forward(float* probs, int32_t* expert_idx, float* softmax_full,
                       int32_t* tokens_per_expert, const float* logits, int N, int E, int K) {
    softmax_rows(softmax_full, nullptr, logits, N, E);
    rank_experts(expert_idx, logits, N, E, K);
    selected_softmax_forward(probs, expert_idx, logits, N, E, K);
    std::fill(tokens_per_expert, tokens_per_expert + E, 0);
    for (int64_t i = 0; i < static_cast<int64_t>(N) * K; ++i) ++tokens_per_expert[expert_idx[i]];
}

void topk_gate_backward(float* dlogits, const float* dprobs, const float* probs,
                        const int32_t* expert_idx, const float* softmax_full, const double* f,
                        int64_t n_total, int N, int E, int K, double aux_coef, double daux) {
    aux_loss_backward(dlogits, softmax_full, f, n_total, N, E, aux_coef, daux);
    selected_softmax_backward(dlogits, dprobs, probs, expert_idx, N, E, K);
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
        f[e] = n_total > 0
                   ? static_cast<double>(tokens_per_expert[e]) / (static_cast<double>(n_total) * K)
                   : 0.0;
        aux += f[e] * (n_total > 0 ? prob_sum[e] / static_cast<double>(n_total) : 0.0);
    }
    return aux_coef * E * aux;
}

void aux_loss_backward(float* dlogits, const float* softmax_full, const double* f0, int64_t n_total,
                       int N, int E, double aux_coef, double daux, int f_stride_tokens) {
    const double scale = n_total > 0 ? daux * aux_coef * E / static_cast<double>(n_total) : 0.0;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            float* dl      = dlogits + t * E;
            const float* s = softmax_full + t * E;
            if (scale == 0) {
                std::fill(dl, dl + E, 0.0f);
                continue;
            }
            const double* f = f_stride_tokens > 0 ? f0 + t / f_stride_tokens * E : f0;
            double sf       = 0;
            for (int e = 0; e < E; ++e) sf += s[e] * f[e];
            for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(scale * s[e] * (f[e] - sf));
        }
    });
}

int64_t capacity_drop(int32_t* expert_idx, const int64_t* ahead, int64_t capacity, int N, int E,
                      int K) {
    int64_t dropped = 0;
    for (int k = 0; k < K; ++k) {
        std::vector<int64_t> queue(ahead + static_cast<int64_t>(k) * E,
                                   ahead + static_cast<int64_t>(k + 1) * E);
        for (int64_t t = 0; t < N; ++t) {
            int32_t& e = expert_idx[t * K + k];
            if (e < 0) continue;
            if (queue[static_cast<size_t>(e)]++ >= capacity) {
                e = -1;
                ++dropped;
            }
        }
    }
    return dropped;
}

void expand_product_keys(float* logits, const float* keys, int64_t N, int E1, int E2) {
    const int64_t E = static_cast<int64_t>(E1) * E2, G = E1 + E2;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* u = keys + t * G;
            const float* v = u + E1;
            float* row     = logits + t * E;
            for (int a = 0; a < E1; ++a) {
                float* r = row + static_cast<int64_t>(a) * E2;
                for (int b = 0; b < E2; ++b) r[b] = u[a] + v[b];
            }
        }
    });
}

void reduce_product_keys(float* dkeys, const float* dlogits, int64_t N, int E1, int E2) {
    const int64_t E = static_cast<int64_t>(E1) * E2, G = E1 + E2;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        thread_local std::vector<double> col;  // the column sums; grown once per thread
        if (col.size() < static_cast<size_t>(E2)) col.resize(static_cast<size_t>(E2));
        for (int64_t t = begin; t < end; ++t) {
            const float* row = dlogits + t * E;
            float* du        = dkeys + t * G;
            std::fill(col.begin(), col.begin() + E2, 0.0);
            for (int a = 0; a < E1; ++a) {
                const float* r = row + static_cast<int64_t>(a) * E2;
                double s       = 0;
                for (int b = 0; b < E2; ++b) {
                    s += r[b];
                    col[static_cast<size_t>(b)] += r[b];
                }
                du[a] = static_cast<float>(s);
            }
            for (int b = 0; b < E2; ++b)
                du[E1 + b] = static_cast<float>(col[static_cast<size_t>(b)]);
        }
    });
}

}  // namespace bagualu::moe

// Noisy top-k gate: noisy logits, load probabilities and the CV^2 balance losses (noisy_gate.h).
#include "moe/noisy_gate.h"

#include <cmath>

#include "core/thread_pool.h"

namespace bagualu::moe {

static double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
static double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
static double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }

void noisy_logits_forward(float* noisy, const float* clean, const float* noise_logits,
                          const float* eps, int N, int E) {
    for (int64_t i = 0; i < static_cast<int64_t>(N) * E; ++i) {
        noisy[i] = static_cast<float>(clean[i] + eps[i] * softplus(noise_logits[i]));
    }
}

void noisy_logits_backward(float* dclean, float* dnoise_logits, const float* dnoisy,
                           const float* noise_logits, const float* eps, int N, int E) {
    for (int64_t i = 0; i < static_cast<int64_t>(N) * E; ++i) {
        dclean[i] += dnoisy[i];
        dnoise_logits[i] += static_cast<float>(dnoisy[i] * eps[i] * sigmoid(noise_logits[i]));
    }
}

// The threshold of (t, e) and the expert whose H sets it; -1 when every expert is chosen.
static int32_t threshold_expert(const int32_t* pref, int e, int E, int K) {
    bool in = false;
    for (int k = 0; k < K; ++k) in = in || pref[k] == e;
    if (in) return K < E ? pref[K] : -1;
    return pref[K - 1];
}

void load_prob_forward(float* load_prob, const float* clean, const float* noise_logits,
                       const float* noisy, const int32_t* preference, int N, int E, int K) {
    const int R = K < E ? K + 1 : E;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            for (int e = 0; e < E; ++e) {
                const int32_t j = threshold_expert(preference + t * R, e, E, K);
                const int64_t i = t * E + e;
                if (j < 0) {
                    load_prob[i] = 1.0f;
                } else {
                    const auto z = (clean[i] - noisy[t * E + j]) / softplus(noise_logits[i]);
                    load_prob[i] = static_cast<float>(normal_cdf(z));
                }
            }
        }
    });
}

void load_prob_backward(float* dclean, float* dnoise_logits, const double* dload,
                        const float* clean, const float* noise_logits, const float* eps,
                        const float* noisy, const int32_t* preference, int N, int E, int K) {
    const int R = K < E ? K + 1 : E;
    parallel_for(N, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            for (int e = 0; e < E; ++e) {
                const int32_t j = threshold_expert(preference + t * R, e, E, K);
                if (j < 0) continue;
                const int64_t i = t * E + e, ij = t * E + j;
                const double sd = softplus(noise_logits[i]);
                const double z  = (clean[i] - noisy[ij]) / sd;
                const double d  = dload[e] * normal_pdf(z) / sd;  // d loss / d clean[t, e]
                dclean[i] += static_cast<float>(d);
                dnoise_logits[i] += static_cast<float>(-d * z * sigmoid(noise_logits[i]));
                // thr = H[t, j] = g[t, j] + eps[t, j] sd[t, j]
                dclean[ij] -= static_cast<float>(d);
                dnoise_logits[ij] -= static_cast<float>(d * eps[ij] * sigmoid(noise_logits[ij]));
            }
        }
    });
}

double cv_squared(double* dv, const double* v, int E) {
    double s1 = 0, s2 = 0;
    for (int e = 0; e < E; ++e) {
        s1 += v[e];
        s2 += v[e] * v[e];
    }
    if (s1 == 0) {
        for (int e = 0; e < E; ++e) dv[e] = 0;
        return 0;
    }
    // CV^2 = E s2 / s1^2 - 1;  d/dv_e = 2 E / s1^2 (v_e - s2 / s1)
    for (int e = 0; e < E; ++e) dv[e] = 2.0 * E / (s1 * s1) * (v[e] - s2 / s1);
    return E * s2 / (s1 * s1) - 1.0;
}

}  // namespace bagualu::moe

// Noisy top-k gate (Shazeer et al. 2017), local math only; every symbol defined:
//   g[t, e]   clean router logits u_t W_g^T;   r[t, e] noise logits u_t W_noise^T
//   sd[t, e]  = softplus(r[t, e]);  eps[t, e] ~ N(0, 1) (0 outside training)
//   H[t, e]   = g[t, e] + eps[t, e] sd[t, e]            the noisy logits; top-k and weights use H
//   load_prob[t, e] = Phi((g[t, e] - thr[t, e]) / sd[t, e]), Phi the standard normal CDF,
//             thr = the K-th largest H[t, :] excluding e itself: the (K+1)-th largest if e is among
//             the top K, else the K-th largest (with K = E every expert is always chosen: 1)
//   Importance_e = sum_t G[t, e] (G = the gate weights),  Load_e = sum_t load_prob[t, e],
//   sums over every token of the micro-step on all ranks, and
//   loss = coef (CV(Importance)^2 + CV(Load)^2),  CV(v)^2 = E sum_e v_e^2 / (sum_e v_e)^2 - 1.
#pragma once
#include <cstdint>

namespace bagualu::moe {

// noisy: (N, E), overwritten.
void noisy_logits_forward(float* noisy, const float* clean, const float* noise_logits,
                          const float* eps, int N, int E);
// dclean, dnoise_logits: (N, E), accumulated (+=), from dnoisy (N, E).
void noisy_logits_backward(float* dclean, float* dnoise_logits, const float* dnoisy,
                           const float* noise_logits, const float* eps, int N, int E);

// load_prob: (N, E), overwritten. preference: (N, R) the R = min(K + 1, E) best experts by H.
void load_prob_forward(float* load_prob, const float* clean, const float* noise_logits,
                       const float* noisy, const int32_t* preference, int N, int E, int K);
// dload: (E) d loss / d Load_e. dclean, dnoise_logits: (N, E), accumulated (+=); the threshold's
// gradient goes to the H of the expert that sets it.
void load_prob_backward(float* dclean, float* dnoise_logits, const double* dload,
                        const float* clean, const float* noise_logits, const float* eps,
                        const float* noisy, const int32_t* preference, int N, int E, int K);

// CV(v)^2 and its gradient dv (E), overwritten; 0 when sum v = 0.
double cv_squared(double* dv, const double* v, int E);

}  // namespace bagualu::moe

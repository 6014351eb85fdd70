// Top-k gate: from router logits to the experts each token goes to and their weights.
//   probs[t, :]   = softmax over the k largest logits of token t (ties: lower expert id first)
//   expert_idx[t] = those k experts, in descending logit order
// Load-balancing loss (Switch/GShard, generalised to top-k), over all tokens of a micro-step on
// every rank (the caller sums counts and probabilities across ranks), every symbol defined:
//   f_e  = (number of (token, slot) pairs routed to e) / (N K)
//   P_e  = (1/N) sum_t softmax(logits[t, :])_e
//   aux  = coef * E * sum_e f_e P_e        (f is a constant: only P carries gradient)
// Softmax and sums are computed in double. N tokens, E experts, K = top_k.
#pragma once
#include <cstdint>

namespace bagualu::moe {

// probs: (N, K). expert_idx: (N, K). softmax_full: (N, E), saved for the aux loss backward.
// tokens_per_expert: (E), overwritten with this call's counts.
void topk_gate_forward(float* probs, int32_t* expert_idx, float* softmax_full,
                       int32_t* tokens_per_expert, const float* logits, int N, int E, int K);

// prob_sum: (E), overwritten: sum over this call's tokens of softmax_full[t, e].
void gate_prob_sums(double* prob_sum, const float* softmax_full, int N, int E);

// From counts and probability sums over all n_total tokens: fills f (E) and returns aux.
double aux_loss(double* f, const int64_t* tokens_per_expert, const double* prob_sum,
                int64_t n_total, int E, int K, double aux_coef);

// dlogits: (N, E), overwritten (=). dprobs: (N, K), the loss gradient w.r.t. probs.
// f: (E) from aux_loss. daux: gradient of the total loss w.r.t. aux.
void topk_gate_backward(float* dlogits, const float* dprobs, const float* probs,
                        const int32_t* expert_idx, const float* softmax_full, const double* f,
                        int64_t n_total, int N, int E, int K, double aux_coef, double daux);

}  // namespace bagualu::moe

// Gate kernels: from router logits to each token's experts and weights, and their gradients.
// Local math only (no communication, no randomness); src/moe/router.cpp composes them into
// the gates of docs/model.md ("Gates"). N tokens, E experts, K = top_k; softmax in double.
//   top-k:     selected[t] = the K largest logits, descending (ties: lower expert id first)
//              probs[t, k] = exp(g[t, selected[t,k]]) / sum_j exp(g[t, selected[t,j]])
//   aux (Switch/GShard, generalised to top-k), every symbol defined:
//     f_e  = (number of (token, slot) pairs whose top-k choice is e) / (N K)   (a constant)
//     P_e  = (1/N) sum_t softmax(g[t, :])_e
//     aux  = coef * E * sum_e f_e P_e
#pragma once
#include <cstdint>

#include "config/enums.h"

namespace bagualu::moe {

// probs: (N, K). expert_idx: (N, K). softmax_full: (N, E), saved for the aux loss backward.
// tokens_per_expert: (E), overwritten with this call's counts.
void topk_gate_forward(float* probs, int32_t* expert_idx, float* softmax_full,
                       int32_t* tokens_per_expert, const float* logits, int N, int E, int K);
// dlogits: (N, E), overwritten (=). dprobs: (N, K). f: (E) from aux_loss. daux: d loss / d aux.
void topk_gate_backward(float* dlogits, const float* dprobs, const float* probs,
                        const int32_t* expert_idx, const float* softmax_full, const double* f,
                        int64_t n_total, int N, int E, int K, double aux_coef, double daux);

// ---- pieces ----

// preference: (N, R), overwritten: the R best experts of each token, best first.
void rank_experts(int32_t* preference, const float* logits, int N, int E, int R);
// Node-limited routing: masked (N, E), overwritten with scores where expert e's group (G groups
// of E / G consecutive experts) is among the token's M best groups, -infinity elsewhere. A
// group's score is the sum of its ceil(K / M) largest scores; ties keep the lower group.
// Needs K <= M * E / G, so the K best of masked are all finite.
void limit_to_groups(float* masked, const float* scores, int N, int E, int G, int M, int K);
// The scores the router ranks experts by (docs/model.md, Gates): scores plus the balancing bias
// (bias: (E), nullptr for none) into biased, then with node-limited routing (M > 0) kept to each
// token's M best of G groups into limited (limit_to_groups). Returns scores itself when neither
// applies; biased and limited, (N, E), are written only when used. The router and the
// generator both choose through it.
const float* choice_scores(const float* scores, const float* bias, float* biased, float* limited,
                           int N, int E, int G, int M, int K);
// The selected experts' weights, probs (N, K) overwritten, by the gate's scoring: the Switch
// gate's full softmax (softmax_full, (N, E); full_prob_forward), else the normalised sigmoid or
// the softmax of the selected scores.
void selected_weights(float* probs, const int32_t* selected, const float* scores,
                      const float* softmax_full, int N, int E, int K, GateKind gate,
                      RouterScore score);
// softmax_full: (N, E), overwritten. entropy: (N), overwritten with H(softmax(g[t, :])) (nats),
// or nullptr. Returns sum_t of the entropies (0 without the buffer).
double softmax_rows(float* softmax_full, double* entropy, const float* logits, int N, int E);
// probs: (N, K), overwritten: softmax over k of logits[t, selected[t, k]].
void selected_softmax_forward(float* probs, const int32_t* selected, const float* logits, int N,
                              int E, int K);
// dlogits: (N, E), accumulated (+=): dl[sel[t,k]] += p_k (dp_k - sum_j p_j dp_j).
void selected_softmax_backward(float* dlogits, const float* dprobs, const float* probs,
                               const int32_t* selected, int N, int E, int K);
// probs: (N, K), overwritten: sigmoid(logits[t, selected[t, k]]) normalised over k
// (DeepSeek-V3): p_k = s_k / sum_j s_j, s = sigmoid(g).
void selected_sigmoid_forward(float* probs, const int32_t* selected, const float* logits, int N,
                              int E, int K);
// dlogits: (N, E), accumulated (+=): dl[sel[t,k]] += s_k (1 - s_k) (dp_k - sum_j p_j dp_j) / sum_j
// s_j.
void selected_sigmoid_backward(float* dlogits, const float* dprobs, const float* probs,
                               const int32_t* selected, const float* logits, int N, int E, int K);
// Switch weight: probs[t, 0] = softmax_full[t, selected[t, 0]] (K = 1). dlogits +=.
void full_prob_forward(float* probs, const int32_t* selected, const float* softmax_full, int N,
                       int E);
void full_prob_backward(float* dlogits, const float* dprobs, const int32_t* selected,
                        const float* softmax_full, int N, int E);

// Product-key gate (model.product_keys, docs/model.md): keys (N, E1 + E2) hold each token's
// scores u_a . x (a < E1) then v_b . x (b < E2). logits (N, E1 E2), overwritten:
// logits[t, a E2 + b] = keys[t, a] + keys[t, E1 + b] (a float sum).
void expand_product_keys(float* logits, const float* keys, int64_t N, int E1, int E2);
// Its gradient: dkeys (N, E1 + E2), overwritten with the row and column sums of each token's
// dlogits viewed as (E1, E2): dkeys[t, a] = sum_b dlogits[t, a E2 + b], dkeys[t, E1 + b] =
// sum_a dlogits[t, a E2 + b], each summed in double in that order and rounded once.
void reduce_product_keys(float* dkeys, const float* dlogits, int64_t N, int E1, int E2);

// prob_sum: (E), overwritten: sum over this call's tokens of softmax_full[t, e].
void gate_prob_sums(double* prob_sum, const float* softmax_full, int N, int E);
// From counts and probability sums over all n_total tokens: fills f (E) and returns aux.
double aux_loss(double* f, const int64_t* tokens_per_expert, const double* prob_sum,
                int64_t n_total, int E, int K, double aux_coef);
// dlogits: (N, E), overwritten (=): d aux / d g[t, j] = coef E / n_total * s_tj (f_j - sum_e s_te
// f_e), times daux. f_stride_tokens = T > 0: f holds one (E) row per T tokens (the per-sequence
// loss: token t reads row t / T); 0: one row for all.
void aux_loss_backward(float* dlogits, const float* softmax_full, const double* f, int64_t n_total,
                       int N, int E, double aux_coef, double daux, int f_stride_tokens = 0);

// Capacity: expert e takes at most `capacity` slots; slots queue round by round (all tokens'
// slot 0, then slot 1, ...) and, within a round, in global token order. ahead: (K, E) slots of
// round k queued for e before this call's first token (earlier rounds on every rank plus round
// k of earlier ranks). Slots that find the queue full get expert_idx = -1. Returns how many.
int64_t capacity_drop(int32_t* expert_idx, const int64_t* ahead, int64_t capacity, int N, int E,
                      int K);

}  // namespace bagualu::moe

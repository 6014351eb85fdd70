// Memory-bound and small fused kernels of the transformer, float32, forward/backward side by side.
// Dimension letters: B batch, T sequence, C channels (d_model), NH heads, hs = C / NH head size,
// V vocab, N = B*T rows, n a flat element count.
// Backward conventions: parameter grads are accumulated (+=) so micro-batches add up; activation
// grads are overwritten (=) unless stated otherwise (the residual stream uses +=).
// Threaded with parallel_for over rows/heads; results do not depend on the thread count.
// The scalar, double-accumulating oracle for every kernel here is kernels/ref/ops_ref.h.
// Layernorm, GELU, attention, cross-entropy and AdamW run the implementation of the active
// table of kernels/dispatch.h (per ISA, BGL_ISA overrides); the rest have one implementation.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dispatch.h"

namespace bagualu::kernels {

// ---- linear: out = inp @ weight^T + bias ----
// out: (N, OC). inp: (N, IC). weight: (OC, IC). bias: (OC) or nullptr.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC);
// dinp: (N, IC), overwritten (=); skipped when nullptr. dweight: (OC, IC) +=, skipped when
// nullptr (inp is then not read). dbias: (OC) +=, skipped when nullptr. Each part is computed
// the same way whether the others are skipped or not.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] ----
// out: (B, T, C). tokens: (B, T). wte: (V, C). wpe: (maxT, C) with maxT >= T.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);
// dwte: (V, C) +=. dwpe: (maxT, C) +=. Deterministic (no atomics; fixed summation order).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// ---- layernorm over the last dimension, eps = 1e-5 ----
// out, inp: (N, C). weight, bias: (C). mean, rstd: (N), saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp: (N, C), accumulated (+=): layernorm inputs are the residual stream.
// dweight, dbias: (C) +=.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// ---- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_forward(float* out, const float* inp, size_t n);
// dinp: (n), overwritten (=). dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// ---- residual: out = a + b (out may alias a or b) ----
void add_forward(float* out, const float* a, const float* b, size_t n);

// ---- causal multi-head self-attention ----
// qkv: (B, T, 3C), per row [q | k | v], head h owns columns h*hs .. (h+1)*hs of each.
// out: (B, T, C). lse: (B, NH, T), the log-sum-exp of each query's scaled scores, saved for
// backward. Scores are scaled by 1/sqrt(hs). The (T, T) score matrix is never materialised.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv: (B, T, 3C), overwritten (=). Recomputes probabilities from qkv and lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);

// ---- softmax cross-entropy over logits ----
// losses: (N), losses[i] = logsumexp(logits[i,:]) - logits[i, targets[i]].
// logits: (N, V). targets: (N), each in [0, V). lse: null, or (N): each row's logsumexp rounded
// to float, as the backward uses it.
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          float* lse = nullptr);
// dlogits: (N, V), overwritten (=): (softmax(logits[i]) - onehot(targets[i])) * dlosses[i].
// dlogits may alias logits. lse: null (each row's logsumexp computed again), or the forward's
// lse of the same logits: the same bits, one pass over each row less.
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           const float* dlosses, int N, int V, const float* lse = nullptr);

// ---- AdamW (decoupled weight decay), one flat block of parameters ----
// step is 1-based (bias correction uses beta^step). With g = grad * grad_scale (one float
// multiply: bitwise scale_inplace(grad, grad_scale) first, so the global-norm clip costs no pass
// of its own; grad itself is only read), updates param, m, v in place:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   param -= lr * ( m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + weight_decay * param )
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale = 1.0f);
// The bias corrections 1 - beta^step, rounded to float as every AdamW kernel uses them.
struct AdamWCorrections {
    float c1, c2;
};
AdamWCorrections adamw_corrections(float beta1, float beta2, int step);
// adamw_update on elements [begin, end) only, on the calling thread (for a caller's own pool
// job that does more with each slice while it is in cache: kernels/mixed.h
// adamw_update_rounded).
void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, const AdamWCorrections& c, float grad_scale = 1.0f);

// ---- row sums and the combine's gradient rows, on the calling thread ----
// s[c] += sum over rows r in [0, n) of x[r ld + c], c in [0, w): each column summed in double,
// row by row in order, whatever the ISA (so a column's sum has the same bits everywhere).
void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w);
// The same over bf16 values, x their bits.
void col_sums_f64_bf16(double* s, const uint16_t* x, int64_t n, int64_t ld, int w);
// dbias[c] = float(double(dbias[c]) + sum over rows r in [0, n) of x[r ld + c]), c in [0, w):
// the column sums above from zero, added once (a bias gradient). Nothing allocated: the sums
// of a block of columns at a time lie on the stack. x: floats, or bf16 bits.
void add_col_sums(float* dbias, const float* x, int64_t n, int64_t ld, int w);
void add_col_sums(float* dbias, const uint16_t* x, int64_t n, int64_t ld, int w);
// For each j in [0, n): dy[j][c] = w[j] * d[c] and dots[j] = dot(d, y[j]) over c in [0, C),
// the products in double into four partial sums (element c into sum c mod 4), returned as
// float((s0 + s1) + (s2 + s3)); the same bits on every ISA. The n rows of one token's slots
// run interleaved, so their dependent adds overlap. dy == nullptr: the dots only (the experts
// then form w * d from d themselves, kernels/mixed.h narrow_dout_rows).
void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C);
// The same with y the bits of bf16 rows (their values widened exactly): the experts' outputs
// kept in 16 bits (moe/moe_layer.h).
void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const uint16_t* const* y, int n, int C);
// Each of n rows of E scores (row r at x + r E) ranked: top[r R + i] = the index of the row's
// i-th largest score, i in [0, R), 1 <= R <= E, equal scores in increasing index (a stable sort
// into descending order, its first R). The same indices on every ISA: a row holding a NaN is
// ranked by the generic insertion there too (a NaN passes no score and no score passes it).
void rank_rows(int32_t* top, const float* x, int64_t n, int E, int R);
// o[c] = the sum over j in [0, n) of w[j] * y[j][c], c in [0, C): from +0, in j order, each
// product rounded to float before it is added (no FMA); the same bits on every ISA. The combine
// of one token's slot rows.
void weighted_row_sum(float* o, const float* w, const float* const* y, int n, int C);
// o[c] += the sum over j in [0, n) of y[j][c]: the sum from +0 in j order, then added to o once;
// the same bits on every ISA. The input gradient's sum over one token's slot rows.
void add_row_sum(float* o, const float* const* y, int n, int C);
// x[i] = +0 for i in [0, n) on the calling thread, with non-temporal stores where the ISA has
// them (an array not read again soon: the gradients zeroed at a step's start), fenced.
void zero_stream(float* x, size_t n);
// y[i] = exp(x[i]) for i in [0, n) on the calling thread (y == x allowed), for the FP64
// softmaxes of the router. generic: std::exp; avx2 and avx512: glibc's vector exp (libmvec,
// 4 at a time), within 3 ulp of std::exp, the same bits in both tables.
void exp_f64(double* y, const double* x, int64_t n);

// Sum of squares of x, accumulated in double (for global-norm clipping).
double sum_squares(const float* x, size_t n);
// The sum over r in [0, count) of sum_squares(x[r], n[r]), added in order: bitwise those calls'
// total, in one pass over the compute threads instead of one a run (ParO's norm over a shard's
// pieces, one a tensor).
double sum_squares_runs(const float* const* x, const size_t* n, size_t count);
// x *= s
void scale_inplace(float* x, float s, size_t n);

}  // namespace bagualu::kernels

// Scalar reference versions of every kernel in kernels/ops.h: the oracle the fast kernels are
// tested against, and (instantiated with Real = double) the kernels the finite-difference gradient
// checks run on. Plain loops in the order the math is written, sums accumulated in double.
// Single-threaded and unoptimised; they may allocate. Not for use in training.
// Same argument order, shapes and =/+= conventions as kernels/ops.h.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <vector>

namespace bagualu::kernels::ref {

// Accumulator type: double for float and double inputs.
using Acc = double;

// ---- linear: out = inp @ weight^T + bias ----
// out: (N, OC). inp: (N, IC). weight: (OC, IC). bias: (OC) or nullptr.
template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int N, int IC,
                    int OC) {
    for (int i = 0; i < N; ++i) {
        for (int o = 0; o < OC; ++o) {
            Acc s = bias ? Acc(bias[o]) : Acc(0);
            for (int k = 0; k < IC; ++k) {
                s += Acc(inp[size_t(i) * IC + k]) * Acc(weight[size_t(o) * IC + k]);
            }
            out[size_t(i) * OC + o] = Real(s);
        }
    }
}

// dinp: (N, IC) =, skipped when nullptr. dweight: (OC, IC) +=. dbias: (OC) +=, skipped when
// nullptr.
template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, int N, int IC, int OC) {
    if (dinp) {
        for (int i = 0; i < N; ++i) {
            for (int k = 0; k < IC; ++k) {
                Acc s = 0;
                for (int o = 0; o < OC; ++o) {
                    s += Acc(dout[size_t(i) * OC + o]) * Acc(weight[size_t(o) * IC + k]);
                }
                dinp[size_t(i) * IC + k] = Real(s);
            }
        }
    }
    for (int o = 0; o < OC; ++o) {
        for (int k = 0; k < IC; ++k) {
            Acc s = 0;
            for (int i = 0; i < N; ++i) {
                s += Acc(dout[size_t(i) * OC + o]) * Acc(inp[size_t(i) * IC + k]);
            }
            dweight[size_t(o) * IC + k] = Real(Acc(dweight[size_t(o) * IC + k]) + s);
        }
    }
    if (dbias) {
        for (int o = 0; o < OC; ++o) {
            Acc s = 0;
            for (int i = 0; i < N; ++i) s += Acc(dout[size_t(i) * OC + o]);
            dbias[o] = Real(Acc(dbias[o]) + s);
        }
    }
}

// ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] ----
// out: (B, T, C). tokens: (B, T). wte: (V, C). wpe: (maxT, C).
template <typename Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B,
                       int T, int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const size_t row = size_t(b) * T + t;
            const size_t tok = size_t(tokens[row]);
            for (int c = 0; c < C; ++c) {
                out[row * C + c] = Real(Acc(wte[tok * C + c]) + Acc(wpe[size_t(t) * C + c]));
            }
        }
    }
}

// dwte: (V, C) +=. dwpe: (maxT, C) +=.
template <typename Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B,
                        int T, int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const size_t row = size_t(b) * T + t;
            const size_t tok = size_t(tokens[row]);
            for (int c = 0; c < C; ++c) {
                dwte[tok * C + c] = Real(Acc(dwte[tok * C + c]) + Acc(dout[row * C + c]));
                dwpe[size_t(t) * C + c] =
                    Real(Acc(dwpe[size_t(t) * C + c]) + Acc(dout[row * C + c]));
            }
        }
    }
}

// ---- layernorm over the last dimension, eps = 1e-5 ----
// out, inp: (N, C). weight, bias: (C). mean, rstd: (N).
template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int N, int C) {
    for (int i = 0; i < N; ++i) {
        const Real* x = inp + size_t(i) * C;
        Acc m         = 0;
        for (int c = 0; c < C; ++c) m += Acc(x[c]);
        m /= C;
        Acc var = 0;
        for (int c = 0; c < C; ++c) var += (Acc(x[c]) - m) * (Acc(x[c]) - m);
        var /= C;
        const Acc s = 1.0 / std::sqrt(var + 1e-5);
        for (int c = 0; c < C; ++c) {
            out[size_t(i) * C + c] = Real((Acc(x[c]) - m) * s * Acc(weight[c]) + Acc(bias[c]));
        }
        mean[i] = Real(m);
        rstd[i] = Real(s);
    }
}

// dinp: (N, C) +=. dweight, dbias: (C) +=.
template <typename Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* mean, const Real* rstd, int N, int C) {
    for (int i = 0; i < N; ++i) {
        const Real* x  = inp + size_t(i) * C;
        const Real* dy = dout + size_t(i) * C;
        const Acc m    = Acc(mean[i]);
        const Acc s    = Acc(rstd[i]);
        // norm = (x - mean) * rstd; dnorm = weight * dout.
        Acc dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int c = 0; c < C; ++c) {
            const Acc norm  = (Acc(x[c]) - m) * s;
            const Acc dnorm = Acc(weight[c]) * Acc(dy[c]);
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; ++c) {
            const Acc norm          = (Acc(x[c]) - m) * s;
            const Acc dnorm         = Acc(weight[c]) * Acc(dy[c]);
            const Acc g             = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            dinp[size_t(i) * C + c] = Real(Acc(dinp[size_t(i) * C + c]) + g);
        }
    }
    for (int c = 0; c < C; ++c) {
        Acc dw = 0, db = 0;
        for (int i = 0; i < N; ++i) {
            const Acc norm = (Acc(inp[size_t(i) * C + c]) - Acc(mean[i])) * Acc(rstd[i]);
            dw += norm * Acc(dout[size_t(i) * C + c]);
            db += Acc(dout[size_t(i) * C + c]);
        }
        dweight[c] = Real(Acc(dweight[c]) + dw);
        dbias[c]   = Real(Acc(dbias[c]) + db);
    }
}

// ---- GELU, tanh approximation ----
template <typename Real>
void gelu_forward(Real* out, const Real* inp, size_t n) {
    const Acc k = std::sqrt(2.0 / std::numbers::pi);
    for (size_t i = 0; i < n; ++i) {
        const Acc x = Acc(inp[i]);
        out[i]      = Real(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))));
    }
}

// dinp: (n) =. dinp may alias dout.
template <typename Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, size_t n) {
    const Acc k = std::sqrt(2.0 / std::numbers::pi);
    for (size_t i = 0; i < n; ++i) {
        const Acc x     = Acc(inp[i]);
        const Acc u     = k * (x + 0.044715 * x * x * x);
        const Acc th    = std::tanh(u);
        const Acc du_dx = k * (1.0 + 3.0 * 0.044715 * x * x);
        const Acc grad  = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du_dx;
        dinp[i]         = Real(grad * Acc(dout[i]));
    }
}

// ---- residual: out = a + b ----
template <typename Real>
void add_forward(Real* out, const Real* a, const Real* b, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = Real(Acc(a[i]) + Acc(b[i]));
}

// ---- causal multi-head self-attention ----
// qkv: (B, T, 3C) with rows [q | k | v]. out: (B, T, C). lse: (B, NH, T).
template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* qkv, int B, int T, int C, int NH) {
    const int hs    = C / NH;
    const Acc scale = 1.0 / std::sqrt(Acc(hs));
    const size_t C3 = size_t(3) * C;
    std::vector<Acc> s(size_t(T) + 1);
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            for (int t = 0; t < T; ++t) {
                const Real* q = qkv + (size_t(b) * T + t) * C3 + size_t(h) * hs;
                Acc m         = -INFINITY;
                for (int j = 0; j <= t; ++j) {
                    const Real* k = qkv + (size_t(b) * T + j) * C3 + C + size_t(h) * hs;
                    Acc d         = 0;
                    for (int e = 0; e < hs; ++e) d += Acc(q[e]) * Acc(k[e]);
                    s[j] = d * scale;
                    if (s[j] > m) m = s[j];
                }
                Acc sum = 0;
                for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - m);
                const Acc l                       = m + std::log(sum);
                lse[(size_t(b) * NH + h) * T + t] = Real(l);
                for (int e = 0; e < hs; ++e) {
                    Acc o = 0;
                    for (int j = 0; j <= t; ++j) {
                        const Real* v =
                            qkv + (size_t(b) * T + j) * C3 + 2 * size_t(C) + size_t(h) * hs;
                        o += std::exp(s[j] - l) * Acc(v[e]);
                    }
                    out[(size_t(b) * T + t) * C + size_t(h) * hs + e] = Real(o);
                }
            }
        }
    }
}

// dqkv: (B, T, 3C) =. Probabilities are recomputed from qkv and lse:
//   p_j = exp(s_j - lse_t), D_t = dout_t . out_t, ds_j = p_j (dout_t . v_j - D_t),
//   dq_t = scale sum_j ds_j k_j,  dk_j += scale ds_j q_t,  dv_j += p_j dout_t.
template <typename Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* out,
                        const Real* lse, int B, int T, int C, int NH) {
    const int hs    = C / NH;
    const Acc scale = 1.0 / std::sqrt(Acc(hs));
    const size_t C3 = size_t(3) * C;
    std::vector<Acc> g(size_t(B) * T * C3, 0.0);
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            for (int t = 0; t < T; ++t) {
                const size_t qo = (size_t(b) * T + t) * C3 + size_t(h) * hs;
                const size_t oo = (size_t(b) * T + t) * C + size_t(h) * hs;
                const Acc l     = Acc(lse[(size_t(b) * NH + h) * T + t]);
                Acc D           = 0;
                for (int e = 0; e < hs; ++e) D += Acc(dout[oo + e]) * Acc(out[oo + e]);
                for (int j = 0; j <= t; ++j) {
                    const size_t ko = (size_t(b) * T + j) * C3 + C + size_t(h) * hs;
                    const size_t vo = ko + C;
                    Acc d = 0, dp = 0;
                    for (int e = 0; e < hs; ++e) {
                        d += Acc(qkv[qo + e]) * Acc(qkv[ko + e]);
                        dp += Acc(dout[oo + e]) * Acc(qkv[vo + e]);
                    }
                    const Acc p  = std::exp(d * scale - l);
                    const Acc ds = p * (dp - D);
                    for (int e = 0; e < hs; ++e) {
                        g[qo + e] += scale * ds * Acc(qkv[ko + e]);
                        g[ko + e] += scale * ds * Acc(qkv[qo + e]);
                        g[vo + e] += p * Acc(dout[oo + e]);
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < g.size(); ++i) dqkv[i] = Real(g[i]);
}

// ---- softmax cross-entropy ----
// losses: (N). logits: (N, V). targets: (N).
template <typename Real>
void crossentropy_forward(Real* losses, const Real* logits, const int32_t* targets, int N, int V) {
    for (int i = 0; i < N; ++i) {
        const Real* x = logits + size_t(i) * V;
        Acc m         = -INFINITY;
        for (int j = 0; j < V; ++j) m = std::fmax(m, Acc(x[j]));
        Acc sum = 0;
        for (int j = 0; j < V; ++j) sum += std::exp(Acc(x[j]) - m);
        losses[i] = Real(m + std::log(sum) - Acc(x[targets[i]]));
    }
}

// dlogits: (N, V) =. dlogits may alias logits.
template <typename Real>
void crossentropy_backward(Real* dlogits, const Real* logits, const int32_t* targets,
                           const Real* dlosses, int N, int V) {
    for (int i = 0; i < N; ++i) {
        const Real* x = logits + size_t(i) * V;
        Acc m         = -INFINITY;
        for (int j = 0; j < V; ++j) m = std::fmax(m, Acc(x[j]));
        Acc sum = 0;
        for (int j = 0; j < V; ++j) sum += std::exp(Acc(x[j]) - m);
        const Acc l = m + std::log(sum);
        for (int j = 0; j < V; ++j) {
            const Acc p                = std::exp(Acc(x[j]) - l) - (j == targets[i] ? 1.0 : 0.0);
            dlogits[size_t(i) * V + j] = Real(p * Acc(dlosses[i]));
        }
    }
}

// ---- AdamW, step 1-based ----
template <typename Real>
void adamw_update(Real* param, const Real* grad, Real* m, Real* v, size_t n, Real lr, Real beta1,
                  Real beta2, Real eps, Real weight_decay, int step) {
    const Acc b1 = Acc(beta1), b2 = Acc(beta2);
    const Acc c1 = 1.0 - std::pow(b1, step);
    const Acc c2 = 1.0 - std::pow(b2, step);
    for (size_t i = 0; i < n; ++i) {
        const Acc g   = Acc(grad[i]);
        const Acc mi  = b1 * Acc(m[i]) + (1.0 - b1) * g;
        const Acc vi  = b2 * Acc(v[i]) + (1.0 - b2) * g * g;
        const Acc p   = Acc(param[i]);
        m[i]          = Real(mi);
        v[i]          = Real(vi);
        const Acc upd = (mi / c1) / (std::sqrt(vi / c2) + Acc(eps)) + Acc(weight_decay) * p;
        param[i]      = Real(p - Acc(lr) * upd);
    }
}

template <typename Real>
double sum_squares(const Real* x, size_t n) {
    Acc s = 0;
    for (size_t i = 0; i < n; ++i) s += Acc(x[i]) * Acc(x[i]);
    return s;
}

template <typename Real>
void scale_inplace(Real* x, Real s, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = Real(Acc(x[i]) * Acc(s));
}

}  // namespace bagualu::kernels::ref

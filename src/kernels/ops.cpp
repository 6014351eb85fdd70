// Fast float32 kernels declared in kernels/ops.h, and the portable versions (namespace generic,
// kernels/ops_generic.h) of the families kernels/dispatch.h chooses an implementation for:
// layernorm, GELU, attention, cross-entropy and AdamW, whose ops.h entry points call the active
// table. Work is threaded with parallel_for over rows, (batch, head) pairs or column blocks;
// inner loops are contiguous so the compiler vectorises them (portable x86-64, no intrinsics).
// Every reduction has a fixed order, independent of the thread count. Matrix products go
// through gemm_f32. The only allocation is grow-only per-thread scratch. The scalar oracle is
// kernels/ref/ops_ref.h.
#include "kernels/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/crossentropy_rows.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/ops_generic.h"
#include "kernels/parallel_rows.h"

namespace bagualu::kernels {

namespace {

// Sum of term(i), i in [0, n), in double with 4 independent lanes (vectorisable without
// reassociation), lanes combined pairwise.
template <typename F>
inline double sum_f64(int64_t n, F term) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i     = 0;
    for (; i + 4 <= n; i += 4) {
        for (int l = 0; l < 4; ++l) acc[l] += term(i + l);
    }
    for (; i < n; ++i) acc[i - (n & ~int64_t{3})] += term(i);
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// Float dot product with 8 independent lanes combined pairwise: each lane sums n/8 terms, so
// the rounding error stays small for head-size vectors.
inline float dot_f32(const float* __restrict a, const float* __restrict b, int n) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int i        = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
    }
    for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// y += a * x
inline void axpy(float* __restrict y, float a, const float* __restrict x, int n) {
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// exp(x) in float, written so loops over it vectorise: x = n ln2 + r with |r| <= ln2 / 2
// (Cody-Waite, two-part ln2), e^r by the Cephes expf polynomial, then scaled by 2^n built in
// the exponent bits; < 1 ulp. Returns 0 below x = -87.3 (and for -inf), NaN for NaN, and
// saturates at e^88 above x = 88 (the kernels call it with x <= ~0). Range tests and selects
// are integer masks on the bit pattern: a float compare-and-select would stay a branch under
// the default -ftrapping-math and block vectorisation.
inline float exp_f32(float x) {
    constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
    constexpr int32_t kLo  = std::bit_cast<int32_t>(-87.3f);
    constexpr int32_t kHi  = std::bit_cast<int32_t>(88.f);
    const int32_t xb       = std::bit_cast<int32_t>(x);
    const int32_t below    = -int32_t(uint32_t(xb) > uint32_t(kLo));  // x < -87.3, -inf, -NaN
    const int32_t above    = -int32_t(xb > kHi);                      // x > 88, +inf, +NaN
    const int32_t nan      = -int32_t((xb & 0x7fffffff) > 0x7f800000);
    const float xc = std::bit_cast<float>((xb & ~(below | above)) | (kLo & below) | (kHi & above));
    const float t  = xc * 1.44269504088896341f + kMagic;
    const float n  = t - kMagic;
    const float r  = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    float p        = 1.9875691500e-4f;
    p              = p * r + 1.3981999507e-3f;
    p              = p * r + 8.3334519073e-3f;
    p              = p * r + 4.1665795894e-2f;
    p              = p * r + 1.6666665459e-1f;
    p              = p * r + 5.0000001201e-1f;
    p              = p * (r * r) + r + 1.f;
    const int32_t ni  = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kMagic);
    const float two_n = std::bit_cast<float>(int32_t(uint32_t(ni + 127) << 23));
    const int32_t yb  = std::bit_cast<int32_t>(p * two_n);
    return std::bit_cast<float>((xb & nan) | (yb & ~(nan | below)));
}

inline float row_max(const float* x, int n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

// log(sum_j exp(x_j)) of one row, the sum of exponentials in double.
inline double row_logsumexp(const float* x, int n) {
    const float m    = row_max(x, n);
    const double sum = sum_f64(n, [&](int64_t j) { return double(exp_f32(x[j] - m)); });
    return double(m) + std::log(sum);
}

// AdamW over n elements on the compute pool, each thread's rows through range (the generic
// kernel's, or the active table's).
void adamw_threaded(decltype(KernelTable::adamw_range) range, float* param, const float* grad,
                    float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int step, float grad_scale) {
    const AdamWCorrections c = adamw_corrections(beta1, beta2, step);
    parallel_rows(int64_t(n), 4, [&](int64_t begin, int64_t end) {
        range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, c.c1, c.c2,
              grad_scale);
    });
}

}  // namespace

// ---- linear ----

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
    gemm_f32(Trans::N, Trans::T, N, OC, IC, 1.f, inp, IC, weight, IC, 0.f, out, OC);
    if (!bias) return;
    const auto add = dispatch().bias_add;
    parallel_rows(N, OC, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) add(out + i * OC, bias, size_t(OC));
    });
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
    if (dinp) gemm_f32(Trans::N, Trans::N, N, IC, OC, 1.f, dout, OC, weight, IC, 0.f, dinp, IC);
    if (dweight && N > 0) {
        gemm_f32(Trans::T, Trans::N, OC, IC, N, 1.f, dout, OC, inp, IC, 1.f, dweight, IC);
    }
    if (!dbias) return;
    parallel_cols(OC, N, [&](int64_t c0, int64_t c1) {
        add_col_sums(dbias + c0, dout + c0, N, OC, static_cast<int>(c1 - c0));
    });
}

// ---- embedding ----

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
    parallel_rows(int64_t{B} * T, C, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float* __restrict e = wte + int64_t{tokens[i]} * C;
            const float* __restrict p = wpe + (i % T) * C;
            float* __restrict o       = out + i * C;
            for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
        }
    });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
    const int64_t N = int64_t{B} * T;
    parallel_cols(C, N, [&](int64_t c0, int64_t c1) {
        for (int64_t i = 0; i < N; ++i) {
            float* __restrict e       = dwte + int64_t{tokens[i]} * C;
            float* __restrict p       = dwpe + (i % T) * C;
            const float* __restrict d = dout + i * C;
            for (int64_t c = c0; c < c1; ++c) {
                e[c] += d[c];
                p[c] += d[c];
            }
        }
    });
}

// ---- layernorm ----

namespace generic {

void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t begin, int64_t end,
                            int C) {
    for (int64_t i = begin; i < end; ++i) {
        const float* __restrict x = inp + i * C;
        float* __restrict o       = out + i * C;
        const double m            = sum_f64(C, [&](int64_t c) { return double(x[c]); }) / C;
        auto sq_dev               = [&](int64_t c) {
            const double d = double(x[c]) - m;
            return d * d;
        };
        const double var = sum_f64(C, sq_dev) / C;
        const double s   = 1.0 / std::sqrt(var + 1e-5);
        const float mf   = float(m);
        const float sf   = float(s);
        for (int c = 0; c < C; ++c) o[c] = (x[c] - mf) * sf * weight[c] + bias[c];
        mean[i] = mf;
        rstd[i] = sf;
    }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
    // Rows: dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd,
    // with norm = (x - mean) * rstd and dnorm = weight * dout.
    parallel_rows(N, C, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float* __restrict x  = inp + i * C;
            const float* __restrict dy = dout + i * C;
            float* __restrict dx       = dinp + i * C;
            const float m              = mean[i];
            const float s              = rstd[i];
            auto dnorm              = [&](int64_t c) { return double(weight[c]) * double(dy[c]); };
            auto dnorm_norm         = [&](int64_t c) { return dnorm(c) * double((x[c] - m) * s); };
            const double dnorm_mean = sum_f64(C, dnorm) / C;
            const double dnorm_norm_mean = sum_f64(C, dnorm_norm) / C;
            const float a                = float(dnorm_mean);
            const float b                = float(dnorm_norm_mean);
            for (int c = 0; c < C; ++c) {
                const float norm = (x[c] - m) * s;
                dx[c] += (weight[c] * dy[c] - a - norm * b) * s;
            }
        }
    });
    // Columns: dweight += sum_i norm * dout, dbias += sum_i dout, rows in order.
    parallel_cols(C, N, [&](int64_t c0, int64_t c1) {
        thread_local std::vector<double> buf;
        const int64_t w = c1 - c0;
        double* aw      = grow(buf, size_t(2 * w));
        double* ab      = aw + w;
        std::fill(aw, aw + 2 * w, 0.0);
        for (int64_t i = 0; i < N; ++i) {
            const float* __restrict x  = inp + i * C + c0;
            const float* __restrict dy = dout + i * C + c0;
            const float m              = mean[i];
            const float s              = rstd[i];
            for (int64_t c = 0; c < w; ++c) {
                aw[c] += double((x[c] - m) * s) * double(dy[c]);
                ab[c] += double(dy[c]);
            }
        }
        for (int64_t c = 0; c < w; ++c) {
            dweight[c0 + c] = float(double(dweight[c0 + c]) + aw[c]);
            dbias[c0 + c]   = float(double(dbias[c0 + c]) + ab[c]);
        }
    });
}

}  // namespace generic

// ---- GELU ----
// 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu(x) = x sg with sg = 1 / (1 + e), e = exp(-2u), and
// gelu'(x) = sg + 2 x sg (1 - sg) du/dx, with sg (1 - sg) = sg^2 e. No cancellation anywhere,
// and exp_f32 vectorises where tanhf does not.

namespace generic {

void gelu_forward_range(float* out, const float* inp, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
        const float x = inp[i];
        const float e = exp_f32(-2.f * kGeluK * (x + kGeluA * x * x * x));
        out[i]        = x / (1.f + e);
    }
}

void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t begin,
                         int64_t end) {
    // No __restrict: dinp may alias dout.
    for (int64_t i = begin; i < end; ++i) {
        const float x     = inp[i];
        const float e     = exp_f32(-2.f * kGeluK * (x + kGeluA * x * x * x));
        const float sg    = 1.f / (1.f + e);
        const float du_dx = kGeluK * (1.f + 3.f * kGeluA * x * x);
        dinp[i]           = (sg + 2.f * x * (sg * sg * e) * du_dx) * dout[i];
    }
}

}  // namespace generic

// ---- residual ----

void add_forward(float* out, const float* a, const float* b, size_t n) {
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
    });
}

// ---- attention ----
// The portable kernels; the AVX2 ones (kernels/ops_avx2.h) fall back to them for head sizes that
// are not a multiple of 8. Queries are processed in blocks of kQBlock rows against keys
// 0 .. (last row of the block), so each key/value row is loaded once per block rather than once
// per query. Scratch per thread is (T, kQBlock) scores, key-major:
// s[k * kQBlock + r] for query t0 + r; masked entries (key after query) hold -inf in the
// forward and probability 0 in the backward.

namespace {
constexpr int64_t kQBlock = 16;
}  // namespace

namespace generic {

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const float scale = 1.f / std::sqrt(float(hs));
    const int64_t nqb = (T + kQBlock - 1) / kQBlock;
    // One item per (b, h, query block). Within a head the blocks are taken in the order
    // 0, last, 1, last-1, ... so contiguous chunks of items get similar causal work.
    parallel_rows(int64_t{B} * NH * nqb, kQBlock * T * hs, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> sbuf;
        thread_local std::vector<double> dbuf;
        float* s    = grow(sbuf, size_t(T * kQBlock));
        double* sum = grow(dbuf, size_t(kQBlock));
        float m[kQBlock];
        for (int64_t idx = begin; idx < end; ++idx) {
            const int64_t bh = idx / nqb;
            const int64_t j  = idx % nqb;
            const int64_t qb = (j % 2 == 0) ? j / 2 : nqb - 1 - j / 2;
            const int64_t b = bh / NH, h = bh % NH;
            const int64_t t0 = qb * kQBlock, t1 = std::min<int64_t>(t0 + kQBlock, T);
            const int64_t nr = t1 - t0;

            const float* qbase = qkv + b * T * C3 + h * hs;
            const float* kbase = qbase + C;
            const float* vbase = qbase + 2 * C;
            float* obase       = out + b * T * C + h * hs;
            // Scores, key-major.
            for (int64_t k = 0; k < t1; ++k) {
                float* sk = s + k * kQBlock;
                for (int64_t r = 0; r < nr; ++r) {
                    sk[r] = t0 + r >= k ? dot_f32(qbase + (t0 + r) * C3, kbase + k * C3, hs) * scale
                                        : -std::numeric_limits<float>::infinity();
                }
            }
            // Row max, exponentials and their sums (in double, keys in order).
            std::fill(m, m + nr, -std::numeric_limits<float>::infinity());
            for (int64_t k = 0; k < t1; ++k) {
                const float* sk = s + k * kQBlock;
                for (int64_t r = 0; r < nr; ++r) m[r] = sk[r] > m[r] ? sk[r] : m[r];
            }
            std::fill(sum, sum + nr, 0.0);
            for (int64_t k = 0; k < t1; ++k) {
                float* sk = s + k * kQBlock;
                for (int64_t r = 0; r < nr; ++r) {
                    sk[r] = exp_f32(sk[r] - m[r]);
                    sum[r] += double(sk[r]);
                }
            }
            // out_t = sum_k p_tk v_k / sum_t.
            for (int64_t r = 0; r < nr; ++r)
                std::fill(obase + (t0 + r) * C, obase + (t0 + r) * C + hs, 0.f);
            for (int64_t k = 0; k < t1; ++k) {
                const float* sk = s + k * kQBlock;
                const float* v  = vbase + k * C3;
                for (int64_t r = std::max<int64_t>(k - t0, 0); r < nr; ++r) {
                    axpy(obase + (t0 + r) * C, sk[r], v, hs);
                }
            }
            for (int64_t r = 0; r < nr; ++r) {
                float* o        = obase + (t0 + r) * C;
                const float inv = float(1.0 / sum[r]);
                for (int e = 0; e < hs; ++e) o[e] *= inv;
                lse[bh * T + t0 + r] = float(double(m[r]) + std::log(sum[r]));
            }
        }
    });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
    BGL_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    const int hs      = C / NH;
    const int64_t C3  = int64_t{3} * C;
    const float scale = 1.f / std::sqrt(float(hs));
    // One item per (b, h): all writes to that head's dk, dv stay on one thread, and the query
    // blocks are visited in order, so every gradient is summed in a fixed order.
    parallel_rows(int64_t{B} * NH, int64_t{T} * T * hs, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> sbuf;
        float* p  = grow(sbuf, size_t(2 * T * kQBlock));  // probabilities, key-major
        float* ds = p + T * kQBlock;                      // scale * dL/dscore, key-major
        float l[kQBlock], D[kQBlock];
        for (int64_t bh = begin; bh < end; ++bh) {
            const int64_t b = bh / NH, h = bh % NH;
            const float* qbase  = qkv + b * T * C3 + h * hs;
            const float* kbase  = qbase + C;
            const float* vbase  = qbase + 2 * C;
            float* dqbase       = dqkv + b * T * C3 + h * hs;
            float* dkbase       = dqbase + C;
            float* dvbase       = dqbase + 2 * C;
            const float* dybase = dout + b * T * C + h * hs;
            const float* ybase  = out + b * T * C + h * hs;
            for (int64_t t = 0; t < T; ++t) {
                std::fill(dqbase + t * C3, dqbase + t * C3 + hs, 0.f);
                std::fill(dkbase + t * C3, dkbase + t * C3 + hs, 0.f);
                std::fill(dvbase + t * C3, dvbase + t * C3 + hs, 0.f);
            }
            for (int64_t t0 = 0; t0 < T; t0 += kQBlock) {
                const int64_t t1 = std::min<int64_t>(t0 + kQBlock, T);
                const int64_t nr = t1 - t0;
                for (int64_t r = 0; r < nr; ++r) {
                    l[r] = lse[bh * T + t0 + r];
                    D[r] = dot_f32(dybase + (t0 + r) * C, ybase + (t0 + r) * C, hs);
                }
                // p = exp(s - lse), ds = p (dout . v - D) * scale.
                for (int64_t k = 0; k < t1; ++k) {
                    float* pk  = p + k * kQBlock;
                    float* dsk = ds + k * kQBlock;
                    for (int64_t r = 0; r < nr; ++r) {
                        const bool live = t0 + r >= k;
                        pk[r] =
                            live ? dot_f32(qbase + (t0 + r) * C3, kbase + k * C3, hs) * scale - l[r]
                                 : -std::numeric_limits<float>::infinity();
                        dsk[r] = live ? dot_f32(dybase + (t0 + r) * C, vbase + k * C3, hs) : 0.f;
                    }
                    for (int64_t r = 0; r < nr; ++r) {
                        pk[r]  = exp_f32(pk[r]);
                        dsk[r] = pk[r] * (dsk[r] - D[r]) * scale;
                    }
                }
                // dq_t += ds_tk k_k; dk_k += ds_tk q_t; dv_k += p_tk dout_t.
                for (int64_t k = 0; k < t1; ++k) {
                    const float* pk  = p + k * kQBlock;
                    const float* dsk = ds + k * kQBlock;
                    for (int64_t r = std::max<int64_t>(k - t0, 0); r < nr; ++r) {
                        const int64_t t = t0 + r;
                        axpy(dqbase + t * C3, dsk[r], kbase + k * C3, hs);
                        axpy(dkbase + k * C3, dsk[r], qbase + t * C3, hs);
                        axpy(dvbase + k * C3, pk[r], dybase + t * C, hs);
                    }
                }
            }
        }
    });
}

// ---- cross-entropy ----

void crossentropy_forward_rows(float* losses, const float* logits, const int32_t* targets,
                               int64_t begin, int64_t end, int V, float* lse) {
    crossentropy_forward_rows_of<row_logsumexp>(losses, logits, targets, begin, end, V, lse);
}

void crossentropy_backward_rows(float* dlogits, const float* logits, const int32_t* targets,
                                const float* dlosses, int64_t begin, int64_t end, int V,
                                const float* lse) {
    // No __restrict: dlogits may alias logits. Each element is read before it is written.
    crossentropy_backward_rows_of<row_logsumexp>(dlogits, logits, targets, dlosses, begin, end, V,
                                                 lse, exp_f32,
                                                 [&](float* d, const float* x, float l, float dl) {
                                                     for (int j = 0; j < V; ++j)
                                                         d[j] = exp_f32(x[j] - l) * dl;
                                                 });
}

// ---- AdamW ----

void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale) {
    float* __restrict pp       = param;
    const float* __restrict gp = grad;
    float* __restrict mp       = m;
    float* __restrict vp       = v;
    for (int64_t i = begin; i < end; ++i) {
        const float g  = gp[i] * grad_scale;
        const float mi = beta1 * mp[i] + (1.f - beta1) * g;
        const float vi = beta2 * vp[i] + (1.f - beta2) * g * g;
        mp[i]          = mi;
        vp[i]          = vi;
        pp[i] -= lr * ((mi / c1) / (std::sqrt(vi / c2) + eps) + weight_decay * pp[i]);
    }
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
    adamw_threaded(adamw_update_range, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                   step, grad_scale);
}

void bf16_narrow_range(uint16_t* dst, const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_from_float(x[i]);
}
void bf16_narrow_scaled(uint16_t* dst, const float* x, float w, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_from_float(w * x[i]);
}
void bf16_round_range(float* out, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(bf16_from_float(in[i]));
}
void bf16_widen_range(float* out, const uint16_t* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void bf16_bias_round(float* o, const float* bias, uint16_t* half, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const bf16 h = bf16_from_float(bias ? o[i] + bias[i] : o[i]);
        o[i]         = bf16_to_float(h);
        if (half) half[i] = h;
    }
}

void bias_add(float* o, const float* bias, size_t n) {
    for (size_t i = 0; i < n; ++i) o[i] += bias[i];
}

void zero_range(float* x, size_t n) { std::fill(x, x + n, 0.0f); }

void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w) {
    for (int64_t r = 0; r < n; ++r) {
        const float* __restrict row = x + r * ld;
        for (int c = 0; c < w; ++c) s[c] += double(row[c]);
    }
}

void col_sums_f64_bf16(double* s, const uint16_t* x, int64_t n, int64_t ld, int w) {
    for (int64_t r = 0; r < n; ++r) {
        const uint16_t* __restrict row = x + r * ld;
        for (int c = 0; c < w; ++c) s[c] += double(bf16_to_float(row[c]));
    }
}

namespace {
inline double widen(float v) { return double(v); }
inline double widen(uint16_t v) { return double(bf16_to_float(v)); }

template <typename T>
void scaled_rows_and_dots_rows(float* const* dy, float* dots, const float* w, const float* d,
                               const T* const* y, int n, int C) {
    for (int j = 0; j < n; ++j) {
        double s[4]           = {0, 0, 0, 0};
        float* __restrict o   = dy ? dy[j] : nullptr;
        const T* __restrict v = y[j];
        int c                 = 0;
        for (; c + 4 <= C; c += 4) {
            for (int i = 0; i < 4; ++i) s[i] += double(d[c + i]) * widen(v[c + i]);
        }
        for (; c < C; ++c) s[c & 3] += double(d[c]) * widen(v[c]);
        for (c = 0; o && c < C; ++c) o[c] = w[j] * d[c];
        dots[j] = float((s[0] + s[1]) + (s[2] + s[3]));
    }
}
}  // namespace

void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C) {
    scaled_rows_and_dots_rows(dy, dots, w, d, y, n, C);
}
void scaled_rows_and_dots_bf16(float* const* dy, float* dots, const float* w, const float* d,
                               const uint16_t* const* y, int n, int C) {
    scaled_rows_and_dots_rows(dy, dots, w, d, y, n, C);
}

void rank_rows(int32_t* top, const float* x, int64_t n, int E, int R) {
    for (int64_t r = 0; r < n; ++r) {
        // insertion into the output row, in descending order; ties keep the lower index first
        // (inserted earlier, passed only by a strictly larger score)
        const float* l = x + r * E;
        int32_t* t     = top + r * R;
        int k          = 0;
        for (int32_t e = 0; e < E; ++e) {
            int j = k;
            while (j > 0 && l[e] > l[t[j - 1]]) --j;
            if (j >= R) continue;
            for (int i = (k < R ? k : R - 1); i > j; --i) t[i] = t[i - 1];
            t[j] = e;
            if (k < R) ++k;
        }
    }
}

void exp_f64(double* y, const double* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void weighted_row_sum(float* o, const float* w, const float* const* y, int n, int C) {
    for (int c = 0; c < C; ++c) o[c] = 0.0f;
    for (int j = 0; j < n; ++j) {
        const float* __restrict v = y[j];
        for (int c = 0; c < C; ++c) o[c] += w[j] * v[c];
    }
}

void add_row_sum(float* o, const float* const* y, int n, int C) {
    for (int c0 = 0; c0 < C; c0 += 64) {  // a block of the sum in a small buffer, then onto o
        const int cn = C - c0 < 64 ? C - c0 : 64;
        float s[64];
        for (int c = 0; c < cn; ++c) s[c] = 0.0f;
        for (int j = 0; j < n; ++j) {
            for (int c = 0; c < cn; ++c) s[c] += y[j][c0 + c];
        }
        for (int c = 0; c < cn; ++c) o[c0 + c] += s[c];
    }
}

}  // namespace generic

// ---- dispatched families: the active table of kernels/dispatch.h ----

void rank_rows(int32_t* top, const float* x, int64_t n, int E, int R) {
    dispatch().rank_rows(top, x, n, E, R);
}

void exp_f64(double* y, const double* x, int64_t n) { dispatch().exp_f64(y, x, n); }

void weighted_row_sum(float* o, const float* w, const float* const* y, int n, int C) {
    dispatch().weighted_row_sum(o, w, y, n, C);
}

void add_row_sum(float* o, const float* const* y, int n, int C) {
    dispatch().add_row_sum(o, y, n, C);
}

void zero_stream(float* x, size_t n) { dispatch().zero_stream(x, n); }

void col_sums_f64_bf16(double* s, const uint16_t* x, int64_t n, int64_t ld, int w) {
    dispatch().col_sums_f64_bf16(s, x, n, ld, w);
}

void col_sums_f64(double* s, const float* x, int64_t n, int64_t ld, int w) {
    dispatch().col_sums_f64(s, x, n, ld, w);
}

namespace {

// Columns add_col_sums sums at once: each row's run of them is read along its lines (the ISA
// kernels take 16 rows at a time), their double sums on the stack.
constexpr int kSumCols = 512;

template <typename T>
void add_col_sums_of(float* dbias, const T* x, int64_t n, int64_t ld, int w) {
    for (int c0 = 0; c0 < w; c0 += kSumCols) {
        const int cw         = std::min(kSumCols, w - c0);
        double sum[kSumCols] = {};
        if constexpr (std::is_same_v<T, float>) {
            col_sums_f64(sum, x + c0, n, ld, cw);
        } else {
            col_sums_f64_bf16(sum, x + c0, n, ld, cw);
        }
        for (int c = 0; c < cw; ++c) dbias[c0 + c] = float(double(dbias[c0 + c]) + sum[c]);
    }
}

}  // namespace

void add_col_sums(float* dbias, const float* x, int64_t n, int64_t ld, int w) {
    add_col_sums_of(dbias, x, n, ld, w);
}
void add_col_sums(float* dbias, const uint16_t* x, int64_t n, int64_t ld, int w) {
    add_col_sums_of(dbias, x, n, ld, w);
}
void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const uint16_t* const* y, int n, int C) {
    dispatch().scaled_rows_and_dots_bf16(dy, dots, w, d, y, n, C);
}

void scaled_rows_and_dots(float* const* dy, float* dots, const float* w, const float* d,
                          const float* const* y, int n, int C) {
    dispatch().scaled_rows_and_dots(dy, dots, w, d, y, n, C);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
    const auto rows = dispatch().layernorm_forward_rows;
    parallel_rows(N, C, [&](int64_t begin, int64_t end) {
        rows(out, mean, rstd, inp, weight, bias, begin, end, C);
    });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
    dispatch().layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void gelu_forward(float* out, const float* inp, size_t n) {
    const auto f = dispatch().gelu_forward;
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) { f(out, inp, begin, end); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    const auto f = dispatch().gelu_backward;
    parallel_rows(int64_t(n), 1,
                  [&](int64_t begin, int64_t end) { f(dinp, inp, dout, begin, end); });
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    dispatch().attention_forward(out, lse, qkv, B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
    dispatch().attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          float* lse) {
    const auto f = dispatch().crossentropy_forward;
    parallel_rows(
        N, V, [&](int64_t begin, int64_t end) { f(losses, logits, targets, begin, end, V, lse); });
}

void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           const float* dlosses, int N, int V, const float* lse) {
    const auto f = dispatch().crossentropy_backward;
    parallel_rows(N, V, [&](int64_t begin, int64_t end) {
        f(dlogits, logits, targets, dlosses, begin, end, V, lse);
    });
}

AdamWCorrections adamw_corrections(float beta1, float beta2, int step) {
    return {float(1.0 - std::pow(double(beta1), step)), float(1.0 - std::pow(double(beta2), step))};
}

void adamw_update_range(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, const AdamWCorrections& c, float grad_scale) {
    dispatch().adamw_range(param, grad, m, v, begin, end, lr, beta1, beta2, eps, weight_decay, c.c1,
                           c.c2, grad_scale);
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
    adamw_threaded(dispatch().adamw_range, param, grad, m, v, n, lr, beta1, beta2, eps,
                   weight_decay, step, grad_scale);
}

// ---- norms and scaling ----

namespace {

// sum_squares cuts x into fixed blocks (a function of n only) and adds their sums in order, so
// that the result is independent of the thread count.
constexpr int64_t kSquareBlocks = 64;
int64_t square_blocks(int64_t n) { return n < kMinParallelWork ? 1 : kSquareBlocks; }

// A block of squares to sum: len values from x.
struct SquareBlock {
    const float* x;
    int64_t len;
};

// out[b] = the sum of squares of block b, b in [begin, end). Four blocks at once: their lanes'
// sums are independent chains of adds, so one block's chain no longer waits on the adds' latency
// (the same sums in the same order as sum_f64 gives each block: 16M floats from memory 1.50 ->
// 1.32 ms on two threads of a Zen 5).
void sum_square_blocks(const SquareBlock* blocks, int64_t begin, int64_t end, double* out) {
    int64_t blk = begin;
    for (; blk + 4 <= end; blk += 4) {
        const float* xb[4];
        int64_t len[4];
        for (int b = 0; b < 4; ++b) {
            xb[b]  = blocks[blk + b].x;
            len[b] = blocks[blk + b].len;
        }
        double acc[4][4]     = {};
        const int64_t common = std::min(std::min(len[0], len[1]), std::min(len[2], len[3])) / 4 * 4;
        for (int64_t i = 0; i < common; i += 4) {
            for (int b = 0; b < 4; ++b) {
                for (int l = 0; l < 4; ++l) acc[b][l] += double(xb[b][i + l]) * xb[b][i + l];
            }
        }
        for (int b = 0; b < 4; ++b) {
            int64_t i = common;
            for (; i + 4 <= len[b]; i += 4) {
                for (int l = 0; l < 4; ++l) acc[b][l] += double(xb[b][i + l]) * xb[b][i + l];
            }
            for (; i < len[b]; ++i)
                acc[b][i - (len[b] & ~int64_t{3})] += double(xb[b][i]) * xb[b][i];
            out[blk + b] = (acc[b][0] + acc[b][2]) + (acc[b][1] + acc[b][3]);
        }
    }
    for (; blk < end; ++blk) {
        const float* xb = blocks[blk].x;
        out[blk] = sum_f64(blocks[blk].len, [&](int64_t i) { return double(xb[i]) * xb[i]; });
    }
}

}  // namespace

double sum_squares(const float* x, size_t n) { return sum_squares_runs(&x, &n, 1); }

double sum_squares_runs(const float* const* x, const size_t* n, size_t count) {
    // every run's blocks, as sum_squares cuts them, in one list over the threads (grow-only
    // buffers of the calling thread)
    thread_local std::vector<SquareBlock> blocks;
    thread_local std::vector<double> partial;
    size_t nb = 0;
    for (size_t r = 0; r < count; ++r) nb += static_cast<size_t>(square_blocks(int64_t(n[r])));
    SquareBlock* b = grow(blocks, nb);
    double* out    = grow(partial, nb);
    int64_t values = 0;
    for (size_t r = 0, at = 0; r < count; ++r) {
        const int64_t nn = int64_t(n[r]), k = square_blocks(nn);
        for (int64_t blk = 0; blk < k; ++blk, ++at) {
            const int64_t lo = nn * blk / k;
            b[at]            = {x[r] + lo, nn * (blk + 1) / k - lo};
        }
        values += nn;
    }
    const int64_t nblk = int64_t(nb);
    parallel_rows(nblk, nblk > 0 ? values / nblk : 0,
                  [&](int64_t begin, int64_t end) { sum_square_blocks(b, begin, end, out); });
    // each run's blocks added in order, then the runs' sums in order
    double total = 0.0;
    for (size_t r = 0, at = 0; r < count; ++r) {
        double run = 0.0;
        for (int64_t blk = square_blocks(int64_t(n[r])); blk > 0; --blk) run += out[at++];
        total += run;
    }
    return total;
}

void scale_inplace(float* x, float s, size_t n) {
    parallel_rows(int64_t(n), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) x[i] *= s;
    });
}

}  // namespace bagualu::kernels

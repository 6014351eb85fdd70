// The cross-entropy's rows around a row's logsumexp and exponentials, shared by the generic,
// AVX2 and AVX-512 kernels: each instantiates them with its own row_logsumexp and exp, in a
// source built with its flags (kernels/ops.h for the conventions).
#pragma once
#include <cstdint>

namespace bagualu::kernels {

// Forward: losses[i] = logsumexp - logits[i, targets[i]] in double, rounded to float, and where
// lse is not null lse[i] = the logsumexp rounded to float (what the backward uses).
template <double (*RowLogsumexp)(const float*, int)>
inline void crossentropy_forward_rows_of(float* losses, const float* logits, const int32_t* targets,
                                         int64_t begin, int64_t end, int V, float* lse) {
    for (int64_t i = begin; i < end; ++i) {
        const float* x = logits + i * V;
        const double l = RowLogsumexp(x, V);
        losses[i]      = float(l - double(x[targets[i]]));
        if (lse) lse[i] = float(l);
    }
}

// Backward: row i's gradient (exp(x - l) - [j = target]) * dlosses[i] with l = lse[i], or the
// row's logsumexp rounded to float where lse is null. exp1(v): exp of one value; row(d, x, l, dl):
// d[j] = exp(x[j] - l) * dl over the row. The target's element is written last, from exp1 of
// the value read before the row was written (dlogits may alias logits).
template <double (*RowLogsumexp)(const float*, int), typename Exp1, typename Row>
inline void crossentropy_backward_rows_of(float* dlogits, const float* logits,
                                          const int32_t* targets, const float* dlosses,
                                          int64_t begin, int64_t end, int V, const float* lse,
                                          Exp1&& exp1, Row&& row) {
    for (int64_t i = begin; i < end; ++i) {
        const float* x    = logits + i * V;
        float* d          = dlogits + i * V;
        const float l     = lse ? lse[i] : float(RowLogsumexp(x, V));
        const float dl    = dlosses[i];
        const int tgt     = targets[i];
        const float p_tgt = exp1(x[tgt] - l);
        row(d, x, l, dl);
        d[tgt] = (p_tgt - 1.f) * dl;
    }
}

}  // namespace bagualu::kernels

// How one optimizer step's batch of B sequences splits over P ranks and A micro-steps.
//
// Rank r trains share(r) = B / P sequences a step, one more on the first B % P ranks, so any
// rank count up to B runs a config unchanged. Every rank runs the same number of micro-steps
// A = ceil(max share / cap) (cap: train.micro_batch_size, 0 = no cap), and splits its share
// into A near-equal micro-batches, the larger first: rows(r, k) = share(r) / A, plus one for
// k < share(r) % A. Micro-step k of the run takes the next total(k) windows of the sampler;
// rank r trains windows [offset(r, k), offset(r, k) + rows(r, k)) of them.
//
// Every token of the step weighs the same in the gradient: rank r's mean loss of micro-step k
// is scaled by weight(r, k) = rows(r, k) P / B before the P ranks' gradients are averaged, and
// a statistic over the whole micro-step (the router's auxiliary losses) by fraction(k) =
// total(k) / B. When every rank trains the same rows in every micro-step (even()), both are
// 1 / A and the trainer computes them as before, bit for bit.
#pragma once
#include <algorithm>
#include <cstdint>

namespace bagualu {

class BatchSplit {
   public:
    BatchSplit() = default;
    // batch >= ranks >= 1; cap >= 1 (no cap: batch).
    BatchSplit(int64_t batch, int64_t ranks, int64_t cap)
        : B_(batch), P_(ranks), low_(batch / ranks), extra_(batch % ranks) {
        const int64_t high = low_ + (extra_ > 0 ? 1 : 0);
        A_                 = std::max<int64_t>(1, (high + cap - 1) / cap);
    }

    int64_t batch() const { return B_; }
    int64_t ranks() const { return P_; }
    int64_t steps() const { return A_; }  // A: micro-steps per optimizer step
    int64_t share(int64_t r) const { return low_ + (r < extra_ ? 1 : 0); }
    int64_t min_share() const { return low_; }
    int64_t rows(int64_t r, int64_t k) const { return piece(share(r), k); }
    // The most rows any rank trains in one micro-step (what buffers are sized for).
    int64_t max_rows() const { return (share(0) + A_ - 1) / A_; }
    // The rows of ranks [0, r) in micro-step k.
    int64_t offset(int64_t r, int64_t k) const {
        const int64_t hi = std::min(r, extra_);
        return hi * piece(low_ + 1, k) + (r - hi) * piece(low_, k);
    }
    int64_t total(int64_t k) const { return offset(P_, k); }
    // Whether every rank trains the same rows in every micro-step.
    bool even() const { return extra_ == 0 && low_ % A_ == 0; }
    // Whether some rank has a micro-step with no rows (a config the trainer refuses).
    bool has_empty() const { return low_ < A_; }
    double weight(int64_t r, int64_t k) const {
        return static_cast<double>(rows(r, k)) * static_cast<double>(P_) / static_cast<double>(B_);
    }
    double fraction(int64_t k) const {
        return static_cast<double>(total(k)) / static_cast<double>(B_);
    }

   private:
    int64_t piece(int64_t s, int64_t k) const { return s / A_ + (k < s % A_ ? 1 : 0); }

    int64_t B_ = 1, P_ = 1, A_ = 1, low_ = 1, extra_ = 0;
};

}  // namespace bagualu

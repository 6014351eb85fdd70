#include "dist/paro/reduce_schedule.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace bagualu::dist::paro {

ReduceSchedule::ReduceSchedule(std::vector<size_t> ready, HelperThread* helper,
                               std::function<void(size_t unit, bool on_helper)> run)
    : ready_(std::move(ready)), order_(ready_.size()), helper_(helper), run_(std::move(run)) {
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return ready_[a] > ready_[b]; });
    for (size_t u = 0; u < ready_.size(); ++u) jobs_.push_back(Job{this, u});
}

void ReduceSchedule::begin() {
    armed_ = helper_ != nullptr;
    next_  = 0;
}

void ReduceSchedule::submit_next() {
    last_ = helper_->submit(jobs_[order_[next_]]);
    ++next_;
}

void ReduceSchedule::grads_ready(size_t from) {
    if (!armed_) return;
    while (next_ < order_.size() && ready_[order_[next_]] >= from) submit_next();
}

double ReduceSchedule::finish() {
    const auto t0 = std::chrono::steady_clock::now();
    if (armed_) {
        while (next_ < order_.size()) submit_next();
        armed_ = false;
        if (last_ > 0) helper_->wait(last_);
    } else {
        for (const size_t u : order_) run_(u, false);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ReduceSchedule::drain() noexcept {
    if (!armed_ || last_ == 0) return;
    armed_ = false;
    try {
        helper_->wait(last_);
    } catch (...) {  // the step failed already; its error was or will be reported
    }
}

}  // namespace bagualu::dist::paro

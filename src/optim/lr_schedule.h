// Learning rate at 0-based step `step` of `total_steps`: a linear warm-up from lr/warmup to lr
// over warmup_steps, then (config/enums.h, LrSchedule)
//   cosine:   from lr to min_lr, reached at the last step;
//   linear:   the same, along a straight line;
//   constant: lr;
//   wsd:      lr (warmup-stable-decay), then a straight line to min_lr over the last
//             decay_steps steps (at most those after the warm-up), reached at the last step.
// A decay with one step or none to decay over is lr throughout.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "config/enums.h"

namespace bagualu::optim {

inline double lr_at(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr,
                    double min_lr, LrSchedule schedule = LrSchedule::cosine,
                    int64_t decay_steps = 0) {
    if (step < warmup_steps)
        return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (schedule == LrSchedule::constant) return lr;
    // the steps the decay spans, the first of them at lr and the last at min_lr
    const int64_t start = schedule == LrSchedule::wsd
                              ? std::max(warmup_steps, total_steps - decay_steps)
                              : warmup_steps;
    const int64_t span  = total_steps - start;
    if (span <= 1 || step < start) return lr;
    const double progress =
        static_cast<double>(step - start) / static_cast<double>(span - 1);  // 0 .. 1
    if (schedule == LrSchedule::cosine)
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    return (1.0 - progress) * lr + progress * min_lr;  // exactly lr at 0 and min_lr at 1
}

}  // namespace bagualu::optim

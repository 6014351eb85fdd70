// Learning rate: linear warm-up from lr/warmup to lr over warmup_steps, then cosine decay
// from lr to min_lr at the last step. step is 0-based.
#pragma once
#include <cmath>
#include <cstdint>

namespace bagualu::optim {

inline double lr_at(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr,
                    double min_lr) {
    if (step < warmup_steps)
        return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    const int64_t decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 1) return lr;
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - 1);
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace bagualu::optim

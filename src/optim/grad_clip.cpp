#include "optim/grad_clip.h"

#include <cmath>
#include <span>

namespace bagualu::optim {

double global_norm(double common_sq, double own_sq, dist::Comm* group) {
    if (group) group->allreduce_sum(std::span<double>(&own_sq, 1));
    return std::sqrt(common_sq + own_sq);
}

float clip_factor(double norm, double max_norm) {
    return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / norm) : 1.0f;
}

}  // namespace bagualu::optim

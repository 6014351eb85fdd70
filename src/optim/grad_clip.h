// Global-norm gradient clipping (train.grad_clip): the L2 norm of the whole model's gradient,
// whose floats may be spread over ranks, and the factor that scales it down to the limit.
// The norm's one collective is a sum of one double; the callers say which floats each rank
// counts (dist/paro/: the dense squares once and the expert squares over the EP group, or every
// rank's own ParO shard over the world).
#pragma once
#include "dist/comm/comm.h"

namespace bagualu::optim {

// sqrt(common_sq + the sum over `group` of own_sq): common_sq is the sum of squares of floats
// every rank of the group holds alike (counted once), own_sq that of the floats only this rank
// counts. group: nullptr when this rank counts alone. Collective over group.
double global_norm(double common_sq, double own_sq, dist::Comm* group);

// The factor that brings a gradient of global norm `norm` down to max_norm: max_norm / norm
// (rounded to float) when norm > max_norm > 0, else 1 (max_norm <= 0 disables clipping).
float clip_factor(double norm, double max_norm);

}  // namespace bagualu::optim

// Gradient reduction and norm for the MoDa layout. The flat gradient array alternates runs of
// dense tensors and runs of expert tensors (one run per MoE layer); a Segment is one such run.
//   dense  grads: sum over all P ranks, then / P          (mean of the ranks' local-mean losses)
//   expert grads: sum over the expert-data-parallel group, then / P (each expert already summed
//                 the contributions of its EP group's tokens in backward)
// The replicated optimizer reduces segment by segment (ReplicatedAdamW in optimizer.cpp, maybe on
// the helper thread during backward). The global norm adds the dense squares once and the expert
// squares over the EP group, so replicas are not double counted.
#pragma once
#include <cstddef>
#include <vector>

#include "dist/parallel.h"
#include "model/param_layout.h"

namespace bagualu::dist::paro {

struct Segment {
    size_t begin = 0, end = 0;  // floats
    bool   expert = false;
};

std::vector<Segment> make_segments(const model::ParamLayout& layout);

double global_grad_norm(const float* grads, const std::vector<Segment>& segs,
                        dist::ParallelContext* par);

}  // namespace bagualu::dist::paro

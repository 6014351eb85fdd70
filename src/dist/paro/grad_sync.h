// Gradient reduction and norm for the MoDa layout. The flat gradient array alternates runs of
// dense tensors and runs of expert tensors (one run per MoE layer); a Segment is one such run.
//   dense  grads: sum over all P ranks, then / P          (mean of the ranks' local-mean losses)
//   expert grads: sum over the expert-data-parallel group, then / P (each expert already summed
//                 the contributions of its EP group's tokens in backward)
// The replicated optimizer reduces segment by segment (replicated_adamw.h, maybe on the helper
// thread during backward). The global norm adds the dense squares once and the expert squares
// over the EP group, so replicas are not double counted. Both optimizers reduce on
// communicators of their own (reduction_comm) and scale with scale_floats, on whichever thread
// runs the reduction.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "dist/parallel.h"
#include "model/param_layout.h"

namespace bagualu::dist::paro {

struct Segment {
    size_t begin = 0, end = 0;  // floats
    bool expert = false;
};

std::vector<Segment> make_segments(const model::ParamLayout& layout);

double global_grad_norm(const float* grads, const std::vector<Segment>& segs,
                        dist::ParallelContext* par);

// x *= s elementwise: the compute pool's kernel on the main thread, a plain loop on the helper
// (which must not use the pool). One multiply per float either way: the same bits.
void scale_floats(float* x, float s, size_t n, bool on_helper);

// A communicator of the same ranks as c, for the reductions alone; in background mode (its
// all-reduce is the nonblocking one on whichever thread runs the unit: the same bits).
std::unique_ptr<dist::Comm> reduction_comm(dist::Comm& c);

}  // namespace bagualu::dist::paro

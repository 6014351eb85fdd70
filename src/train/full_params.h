// The whole model's parameters in the single-process layout, assembled from the ranks of an
// expert-parallel group (each holds E/EP experts of every MoE layer). Collective over par->ep().
#pragma once
#include "core/buffer.h"
#include "dist/parallel.h"
#include "model/gpt.h"

namespace bagualu::train {

Buffer<float> gather_full_params(const model::GPT& gpt, dist::ParallelContext* par);
// The same from params, an array of this rank's layout (gpt.params() or a copy of it).
Buffer<float> gather_full_params(const model::GPT& gpt, const float* params,
                                 dist::ParallelContext* par);

}  // namespace bagualu::train

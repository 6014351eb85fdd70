// The trainer's per-step routing telemetry and the balancing bias's once-per-step hooks, for
// every MoE layer of a model: what metrics.jsonl reports about routing (docs/model.md, Gates),
// and where the step's choice loads enter and leave each layer's BalanceBias.
#pragma once
#include <nlohmann/json.hpp>

#include "model/gpt.h"

namespace bagualu::train {

// Per MoE layer, after capacity and SWIPE, over all ranks (last micro-step of the step); the
// choice load and the balancing bias over the whole step. E: experts per layer; bias_on: also
// the bias statistics.
void add_routing_metrics(nlohmann::json& j, const model::GPT& gpt, int E, bool bias_on);
// After each training micro-batch's forward: its top-k choices per expert into each layer's
// step load (once per micro-batch, so a recomputed or evaluation forward counts nothing).
void add_choice_loads(model::GPT& gpt);
// After the optimizer step: each layer's step load measured and, with rate > 0, its bias
// updated; a skipped fp16 step leaves the bias as it is.
void end_bias_step(model::GPT& gpt, double rate, bool proportional, bool skipped);

}  // namespace bagualu::train

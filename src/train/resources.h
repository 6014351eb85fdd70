// What a training run used, for comparison with `bagualu plan`: the communication counters of
// the training steps (evaluation excluded) summed over all ranks, and every rank's peak
// resident memory (VmHWM) at the end of the steps. Collective over par's world.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "dist/comm/counters.h"
#include "dist/parallel.h"

namespace bagualu::train {

nlohmann::json resource_report(const dist::CommTally& steps_comm, int64_t steps,
                               dist::ParallelContext& par);

}  // namespace bagualu::train

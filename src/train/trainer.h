// The training loop of one process: data, model, AdamW, schedule, clipping, gradient
// accumulation, periodic validation, metrics.jsonl, progress line, and the exported model and
// loss chart at the end. Deterministic for a given config (seed included).
#pragma once
#include <cstdint>
#include <string>

#include "config/config.h"

namespace bagualu::train {

struct TrainOptions {
    bool force = false;  // replace a previous run in the run directory
    bool quiet = false;  // no progress line or samples (tests)
};

struct TrainSummary {
    double      final_loss           = 0;  // train loss of the last step
    double      final_val_loss       = 0;
    double      val_unigram_entropy  = -1;  // < 0 when the data has no meta.json
    double      tokens_per_s         = 0;
    int64_t     steps                = 0;
    std::string run_dir;
    std::string model_dir;
};

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opt = {});

}  // namespace bagualu::train

// Validation loss: mean cross-entropy over the first max_batches batches of micro_batch
// windows of the val split, in file order. Used by training and by `bagualu eval`, so both
// compute exactly the same number for the same weights.
#pragma once
#include <cstdint>
#include <span>

#include "model/gpt.h"

namespace bagualu::train {

struct EvalResult {
    double  loss   = 0;  // nats per token
    int64_t tokens = 0;
};

EvalResult evaluate(model::GPT& gpt, std::span<const int32_t> val_tokens, int micro_batch,
                    int64_t max_batches);

}  // namespace bagualu::train

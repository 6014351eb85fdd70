// Validation loss: mean cross-entropy over the first W windows of the val split, in file order
// (windows as token_shards.h numbers them),
// W = min(windows in the file, max_batches * micro_batch * P) rounded down to a multiple of P;
// rank r evaluates windows [r W/P, (r+1) W/P) in batches of micro_batch, and the sums are
// added over ranks. Used by training and by `bagualu eval`, so both compute the same number.
#pragma once
#include <cstdint>
#include <span>

#include "data/token_shards.h"
#include "model/gpt.h"

namespace bagualu::train {

struct EvalResult {
    double loss    = 0;  // nats per token
    int64_t tokens = 0;
};

// par: nullptr for one process.
EvalResult evaluate(model::GPT& gpt, const data::TokenShards& val, int micro_batch,
                    int64_t max_batches, dist::ParallelContext* par = nullptr);

}  // namespace bagualu::train

#include "train/evaluate.h"

#include <algorithm>
#include <vector>

#include "data/sampler.h"

namespace bagualu::train {

EvalResult evaluate(model::GPT& gpt, std::span<const int32_t> val_tokens, int micro_batch,
                    int64_t max_batches) {
    const int     T         = gpt.config().seq_len;
    const int64_t n_windows = (static_cast<int64_t>(val_tokens.size()) - 1) / T;
    std::vector<int32_t> inputs(static_cast<size_t>(micro_batch) * T), targets(inputs.size());
    double        sum    = 0;
    int64_t       tokens = 0;
    for (int64_t b = 0; b < max_batches; ++b) {
        const int64_t first = b * micro_batch;
        if (first >= n_windows) break;
        const int B = static_cast<int>(std::min<int64_t>(micro_batch, n_windows - first));
        data::sequential_batch(val_tokens, T, first, B, inputs.data(), targets.data());
        const double loss = gpt.forward(inputs.data(), targets.data(), B, T);
        sum += loss * B * T;
        tokens += static_cast<int64_t>(B) * T;
    }
    return EvalResult{tokens > 0 ? sum / static_cast<double>(tokens) : 0.0, tokens};
}

}  // namespace bagualu::train

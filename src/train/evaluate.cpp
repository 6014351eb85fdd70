#include "train/evaluate.h"

#include <algorithm>
#include <vector>

namespace bagualu::train {

EvalResult evaluate(model::GPT& gpt, const data::TokenShards& val, int micro_batch,
                    int64_t max_batches, dist::ParallelContext* par) {
    const int T       = gpt.config().seq_len;
    const int P       = par ? par->size() : 1;
    const int rank    = par ? par->rank() : 0;
    const int64_t W   = std::min<int64_t>(val.num_windows(), max_batches * micro_batch * P) / P * P;
    const int64_t per = W / P;  // windows of this rank, the same on every rank
    const int64_t first0 = per * rank;
    std::vector<int32_t> inputs(static_cast<size_t>(micro_batch) * T), targets(inputs.size());
    std::vector<int32_t> window(static_cast<size_t>(T) + 1);
    double sum[2] = {0, 0};  // loss x tokens, tokens
    for (int64_t done = 0; done < per; done += micro_batch) {
        const int B = static_cast<int>(std::min<int64_t>(micro_batch, per - done));
        for (int b = 0; b < B; ++b) {
            val.read_window(first0 + done + b, window.data());
            std::copy(window.begin(), window.end() - 1, inputs.begin() + int64_t{b} * T);
            std::copy(window.begin() + 1, window.end(), targets.begin() + int64_t{b} * T);
        }
        const double loss = gpt.forward(inputs.data(), targets.data(), B, T);
        sum[0] += loss * B * T;
        sum[1] += static_cast<double>(B) * T;
    }
    if (P > 1) par->world().allreduce_sum(std::span<double>(sum, 2));
    const auto tokens = static_cast<int64_t>(sum[1]);
    return EvalResult{tokens > 0 ? sum[0] / sum[1] : 0.0, tokens};
}

}  // namespace bagualu::train

// Balancing without an auxiliary loss (DeepSeek-V3): a per-expert bias b (E, float32) that is
// added to the router's scores when the top-k experts are chosen (and to SWIPE's preference
// ranking), never to the combine weights. Once per optimizer step, from the step's top-k choices
// of every expert summed over all micro-batches and all ranks (load_e, before capacity or SWIPE),
//     b_e += rate * sign(mean_load - load_e),   mean_load = sum_e load_e / E,
// or, with the proportional rule (model.balance_bias_update), by the relative error,
//     b_e += rate * (mean_load - load_e) / mean_load = rate * (total - E load_e) / total,
// large while an expert is far from its share and small near it (no chattering);
// then b is recentred to zero mean (b_e -= mean_e b_e). An expert chosen more than the fair share
// is made less attractive, one chosen less more attractive. b is not a parameter: no gradient,
// no AdamW, no weight decay, and it stays float32 whatever [precision] says.
// The counts are integers, the sign rule uses only their sign and the proportional one one
// division of integers in double, so b is bitwise the same for any split of the step into
// micro-batches and ranks. Knows nothing of MPI: the router hands it
// counts already summed over ranks.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace bagualu::moe {

// Every MoE layer's bias in block order: [MoE layers][E]. Empty when the bias is off.
using BalanceBiases = std::vector<std::vector<float>>;

struct BiasStats {
    double min = 0, max = 0, mean_abs = 0;
};

class BalanceBias {
   public:
    explicit BalanceBias(int E = 0);

    int E() const { return static_cast<int>(b_.size()); }
    // (E) the current bias.
    const float* values() const { return b_.data(); }
    // Replaces the bias (a checkpoint or an exported model); values: (E).
    void set(std::span<const float> values);

    // One micro-batch's top-k choices per expert, summed over all ranks: [E], added to the step's.
    void add_load(const int64_t* load);
    // The end of an optimizer step: measures the step's load (max_violation), applies the update
    // rule above when rate > 0 (rate = 0: the bias is left as it is), and clears the load.
    void end_step(double rate, bool proportional = false);
    // Forgets the step's load without measuring or updating (an fp16 step that was skipped).
    void discard_step();

    // [E] the last ended step's choices per expert, all micro-batches and ranks (empty before).
    const std::vector<int64_t>& step_load() const { return step_load_; }
    // Of that load: max_e load_e / mean_load - 1 (0 before any step ended).
    double max_violation() const;
    BiasStats stats() const;

   private:
    std::vector<float> b_;            // (E)
    std::vector<int64_t> load_;       // [E] this step's choices so far
    std::vector<int64_t> step_load_;  // [E] the last ended step's
};

}  // namespace bagualu::moe

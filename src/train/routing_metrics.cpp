#include "train/routing_metrics.h"

#include <algorithm>

#include "moe/moe_layer.h"

namespace bagualu::train {

namespace {

// Per-expert load of one MoE layer: max over mean of the rows each expert received (all ranks).
double load_max_over_mean(const int64_t* tpe, int E) {
    double mx = 0, total = 0;
    for (int e = 0; e < E; ++e) {
        mx = std::max(mx, static_cast<double>(tpe[e]));
        total += static_cast<double>(tpe[e]);
    }
    return total > 0 ? mx / (total / E) : 0.0;
}

}  // namespace

// Per MoE layer, after capacity and SWIPE, over all ranks (last micro-step of the step); the
// choice load and the balancing bias over the whole step.
void add_routing_metrics(nlohmann::json& j, const model::GPT& gpt, int E, bool bias_on) {
    nlohmann::json loads = nlohmann::json::array(), dropped = loads, reassigned = loads,
                   entropy = loads, tokens = loads, zloss = loads, balance = loads;
    bool z_on = false;
    for (const auto& layer : gpt.moe_layers()) {
        const moe::RoutingStats& s = layer->routing_stats();
        const double slots         = static_cast<double>(std::max<int64_t>(s.slots, 1));
        loads.push_back(load_max_over_mean(s.tokens_per_expert.data(), E));
        dropped.push_back(static_cast<double>(s.dropped) / slots);
        reassigned.push_back(static_cast<double>(s.reassigned) / slots);
        entropy.push_back(s.entropy);
        tokens.push_back(s.tokens_per_expert);
        balance.push_back(s.balance_loss);
        zloss.push_back(s.z_loss);
        z_on = z_on || s.z_loss != 0;
    }
    j["expert_load_max_over_mean"] = loads;
    j["dropped_fraction"]          = dropped;
    j["reassigned_fraction"]       = reassigned;
    j["routing_entropy"]           = entropy;
    j["expert_tokens"]             = tokens;
    // of the step's last micro-batch, as the fractions above: the terms each layer adds to the
    // loss (times their coefficients)
    j["balance_loss"] = balance;
    if (z_on) j["router_z_loss"] = zloss;
    nlohmann::json violation = nlohmann::json::array(), bmin = violation, bmax = violation,
                   babs = violation, choices = violation;
    for (const auto& layer : gpt.moe_layers()) {
        const moe::BalanceBias& b = layer->balance_bias();
        const moe::BiasStats st   = b.stats();
        violation.push_back(b.max_violation());
        choices.push_back(b.step_load());
        bmin.push_back(st.min);
        bmax.push_back(st.max);
        babs.push_back(st.mean_abs);
    }
    // the step's top-k choices over all micro-batches and ranks: max / mean - 1
    j["choice_load_max_violation"] = violation;
    j["choice_tokens"]             = choices;  // the choices per expert that violation is of
    if (bias_on) {
        j["balance_bias_min"]      = bmin;
        j["balance_bias_max"]      = bmax;
        j["balance_bias_mean_abs"] = babs;
    }
}

// After each training micro-batch's forward: its top-k choices per expert (already summed over
// ranks by the router) into each MoE layer's step load. Once per micro-batch, from the trainer,
// so a forward run again (recomputation) or an evaluation forward counts nothing.
void add_choice_loads(model::GPT& gpt) {
    for (const auto& layer : gpt.moe_layers()) {
        layer->balance_bias().add_load(layer->routing_stats().topk_per_expert.data());
    }
}

// After the optimizer step: each MoE layer's step load measured and, with rate > 0, its bias
// updated (moe/balance_bias.h). A skipped fp16 step leaves the bias as it is.
void end_bias_step(model::GPT& gpt, double rate, bool proportional, bool skipped) {
    for (const auto& layer : gpt.moe_layers()) {
        if (skipped) {
            layer->balance_bias().discard_step();
        } else {
            layer->balance_bias().end_step(rate, proportional);
        }
    }
}

}  // namespace bagualu::train

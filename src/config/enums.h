// The enumerated values of the configuration (config.h). config.cpp parses them from the
// spellings below and prints them back; everything past the config compares enums, not strings.
#pragma once
#include "core/dtype.h"

namespace bagualu {

// model.gate (docs/model.md, Gates).
enum class GateKind { topk, switch_top1, gshard, noisy, swipe };
// Rows of the MoE gate's weight for E experts: one per expert, or with model.product_keys P > 0
// the product keys' P + E / P rows (moe/gate.h expand_product_keys). ModelConfig::gate_rows and
// the router both count them here.
constexpr int gate_weight_rows(int n_experts, int product_keys) {
    return product_keys > 0 ? product_keys + n_experts / product_keys : n_experts;
}
// model.router_score: the router's scores, softmax or sigmoid of the logits (docs/model.md).
enum class RouterScore { softmax, sigmoid };
// model.balance_bias_update: the step of the balancing bias (moe/balance_bias.h)
enum class BiasUpdate { sign, proportional };
// model.swipe_balance: what SWIPE balances exactly (docs/model.md, moe/swipe.h): each round's
// slots, or the step's K slots of every token together (the last round evens them out).
enum class SwipeBalance { round, step };
// model.balance_loss_scope: the tokens the auxiliary balancing loss balances (docs/model.md):
// all ranks' tokens of the micro-step, this rank's micro-batch, or each sequence.
enum class BalanceScope { global, micro_batch, sequence };
// precision.router: the arithmetic of the MoE router's logits and their gradients, whatever the
// levels say (docs/precision.md): float32, double sums, or operands rounded to the run's half
// type with float32 accumulation (as the ffn class's GEMMs).
enum class RouterPrecision { fp32, fp64, half };
// precision.grad_reduce: the dtype ParO reduce-scatters half-stored tensors' gradients in.
enum class GradReduce { fp32, half };
// precision.moments: the dtype AdamW keeps its first and second moments in.
enum class MomentDtype { fp32, bfloat16 };
// precision.{embedding,attention,ffn,head} (docs/precision.md).
enum class Level { O0, O1, O2, O3 };
// optimizer.partition: ParO on when there is more than one rank, always, never.
enum class Partition { automatic, on, off };
// parallel.two_level, parallel.hierarchical_a2a, parallel.node_dedup: on when the run spans
// more than one node (node_dedup: and routing is node-limited), always, never.
enum class NodeSwitch { automatic, on, off };
// Whether a switch is on, given what "auto" means here.
inline bool switch_on(NodeSwitch s, bool when_auto) {
    return s == NodeSwitch::on || (s == NodeSwitch::automatic && when_auto);
}
// parallel.collectives: the algorithm of our reduce-scatter / all-gather (dist/comm/
// collectives.h): chosen per call by size, the ring, or recursive halving/doubling.
enum class Collectives { automatic, ring, halving };
// checkpoint.resume: start afresh, or continue from the newest usable checkpoint.
enum class Resume { never, automatic };
// model.route_override, for tests and benchmarks: the routing choice forced (moe/router.h).
enum class RouteOverride { none, one_expert, one_rank, zipf };
// train.recompute: activations kept for backward (docs/model.md, Training): all of them; only
// each MoE layer's input (router, dispatch and experts run again in backward); only each
// block's input (the whole block runs again in backward).
enum class Recompute { none, moe, block };

// train.lr_schedule: the learning rate after the warm-up (docs/model.md, Training): cosine or
// linear from lr to min_lr at the last step; constant lr; warmup-stable-decay (lr, then a linear
// decay to min_lr over the last train.decay_steps steps).
enum class LrSchedule { cosine, linear, constant, wsd };

// The spelling of a value in a config file.
inline const char* name_of(GateKind g) {
    switch (g) {
        case GateKind::topk:
            return "topk";
        case GateKind::switch_top1:
            return "switch";
        case GateKind::gshard:
            return "gshard";
        case GateKind::noisy:
            return "noisy";
        case GateKind::swipe:
            return "swipe";
    }
    return "?";
}
inline const char* name_of(BiasUpdate u) {
    return u == BiasUpdate::proportional ? "proportional" : "sign";
}
inline const char* name_of(SwipeBalance b) { return b == SwipeBalance::step ? "step" : "round"; }
inline const char* name_of(RouterScore s) {
    return s == RouterScore::sigmoid ? "sigmoid" : "softmax";
}
inline const char* name_of(BalanceScope s) {
    return s == BalanceScope::global ? "global"
                                     : (s == BalanceScope::sequence ? "sequence" : "micro_batch");
}
inline const char* name_of(RouterPrecision p) {
    return p == RouterPrecision::fp64 ? "fp64" : (p == RouterPrecision::half ? "half" : "fp32");
}
inline const char* name_of(GradReduce g) { return g == GradReduce::half ? "half" : "fp32"; }
inline const char* name_of(MomentDtype d) { return d == MomentDtype::bfloat16 ? "bf16" : "fp32"; }
inline const char* name_of(Level l) {
    switch (l) {
        case Level::O0:
            return "O0";
        case Level::O1:
            return "O1";
        case Level::O2:
            return "O2";
        case Level::O3:
            return "O3";
    }
    return "?";
}
inline const char* name_of(Partition p) {
    return p == Partition::automatic ? "auto" : p == Partition::on ? "on" : "off";
}
inline const char* name_of(NodeSwitch p) {
    return p == NodeSwitch::automatic ? "auto" : p == NodeSwitch::on ? "on" : "off";
}
inline const char* name_of(Resume r) { return r == Resume::automatic ? "auto" : "never"; }
inline const char* name_of(Collectives c) {
    return c == Collectives::ring ? "ring" : c == Collectives::halving ? "halving" : "auto";
}
inline const char* name_of(Recompute r) {
    return r == Recompute::moe ? "moe" : r == Recompute::block ? "block" : "none";
}

inline const char* name_of(LrSchedule s) {
    switch (s) {
        case LrSchedule::linear:
            return "linear";
        case LrSchedule::constant:
            return "constant";
        case LrSchedule::wsd:
            return "wsd";
        case LrSchedule::cosine:
            break;
    }
    return "cosine";
}
inline const char* name_of(Dtype d) { return dtype_name(d); }
inline const char* name_of(RouteOverride r) {
    switch (r) {
        case RouteOverride::none:
            return "none";
        case RouteOverride::one_expert:
            return "one_expert";
        case RouteOverride::one_rank:
            return "one_rank";
        case RouteOverride::zipf:
            return "zipf";
    }
    return "?";
}

}  // namespace bagualu

// The enumerated values of the configuration (config.h). config.cpp parses them from the
// spellings below and prints them back; everything past the config compares enums, not strings.
#pragma once
#include "core/dtype.h"

namespace bagualu {

// model.gate (docs/model.md, Gates).
enum class GateKind { topk, switch_top1, gshard, noisy, swipe };
// precision.{embedding,attention,ffn,head} (docs/precision.md).
enum class Level { O0, O1, O2, O3 };
// optimizer.partition: ParO on when there is more than one rank, always, never.
enum class Partition { automatic, on, off };
// checkpoint.resume: start afresh, or continue from the newest usable checkpoint.
enum class Resume { never, automatic };
// train.recompute: activations kept for backward (docs/model.md, Training): all of them; only
// each MoE layer's input (router, dispatch and experts run again in backward); only each
// block's input (the whole block runs again in backward).
enum class Recompute { none, moe, block };

// The spelling of a value in a config file.
inline const char* name_of(GateKind g) {
    switch (g) {
        case GateKind::topk: return "topk";
        case GateKind::switch_top1: return "switch";
        case GateKind::gshard: return "gshard";
        case GateKind::noisy: return "noisy";
        case GateKind::swipe: return "swipe";
    }
    return "?";
}
inline const char* name_of(Level l) {
    switch (l) {
        case Level::O0: return "O0";
        case Level::O1: return "O1";
        case Level::O2: return "O2";
        case Level::O3: return "O3";
    }
    return "?";
}
inline const char* name_of(Partition p) {
    return p == Partition::automatic ? "auto" : p == Partition::on ? "on" : "off";
}
inline const char* name_of(Resume r) { return r == Resume::automatic ? "auto" : "never"; }
inline const char* name_of(Recompute r) {
    return r == Recompute::moe ? "moe" : r == Recompute::block ? "block" : "none";
}
inline const char* name_of(Dtype d) { return dtype_name(d); }

}  // namespace bagualu

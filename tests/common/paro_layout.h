// A parameter layout for the optimizer tests: dense and expert tensors interleaved, sizes not
// multiples of 16, so shard and bucket boundaries fall inside tensors.
#pragma once
#include "model/param_layout.h"

namespace bagualu::testing {

inline model::ParamLayout paro_test_layout() {
    model::ParamLayout l;
    l.add("wte", {97, 13}, true);
    l.add("ln.weight", {13}, false);
    l.add("experts.0.w", {41, 13}, true, true);
    l.add("experts.0.b", {41}, false, true);
    l.add("proj.weight", {13, 29}, true);
    l.add("experts.1.w", {41, 13}, true, true);
    l.add("ln_f.bias", {13}, false);
    return l;
}

}  // namespace bagualu::testing

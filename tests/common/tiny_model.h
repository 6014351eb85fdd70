// The tiny model of the gradient checks: 2 layers, block 0 dense, block 1 MoE with 4 experts,
// top-2 (the shape of configs/tiny.toml, smaller), aux loss weighted 0.1 so that a wrong aux
// gradient shows in a central-difference check.
#pragma once
#include "config/config.h"

namespace bagualu::testing {

inline ModelConfig tiny_moe_config() {
    ModelConfig m;
    m.vocab_size    = 61;
    m.d_model       = 16;
    m.n_layer       = 2;
    m.n_head        = 2;
    m.seq_len       = 12;
    m.d_ff          = 24;
    m.n_experts     = 4;
    m.top_k         = 2;
    m.moe_every     = 2;
    m.aux_loss_coef = 0.1;
    return m;
}

}  // namespace bagualu::testing

// What one training step of a config on a layout holds and moves, counted exactly as the
// implementation allocates and sends (no timing, no machine): bytes per rank by category,
// collectives per step with their payload bytes, and model FLOPs. The sizes come from the same
// functions the implementation uses (model::activation_floats, model::layout_size,
// model::forward_flops_per_token); the MoE buffers mirror MoELayer / TokenDispatcher and are
// checked against real allocations in tests/unit/plan. estimate.h turns this into time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "dist/comm/counters.h"

namespace bagualu::plan {

// Weights and compute precision. fp32 is what the trainer does today. bf16 is the hook for
// mixed precision: 2-byte weights and gradients, fp32 master weights in the optimizer, GEMMs at
// the half-precision peak; activations stay fp32 as in our kernels.
enum class Precision { fp32, bf16 };

struct Layout {
    int       ranks          = 1;  // P
    int       ranks_per_node = 1;  // R
    int       ep             = 1;  // parallel.expert_parallel
    int64_t   micro_batch    = 1;  // sequences per rank per forward
    int64_t   accum          = 1;  // micro-batches per step
    int       threads        = 1;  // compute threads per rank
    // Ranks the optimizer state is partitioned over (1 = replicated, as the trainer does when
    // [optimizer] partition is absent or off): m and v shrink by this factor, and gradients are
    // reduce-scattered and parameters all-gathered instead of all-reduced.
    int       opt_shards     = 1;
    Precision precision      = Precision::fp32;
    // What-if for the MoE buffers: 0 = as implemented (sized for the worst case, every routed
    // row of the EP group arriving at one rank: EP * N * K rows); c > 0 = bounded to c * N * K
    // rows per rank, as a capacity-limited (SWIPE-balanced) dispatcher would allocate.
    double    capacity_factor = 0;
    int edp() const { return ranks / ep; }
    int nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
};

// Bytes per rank. Buffers are counted with Buffer's 64-byte rounding.
struct Memory {
    double baseline       = 0;  // process: binary, libraries, MPI, thread stacks (machine file)
    double parameters     = 0;
    double gradients      = 0;
    double optimizer      = 0;  // AdamW m and v (+ fp32 master weights under bf16)
    double activations    = 0;  // GPT arena, token buffers, MoE saved state and scratch
    double comm_buffers   = 0;  // TokenDispatcher staging and counts
    double data           = 0;  // token arrays of the data set and the loader's batches
    double checkpoint     = 0;  // snapshot buffer of asynchronous checkpoints (checkpoint.every > 0)
    double total() const {
        return baseline + parameters + gradients + optimizer + activations + comm_buffers + data +
               checkpoint;
    }
};

// One kind of call per step on one rank: `calls` calls moving `bytes` payload bytes in total
// (the mean over ranks where ranks differ: all-to-all payloads follow the routing).
struct Collective {
    std::string    what;   // "moe all-to-all", "gradient all-reduce (dense)", ...
    dist::CommKind kind;
    std::string    group;  // world, ep, edp
    int            group_size = 1;
    double         calls      = 0;
    double         bytes      = 0;
};

struct Footprint {
    Layout                  layout;
    uint64_t                params_full = 0;   // whole model
    uint64_t                rank_floats = 0;   // parameter floats on one rank (padding included)
    uint64_t                expert_floats = 0; // of them, this rank's experts
    Memory                  memory;
    std::vector<Collective> collectives;       // per step, per rank
    double                  model_flops_per_step = 0;  // all ranks: 3 x forward x tokens
    double                  tokens_per_step      = 0;  // all ranks
};

// data_tokens: tokens of the train and val shards (0 when the files are absent).
// baseline_bytes: the process baseline (machine file). Throws InputError when the layout does
// not match the config (as validate_layout).
Footprint footprint(const TrainConfig& cfg, const Layout& layout, uint64_t data_tokens,
                    double baseline_bytes);

// Bytes of the MoE layers' own buffers on one rank (MoELayer + TokenDispatcher), split as
// activations (saved + scratch) and communication buffers.
struct MoEBytes {
    double activations  = 0;
    double comm_buffers = 0;
};
// half_payload: the all-to-alls carry 16-bit rows (ffn at O2 and above), through two more
// staging buffers of half the float staging's bytes each.
MoEBytes moe_layer_bytes(const ModelConfig& m, int64_t max_tokens, int ep,
                         double capacity_factor = 0, bool half_payload = false);

// Sums the collectives by kind: the numbers a run's counters report for one rank and step.
dist::CommTally per_kind(const std::vector<Collective>& collectives);

}  // namespace bagualu::plan

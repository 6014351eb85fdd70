// What one training step of a config on a layout holds and moves, counted exactly as the
// implementation allocates and sends (no timing, no machine): bytes per rank by category,
// collectives per step with their payload bytes, and model FLOPs. The sizes come from the same
// functions the implementation uses (model::activation_floats, model::layout_size,
// model::forward_flops_per_token); the MoE buffers mirror MoELayer / TokenDispatcher and are
// checked against real allocations in tests/unit/plan. The collectives mirror the trainer call
// for call: ParO's buckets (dist::paro::shard_geometry), the algorithm and hops of our own
// reduce-scatter / all-gather (dist::resolve_algo, dist::sendrecv_hops), the half payloads of
// mixed precision (model::PrecisionPolicy), the gates' count exchanges and the reader groups'
// scatter (data::reader_group); tests/moda/plan_bytes_test.cpp compares them with what runs
// count. estimate.h turns this into time.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "dist/comm/collectives.h"
#include "dist/comm/counters.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "model/precision.h"

namespace bagualu::plan {

struct Layout {
    int ranks           = 1;  // P
    int ranks_per_node  = 1;  // R
    int ep              = 1;  // parallel.expert_parallel
    int64_t micro_batch = 1;  // sequences per rank per forward
    int64_t accum       = 1;  // micro-batches per step
    int threads         = 1;  // compute threads per rank
    // Ranks the optimizer state is partitioned over (ParO, cfg.partition_optimizer(ranks): the
    // world for dense tensors, opt_shards_expert = EDP for expert tensors; 1 = replicated): m
    // and v shrink by this factor, and gradients are reduce-scattered and parameters
    // all-gathered in buckets instead of all-reduced.
    int opt_shards        = 1;
    int opt_shards_expert = 1;
    size_t bucket_floats  = size_t{1} << 20;  // ParO's bucket target (parallel.bucket_mib)
    int readers           = 0;                // data.readers resolved (0: every rank reads)
    model::PrecisionPolicy policy;            // [precision]: dtype and a level per class
    // Gradient reduction on the helper thread during the last backward
    // (parallel.overlap_grad_reduce)
    bool overlap = false;
    // parallel.two_level resolved: ParO's and the replicated reductions inside the node first,
    // then across nodes (the world spans more than one node, or "on")
    bool two_level = false;
    // parallel.collectives: the algorithm of our reduce-scatters / all-gathers (resolved per call)
    dist::CollAlgo coll_algo = dist::CollAlgo::automatic;
    // parallel.hierarchical_a2a resolved (EP > 1): the MoE all-to-alls gather to one leader per
    // node, exchange between leaders, scatter in the node (dist/comm/alltoallv.h)
    bool hierarchical_a2a = false;
    // parallel.node_dedup resolved (EP > 1): the MoE exchanges send each token once per node
    // (moe/node_dispatcher.h), when a layer's rows take one round and one piece
    bool node_dedup = false;
    // parallel.a2a_grid resolved (dist::grid_rows; 0 = direct): the exchange of the MoE
    // all-to-alls (the leaders' when hierarchical) in two phases over rows of this many ranks
    int a2a_grid = 0;
    // The first level of the two-level reductions: parallel.reduce_group consecutive ranks, or
    // the node's (ranks_per_node) when 0
    int reduce_group = 1;
    // What-if for the MoE buffers: 0 = as configured (model.moe_rows_budget); c > 0 = a row
    // budget of c x N x K rows per rank instead (moe::moe_rows_budget either way).
    double capacity_factor = 0;
    // The GEMMs' packing buffers (gemm_packing_bytes): the caches our GEMMs block for and the
    // path they take on the machine that runs; caches.l2 == 0: not counted.
    kernels::CacheSizes caches;
    kernels::gemm::Path gemm_path = kernels::gemm::Path::generic;
    std::optional<bool> avx512_bf16;  // which bf16 kernel avx512 runs; unknown: the larger
    int edp() const { return ranks / ep; }
    int nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
};

// Bytes per rank. Buffers are counted with Buffer's 64-byte rounding.
struct Memory {
    double baseline     = 0;  // process: binary, libraries, MPI, thread stacks (machine file)
    double parameters   = 0;
    double gradients    = 0;
    double optimizer    = 0;  // AdamW m and v (+ fp32 master weights under bf16)
    double activations  = 0;  // GPT arena, token buffers, MoE saved state and scratch
    double comm_buffers = 0;  // TokenDispatcher staging and counts
    double data         = 0;  // token arrays of the data set and the loader's batches
    double checkpoint   = 0;  // snapshot buffer of asynchronous checkpoints (checkpoint.every > 0)
    double gemm_packing = 0;  // the GEMMs' packing buffers, kept by each compute thread
    double total() const {
        return baseline + parameters + gradients + optimizer + activations + comm_buffers + data +
               checkpoint + gemm_packing;
    }
};

// One kind of call per step on one rank: `calls` calls moving `bytes` payload bytes in total
// (the mean over ranks where ranks differ: all-to-all payloads follow the routing, only the
// members of reader groups scatter).
struct Collective {
    std::string what;  // "moe all-to-all", "gradient all-reduce (dense)", ...
    dist::CommKind kind;
    std::string group;  // world, ep, edp, readers
    int group_size = 1;
    double calls   = 0;
    double bytes   = 0;
    // A unit of gradient reduction (reduce_schedule.h): may run during the last backward.
    bool reduction = false;
    // The Comm::sendrecv hops of one of our own reduce-scatters / all-gathers: counted by the
    // counters under sendrecv as well, timed with the collective they belong to.
    bool hops = false;
    // A reduce-scatter / all-gather over a group spanning `nodes` nodes of `per_node` of its
    // ranks (1: one node): two-level (inside the node, then across), else over nodes the
    // one-level direct exchange (collectives.h, "over nodes").
    int nodes      = 1;
    int per_node   = 1;
    bool two_level = false;
    // The leaders' exchange of a hierarchical all-to-all: one rank of each of per_node ranks
    // calls it (calls and bytes are the mean over ranks), carrying its node's rows; timed per
    // leader (calls x per_node of them) across nodes.
    bool leaders = false;
    // our reduce-scatter / all-gather: the algorithm asked for (resolved per level and size)
    dist::CollAlgo coll_algo = dist::CollAlgo::automatic;
    // The group's members are every stride-th rank of the ranks it spans (a grid column of
    // dist::alltoallv_grid: the rows' length); 1 = consecutive ranks.
    int stride = 1;
};

// Bytes of the grow-only 16-bit operand copies bf16 GEMMs convert their operands into
// (kernels/mixed.cpp: input, weight, output gradient, each as large as the largest of its kind
// over the products the policy computes in bf16; at most 2 x 3 x the largest operand: an upper
// bound, the weights' copy only where the kernel does not pack float weights itself); allocated
// at the first products, counted in Memory::activations; 0 unless the run is bf16.
double half_operand_bytes(const TrainConfig& cfg, const Layout& L);

// The most the GEMMs' packing buffers of one rank hold (kernels/gemm/driver.h packing_bound,
// grow-only, per compute thread): over the products of the model's linear layers on a
// micro-batch's tokens (forward, input and weight gradients; the experts' on the grouped driver
// with a round's rows), L.threads threads, on L.caches and L.gemm_path; 0 when L.caches.l2 is 0
// (a machine file without caches). oneDNN's own scratch (BGL_GEMM=onednn or auto) is not in it.
double gemm_packing_bytes(const TrainConfig& cfg, const Layout& L);

// The node layout dist::make_node_layout finds for a group of G ranks k * stride (k < G), R
// consecutive ranks a node: {nodes, ranks per node}; one node when nodes hold different counts.
std::pair<int, int> group_nodes(int G, int stride, int R);

struct Footprint {
    Layout layout;
    uint64_t params_full   = 0;  // whole model
    uint64_t rank_floats   = 0;  // parameter floats on one rank (padding included)
    uint64_t expert_floats = 0;  // of them, this rank's experts
    // mixed precision: floats rounded before each forward (half-stored tensors in place, the
    // float32-stored ones computed in half into their copies; model/gpt.h)
    uint64_t rounded_floats = 0;
    Memory memory;
    std::vector<Collective> collectives;  // per step, per rank
    double model_flops_per_step = 0;      // all ranks: 3 x forward x tokens
    double tokens_per_step      = 0;      // all ranks
    // Rounds of each MoE layer's experts at the balanced load (N x K rows per rank) through
    // the row budget: 1 unless the budget is below the balanced load. Skewed routing takes more
    // (top-k; SWIPE in training is exactly balanced). With more than one, backward dispatches
    // the tokens again and recomputes the experts' forward.
    double moe_rounds = 1;
    // The experts' exchanges overlapped with compute on the all-to-all helper (EP > 1, one
    // round, the plain exchange; docs/parallelism.md): a2a_pieces = parallel.a2a_chunks pieces
    // pipelined with the experts' products, or (one piece) shared_beside: the dispatch beside
    // the shared experts (parallel.overlap_shared), forward and, with one shared expert,
    // backward. a2a_forward_share: the forwards' part of the dispatches and combines.
    double a2a_pieces        = 1;
    bool shared_beside       = false;
    double a2a_forward_share = 0.5;
    // Bytes per step and rank the MoE all-to-alls send to other nodes (routing spread evenly
    // over the experts): as configured, and through the plain exchange with unlimited routing
    // (one row per slot), for comparison. 0 on one node.
    double a2a_inter_node_bytes       = 0;
    double a2a_inter_node_bytes_plain = 0;
};

// The layout of a run of cfg over `ranks` processes, R per node, `threads` compute threads per
// rank (0: the config's, else one per core): everything the trainer derives from the config
// (micro-batch, accumulation, ParO, precision, bucket size, overlap).
// policy: the run's precision policy, built once from cfg.precision by the caller.
Layout make_layout(const TrainConfig& cfg, const model::PrecisionPolicy& policy, int ranks,
                   int ranks_per_node, int threads);

// Bytes of the data order's tables on a reading rank (data/sampler.h: 8 a window of each split
// of up to kExactShuffleWindows windows, none beyond), the windows counted from the headers of
// data.train's shards or data.blend's (a file that is absent or not a shard counts 0):
// footprint's order_bytes.
uint64_t data_order_bytes(const TrainConfig& cfg);

// order_bytes: data_order_bytes (0 when the files are absent).
// baseline_bytes: the process baseline (machine file). Throws InputError when the layout does
// not match the config (as validate_layout).
Footprint footprint(const TrainConfig& cfg, const Layout& layout, uint64_t order_bytes,
                    double baseline_bytes);

// Bytes of the MoE layers' own buffers on one rank (MoELayer + TokenDispatcher), split as
// activations (saved + scratch) and communication buffers. capacity_factor: 0 = the config's
// model.moe_rows_budget, > 0 = that row budget instead.
struct MoEBytes {
    double activations = 0;
    // of activations: moe::MoEBuffers (with the router's RouterKept), shared by the layers
    // under recompute
    double layer_buffers = 0;
    double scratch       = 0;  // moe::MoEScratch, not in activations: one for all the layers
    double comm_buffers  = 0;
};
// half_act: the experts' activations hold half values (ffn at O2 and above): the all-to-alls
// carry 16-bit rows, through two more staging buffers of half the float staging's bytes each,
// and the expert pre-activations are kept in 16 bits. a2a_chunks: parallel.a2a_chunks (the
// pieces need the send staging and their plans, bias-gradient sums as rounds do). gather_dy:
// the experts' products are in bf16, which narrow their output gradient from the tokens' rows
// (moe::experts_gather_dy), so with EP 1 in one round no (N K, C) copy of it is allocated.
// y16: the experts' activations are bf16, so with EP 1 in one round their outputs are kept in 16
// bits.
MoEBytes moe_layer_bytes(const ModelConfig& m, int64_t max_tokens, int ep,
                         double capacity_factor = 0, bool half_act = false, int a2a_chunks = 1,
                         bool gather_dy = false, bool y16 = false);

// Sums the collectives by kind: the numbers a run's counters report for one rank and step.
dist::CommTally per_kind(const std::vector<Collective>& collectives);

}  // namespace bagualu::plan

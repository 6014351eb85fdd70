// Predicted step time, throughput and memory fit of a footprint on a machine. Symbols and
// formulas are in docs/scale.md:
//   t_step = t_gemm + t_attn + t_mem + t_comm - overlap
//   t_gemm = sum over GEMMs of 2MNK / (peak_rank * eff(M, N, K))   (forward, dinp and dweight)
//   t_mem  = bytes of layernorm, GELU, softmax/cross-entropy, permutes, optimizer / bw_rank
//   t_comm = sum over collectives of calls * alpha_level + bytes * traffic / beta_level
//   overlap = the gradient reduction hidden behind the last backward of the step
//             (parallel.overlap_grad_reduce): min(t_reduce - t_last_unit, t_backward_last)
#pragma once
#include <string>
#include <vector>

#include "plan/footprint.h"
#include "plan/machine.h"

namespace bagualu::plan {

struct Term {
    std::string name;
    double seconds = 0;
};

struct Estimate {
    Footprint fp;
    std::vector<Term> compute;  // per step: GEMM groups, attention, memory-bound groups
    std::vector<Term> comm;     // per step, one per Collective
    double t_compute = 0, t_memory = 0, t_comm = 0, t_overlap = 0, t_step = 0;
    // of t_comm, the experts' exchanges hidden behind the experts on the all-to-all helper
    // (parallel.a2a_chunks, parallel.overlap_shared)
    double t_a2a_hidden      = 0;
    double tokens_per_s      = 0;  // all ranks
    double sustained_flops   = 0;  // model FLOPs / t_step, all ranks
    double peak_flops        = 0;  // nodes x node peak (of the precision)
    double fraction_of_peak  = 0;
    double node_memory_bytes = 0;  // ranks_per_node x per-rank total
    double node_capacity     = 0;
    bool fits                = false;
    std::string bottleneck;
};

struct EstimateOptions {
    // < 0: as the trainer does (Layout::overlap, docs/scale.md); f in [0, 1]: what-if, a fraction
    // f of min(gradient reduction, last backward) hidden (0: none).
    double comm_overlap = -1;
};

Estimate estimate(const Footprint& fp, const TrainConfig& cfg, const MachineSpec& machine,
                  const EstimateOptions& opt = {});

// GEMM efficiency of the machine for an M x N x K product (fraction of the core peak): of its
// float32 products, or with half of its bf16 products against peak_half_gflops (the node's
// half_gemm_efficiency, the float32 curve where the machine file has none).
double gemm_efficiency(const NodeSpec& node, double M, double N, double K, bool half = false);

// Seconds of one call moving `bytes` payload bytes over a group of `group_size` consecutive
// ranks with R ranks per node (alpha-beta per level, see docs/scale.md).
// algo: the algorithm asked for of our reduce-scatters / all-gathers (resolved by size).
// stride: the group's members are every stride-th rank of the ranks they span (a grid column).
double collective_seconds(const MachineSpec& m, dist::CommKind kind, int group_size,
                          int ranks_per_node, double bytes,
                          dist::CollAlgo algo = dist::CollAlgo::automatic, int stride = 1);

}  // namespace bagualu::plan

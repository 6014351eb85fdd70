// A machine description for the planner: per node the compute peaks, memory size and
// bandwidth, what our kernels reach of them, and the network (alpha-beta per level: inside a
// node, between nodes of one supernode, above the supernode). Read from TOML (machines/*.toml)
// with the training config's rules: unknown keys and wrong types are one-line InputErrors.
// `bagualu calibrate` measures and writes one for the local machine.
#pragma once
#include <string>
#include <vector>

namespace bagualu::plan {

struct NodeSpec {
    double peak_fp32_gflops          = 0;  // whole node, all cores
    double peak_half_gflops          = 0;  // bf16/fp16 multiply-add peak (the bf16 compute hook)
    double memory_gib                = 0;
    double memory_bandwidth_gbs      = 0;  // sustained (STREAM triad), whole node
    double memory_bandwidth_core_gbs = 0;  // the same on one core (0 = node / cores)
    int cores                        = 1;
    // What our kernels reach: fraction of the per-core peak for GEMM as a function of the GEMM
    // size s = 3 / (1/M + 1/N + 1/K) (piecewise linear in log2 s, clamped at the ends).
    std::vector<double> gemm_sizes      = {1024};
    std::vector<double> gemm_efficiency = {0.5};
    // The same for the bf16 products (gemm_bf16), against peak_half_gflops, at gemm_sizes: on
    // some CPUs they reach a different fraction of their peak than float32 does of its own (the
    // AMX tiles). Empty: gemm_efficiency.
    std::vector<double> half_gemm_efficiency;
    double attention_efficiency = 0.2;  // causal attention kernel, fraction of peak
    // The optimizer's per-float work on one core, in ns: gradient norm, clip and AdamW over
    // p, g, m, v (0 = bounded by memory bandwidth alone)
    double optimizer_ns_per_float = 0;
    double baseline_rss_mib       = 0;  // resident memory of an idle bagualu process
    double mpi_rss_mib            = 0;  // added per process by MPI start-up and first collectives
    // For the GEMMs' packing buffers in the memory model (kernels/gemm/driver.h packing_bound):
    // the caches our GEMMs block for (L2 of one core, L3 as the CPU reports it) and the GEMM path
    // the runs take (a BGL_GEMM name: generic, avx2, avx512, amx, ...). "" = not counted.
    double l2_kib = 0, l3_kib = 0;
    std::string gemm_path;
    // The CPU's 16-bit features as `bench` prints them ("avx512_bf16 amx_bf16", ...): which bf16
    // kernel the avx512 path runs; "" = not known (the larger is counted).
    std::string half_features;
};

struct NetworkSpec {
    double intra_node_bandwidth_gbs = 10;  // per rank, ranks of one node (shared memory)
    double intra_node_latency_us    = 1;
    double intra_node_reduce_gbs    = 0;  // all-reduce bandwidth inside a node (0 = as above)
    // Extra seconds per blocking collective call when ranks time-share cores (scheduling delay
    // and spin-waiting of oversubscribed ranks); 0 on a dedicated machine.
    double sync_us                 = 0;
    double injection_bandwidth_gbs = 10;  // per node, to the network
    double latency_us              = 2;   // between nodes of one supernode
    int nodes_per_supernode        = 1;   // full bisection inside
    double oversubscription        = 1;   // bandwidth above the supernode = injection / this
    double supernode_latency_us    = 4;   // between supernodes
    int total_nodes                = 1;   // of the machine, for checks of --nodes
};

struct MachineSpec {
    std::string name   = "machine";
    std::string source = "<built-in>";  // the file, for messages
    // The CPU the figures were measured on (its CPUID brand string), as `calibrate` records it;
    // "" in a file written by hand. `calibrate` updates only a file of its own CPU.
    std::string cpu_model;
    std::string notes;  // free text, kept when written back
    NodeSpec node;
    NetworkSpec network;
};

// Throws InputError naming the file and key on any problem (missing file, bad TOML, unknown
// section or key, wrong type, value out of range).
MachineSpec load_machine(const std::string& path);
void validate(const MachineSpec& m);
// TOML text that load_machine reads back to the same values; `comments` go on top.
std::string to_toml(const MachineSpec& m, const std::string& comments = "");

}  // namespace bagualu::plan

// Measurements of the local machine for its machine file (`bagualu calibrate`): per-core FMA
// peak, GEMM and attention efficiency of our kernels, the optimizer's time per float (norm,
// clip, AdamW), STREAM-triad bandwidth on one core and on
// all cores, the idle resident memory of a process, and, over a Comm of several ranks, the
// latency and bandwidth of all-to-all and all-reduce. Runs on the compute pool, which must have
// one thread (set_compute_threads(1)) so per-core numbers are per core.
#pragma once
#include <vector>

#include "dist/comm/comm.h"
#include "plan/machine.h"

namespace bagualu::plan {

struct ComputeCalibration {
    double peak_core_gflops = 0, peak_core_half_gflops = 0;
    int cores             = 1;
    double triad_core_gbs = 0, triad_node_gbs = 0;
    // at gemm_sizes: fractions of peak_core_gflops (gemm_f32) and of peak_core_half_gflops
    // (gemm_bf16)
    std::vector<double> gemm_sizes, gemm_efficiency, half_gemm_efficiency;
    double attention_efficiency   = 0;
    double optimizer_ns_per_float = 0;
};
// seconds: time spent per measurement (a few measurements each, the median kept).
ComputeCalibration calibrate_compute(double seconds);

struct CommCalibration {
    double alltoall_latency_us = 0, alltoall_gbs = 0;  // per rank
    double allreduce_latency_us = 0, allreduce_gbs = 0;
    double sync_us = 0;  // extra time of a blocking call between slices of work (time-sharing)
};
// Collective over comm (size > 1): small and large messages, median of repeats.
CommCalibration calibrate_comm(dist::Comm& comm);

// Runs the peak loop and a small GEMM and attention once, as every training process does early:
// the resident memory after it is the process baseline.
void warm_up_kernels();

// Updates a machine description with measurements.
void apply(MachineSpec& m, const ComputeCalibration& c);
void apply(MachineSpec& m, const CommCalibration& c, int ranks);

}  // namespace bagualu::plan

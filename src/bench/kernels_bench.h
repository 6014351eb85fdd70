// `bagualu bench kernels`: the CPU, its 16-bit features and measured FP32/BF16 peaks (BF16: the
// better of vdpbf16ps and AMX), then GEMM throughput of ours, oneDNN and OpenBLAS on squares
// (NN) and the given model shapes, each the median over `repeats` timed runs with the same
// thread count (the compute pool's). Prints a table, or one JSON object with json = true:
// backend, ours, threads, cpu_model, half_features, onednn_version, onednn_f32_impl,
// onednn_bf16_impl, peak_fp32_gflops, peak_bf16_dot_gflops, peak_amx_bf16_gflops (0: no AMX),
// peak_bf16_gflops and gemm: a list of {name, m, n, k, trans, dtype, ours_gflops, onednn_gflops
// (our onednn backend), onednn_omp_gflops (oneDNN on its OpenMP threads, in this process),
// onednn_standalone_gflops (the same in a child process; with standalone_check),
// openblas_gflops} (null: not available), then grouped_gemm: one grouped call vs a loop of gemm_f32
// over 8 Zipf-skewed experts at the default model's shape, {product, experts, tokens_per_expert,
// grouped_gflops, loop_gflops, grouped_over_loop}, and attention: the attention core's forward
// and backward on one micro-batch, ms a call, {B, T, C, NH, float_isa, forward_ms, backward_ms,
// tiles_forward_ms, tiles_backward_ms, dots_forward_ms, dots_backward_ms} (tiles: bf16 on AMX
// tiles, dots: bf16 on AVX512_BF16 dot products; null where they do not run).
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/gemm.h"

namespace bagualu::bench {

// C (m, n) = op(A) @ op(B), op = transpose where ta / tb say so.
struct GemmShape {
    std::string name;  // what it is, e.g. "qkv fwd"
    int m = 0, n = 0, k = 0;
    kernels::Trans ta = kernels::Trans::N, tb = kernels::Trans::N;
};

struct KernelsBenchOptions {
    bool json                = false;
    int repeats              = 5;
    std::vector<int> squares = {512, 1024, 2048};  // m = n = k, NN
    std::vector<GemmShape> model_shapes;
    std::string filter;             // run only GEMMs whose name contains it ("" = all)
    bool standalone_check = false;  // oneDNN also in a child process
    // The attention core timed on one micro-batch of the model: B sequences of T tokens, C
    // channels, NH heads (0: not timed).
    int attn_B = 0, attn_T = 0, attn_C = 0, attn_NH = 0;
};

// The GEMMs of one training step of model m on micro-batches of micro_batch sequences
// (N = micro_batch * seq_len rows; each expert gets N * top_k / n_experts rows, as under
// balanced routing): per linear layer the forward (NT), d input (NN) and d weight (TN).
// Shapes that occur twice are listed once, under the first name.
std::vector<GemmShape> training_gemm_shapes(const ModelConfig& m, int micro_batch);

int run_kernels_bench(const KernelsBenchOptions& opts);

}  // namespace bagualu::bench

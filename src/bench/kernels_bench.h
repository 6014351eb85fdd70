// `bagualu bench kernels`: measured FP32/BF16 peak, then GEMM throughput of ours, oneDNN and
// OpenBLAS on squares (512, 1024, 2048) and the given model shapes, each the median over
// `repeats` timed runs with the same thread count (the compute pool's). Prints a table, or one
// JSON object with json = true: peak_fp32_gflops, peak_bf16_gflops and gemm: a list of
// {m, n, k, trans, dtype, ours_gflops, onednn_gflops, openblas_gflops} (null: not available),
// then grouped_gemm: one grouped call vs a loop of gemm_f32 over 8 Zipf-skewed experts at the
// default model's shape, {product, experts, tokens_per_expert, grouped_gflops, loop_gflops,
// grouped_over_loop}.
#pragma once
#include <array>
#include <vector>

namespace bagualu::bench {

struct KernelsBenchOptions {
    bool                            json    = false;
    int                             repeats = 5;
    std::vector<std::array<int, 3>> model_shapes;  // {m, n, k}, run as C = A @ B^T (forward)
};

int run_kernels_bench(const KernelsBenchOptions& opts);

}  // namespace bagualu::bench

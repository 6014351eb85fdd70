// Peak measurement: every compute-pool worker runs the chosen loop for the same wall time after a
// short warm-up (clocks ramp up), and the per-worker rates are added.
#include "kernels/peak.h"

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/mixed.h"
#include "kernels/peak_loops.h"

namespace bagualu::kernels {

namespace {

struct PeakLoop {
    void (*run)(uint64_t iters, float* sink);
    int flops_per_iter;
};

// Baseline x86-64 has no FMA: 8 independent 4-float chains of multiply then add (2 flops a lane).
void mul_add_loop_f32(uint64_t iters, float* sink) {
    constexpr int kAcc = 8, kW = 4;
    float acc[kAcc][kW];
    for (int i = 0; i < kAcc; ++i) {
        for (int l = 0; l < kW; ++l) acc[i][l] = float(i * kW + l) * 1e-3f;
    }
    for (uint64_t it = 0; it < iters; ++it) {
        for (int i = 0; i < kAcc; ++i) {
            for (int l = 0; l < kW; ++l) acc[i][l] = acc[i][l] * 0.999999f + 1e-6f;
        }
    }
    float s = 0.0f;
    for (int i = 0; i < kAcc; ++i) {
        for (int l = 0; l < kW; ++l) s += acc[i][l];
    }
    *sink = s;
}

// The float arithmetic the products of the active GEMM path run on (peak_f32_isa).
PeakLoop f32_loop() {
    switch (peak_f32_isa()) {
        case Isa::avx512:
            return {avx512::fma_loop_f32, avx512::kFmaLoopF32Flops};
        case Isa::avx2:
            return {avx2::fma_loop_f32, avx2::kFmaLoopF32Flops};
        case Isa::generic:
            break;
    }
    return {mul_add_loop_f32, 8 * 4 * 2};
}

double measure(PeakLoop loop, double seconds) {
    using clock               = std::chrono::steady_clock;
    constexpr uint64_t kIters = 1 << 14;
    ThreadPool& pool          = compute_pool();
    std::vector<double> gflops(static_cast<size_t>(pool.size()), 0.0);
    pool.run([&](int tid) {
        float sink         = 0.0f;
        const auto run_for = [&](double s) {
            const auto t0  = clock::now();
            uint64_t calls = 0;
            double dt      = 0.0;
            do {
                loop.run(kIters, &sink);
                ++calls;
                dt = std::chrono::duration<double>(clock::now() - t0).count();
            } while (dt < s);
            return double(calls) * kIters * loop.flops_per_iter / dt * 1e-9;
        };
        run_for(seconds * 0.2);
        gflops[static_cast<size_t>(tid)] = run_for(seconds) + 0.0f * sink;
    });
    double total = 0.0;
    for (double g : gflops) total += g;
    return total;
}

}  // namespace

Isa peak_f32_isa() {
    switch (gemm::active_path()) {
        case gemm::Path::avx2:
            return Isa::avx2;
        case gemm::Path::generic:
            return Isa::generic;
        default:
            return best_isa();
    }
}

double measure_peak_gflops_amx_bf16(double seconds) {
    if (!request_amx()) return 0.0;
    // Every worker thread loads its tile configuration in each call and releases it after.
    return measure({avx512::tile_loop_bf16, avx512::kTileLoopBf16Flops}, seconds);
}

double measure_peak_gflops_f32(double seconds) { return measure(f32_loop(), seconds); }

bool bf16_peak_on_dots() { return cpu_features().avx512_bf16 && !gemm_bf16_widens(); }

double measure_peak_gflops_bf16(double seconds) {
    if (bf16_peak_on_dots()) {
        return measure({avx512::dot_loop_bf16, avx512::kDotLoopBf16Flops}, seconds);
    }
    return measure(f32_loop(), seconds);
}

const char* peak_path_name(PeakPath p) {
    switch (p) {
        case PeakPath::fp32_fma:
            return "fp32 fma";
        case PeakPath::bf16_dot:
            return "bf16 vdpbf16ps";
        case PeakPath::bf16_amx:
            return "bf16 amx";
    }
    return "?";
}

ProductPeak measure_product_peak(Dtype products, double seconds) {
    ProductPeak p;
    if (products != Dtype::bfloat16 || gemm_bf16_widens()) {
        p.gflops = measure_peak_gflops_f32(seconds);
        return p;
    }
    const gemm::Path gp = gemm::active_path();
    if (gp == gemm::Path::amx) {  // our products run on the tiles
        p.gflops = measure_peak_gflops_amx_bf16(seconds);
        p.path   = PeakPath::bf16_amx;
        return p;
    }
    p.gflops = measure_peak_gflops_bf16(seconds);
    p.path   = PeakPath::bf16_dot;
    if (gp == gemm::Path::onednn || gp == gemm::Path::automatic) {
        const double amx = measure_peak_gflops_amx_bf16(seconds);
        if (amx > p.gflops) {
            p.gflops = amx;
            p.path   = PeakPath::bf16_amx;
        }
    }
    return p;
}

}  // namespace bagualu::kernels

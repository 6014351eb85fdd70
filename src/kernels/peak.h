// Measured compute peak of this machine: register-only multiply-add loops with enough
// independent accumulators to keep every FMA pipe busy, run on all compute-pool workers at once.
// The yardstick for GEMM efficiency (ours / peak) in benchmarks and training-speed reports.
#pragma once
#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace bagualu::kernels {

// The float arithmetic the active GEMM path's products run on, which measure_peak_gflops_f32
// times: our AVX2 kernels (BGL_GEMM=avx2) AVX2 FMAs and our generic ones separate multiplies
// and adds, whatever wider instructions the CPU has, so that a run on them (an AVX2-only CPU
// emulated on a wider one) is measured against their own peak; every other path (ours on
// AVX-512 or AMX, the libraries, which pick the CPU's widest) the widest float FMA the CPU has.
Isa peak_f32_isa();

// Total GFLOP/s over the compute pool, 2 flops per FMA lane, on peak_f32_isa()'s float
// arithmetic (AVX-512 or AVX2 FMAs, or separate multiply and add).
double measure_peak_gflops_f32(double seconds);

// Whether measure_peak_gflops_bf16 times vdpbf16ps: the CPU has AVX512_BF16 and the active
// path's gemm_bf16 does not widen its operands (kernels/gemm.h gemm_bf16_widens).
bool bf16_peak_on_dots();

// Same for bf16 inputs: vdpbf16ps (4 flops per float lane: two bf16 products added) where
// bf16_peak_on_dots(). Elsewhere bf16 GEMM runs on float FMAs, so this returns the f32 peak.
double measure_peak_gflops_bf16(double seconds);

// Same for AMX-BF16 tiles (tdpbf16ps); 0 when the CPU or the OS has no AMX.
double measure_peak_gflops_amx_bf16(double seconds);

// The peak of the arithmetic the GEMMs of a run in dtype `products` use, the yardstick of its
// MFU: in bf16 where the products run on 16-bit arithmetic (gemm_bf16 does not widen,
// kernels/gemm.h gemm_bf16_widens), the vdpbf16ps peak, or the AMX tiles' where the GEMM backend is
// oneDNN or auto (which use them) and they are faster; else the float FMA peak.
enum class PeakPath { fp32_fma, bf16_dot, bf16_amx };
// "fp32 fma", "bf16 vdpbf16ps", "bf16 amx"
const char* peak_path_name(PeakPath p);
struct ProductPeak {
    double gflops = 0;
    PeakPath path = PeakPath::fp32_fma;
};
ProductPeak measure_product_peak(Dtype products, double seconds);

}  // namespace bagualu::kernels

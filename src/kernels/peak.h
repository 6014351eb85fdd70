#pragma once
namespace bagualu::kernels {
double measure_peak_gflops_f32(double seconds);
}

#include "kernels/peak.h"
namespace bagualu::kernels {
double measure_peak_gflops_f32(double) { return 0; }
}

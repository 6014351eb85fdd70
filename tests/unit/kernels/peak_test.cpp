// Peak measurement returns a plausible positive rate, and bf16 is at least the f32 rate.
#include "kernels/peak.h"

#include <gtest/gtest.h>

namespace bagualu::kernels {
namespace {

TEST(Peak, PositiveAndBf16NotBelowF32) {
    const double f32  = measure_peak_gflops_f32(0.05);
    const double bf16 = measure_peak_gflops_bf16(0.05);
    EXPECT_GT(f32, 0.1);
    EXPECT_GT(bf16, 0.5 * f32);  // equal (same loop) or about 2x (vdpbf16ps), with timing noise
}

}  // namespace
}  // namespace bagualu::kernels

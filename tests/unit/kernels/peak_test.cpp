// Peak measurement returns a plausible positive rate, and bf16 is at least the f32 rate.
#include "kernels/peak.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace bagualu::kernels {
namespace {

TEST(Peak, PositiveAndBf16NotBelowF32) {
    // the best of three interleaved measurements of each: a shared machine can stall one of them
    double f32 = 0, bf16 = 0;
    for (int i = 0; i < 3; ++i) {
        f32  = std::max(f32, measure_peak_gflops_f32(0.05));
        bf16 = std::max(bf16, measure_peak_gflops_bf16(0.05));
    }
    EXPECT_GT(f32, 0.1);
    EXPECT_GT(bf16, 0.5 * f32);  // equal (same loop) or about 2x (vdpbf16ps), with timing noise
}

}  // namespace
}  // namespace bagualu::kernels

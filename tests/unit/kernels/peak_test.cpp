// Peak measurement returns a plausible positive rate, and bf16 is at least the f32 rate; where
// the CPU has AMX-BF16 the tile loop runs and beats vdpbf16ps; the float loop follows the GEMM
// path; the CPU's 16-bit features.
#include "kernels/peak.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "gemm_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"

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
    // Equal (the same loop, no AVX512_BF16), about 2x (vdpbf16ps on Zen 4) or about 0.5x (on
    // Intel Xeons with AMX, 245 against 492 GFLOP/s measured): 0.25x leaves room for noise.
    EXPECT_GT(bf16, 0.25 * f32);
}

// The float peak is that of the arithmetic the active GEMM path's products run on: our AVX2
// kernels are timed against AVX2 FMAs on a CPU with AVX-512 too (an AVX2-only CPU emulated),
// our generic ones against multiplies and adds, every other path against the widest FMA.
TEST(Peak, FloatPeakFollowsTheProductsPath) {
    testing::PathGuard guard;
    const Isa widest = best_isa();
    gemm::set_active_path(gemm::best_path());
    EXPECT_EQ(peak_f32_isa(), widest);
    gemm::set_active_path(gemm::Path::generic);
    EXPECT_EQ(peak_f32_isa(), Isa::generic);
    gemm::set_active_path(gemm::Path::ref);
    EXPECT_EQ(peak_f32_isa(), widest);
    if (!gemm::path_supported(gemm::Path::avx2)) GTEST_SKIP() << "needs AVX2+FMA";
    gemm::set_active_path(gemm::Path::avx2);
    EXPECT_EQ(peak_f32_isa(), Isa::avx2);
    // its bf16 products widen: the 16-bit peak is that float peak's loop, not vdpbf16ps
    double f32 = 0, bf16 = 0;  // the best of three, as above
    for (int i = 0; i < 3; ++i) {
        f32  = std::max(f32, measure_peak_gflops_f32(0.05));
        bf16 = std::max(bf16, measure_peak_gflops_bf16(0.05));
    }
    // the same loop: equal but for noise (vdpbf16ps would be 2-4x on a CPU with AVX512_BF16)
    EXPECT_GT(bf16, 0.5 * f32);
    EXPECT_LT(bf16, 1.5 * f32);
}

TEST(Peak, AmxTilesBeatDotProducts) {
    if (!cpu_features().amx_bf16) GTEST_SKIP() << "needs AMX-BF16";
    ASSERT_TRUE(request_amx()) << "the kernel refused the AMX tile state";
    // A core's tdpbf16ps does 16 x 16 x 32 x 2 flops in 16 cycles (1024 a cycle); vdpbf16ps does
    // 64 an instruction, at most two a cycle (128). Asking for 2x instead of 8x leaves room for
    // a shared machine stalling one of the measurements.
    double dot = 0, amx = 0;
    for (int i = 0; i < 3; ++i) {
        dot = std::max(dot, measure_peak_gflops_bf16(0.05));
        amx = std::max(amx, measure_peak_gflops_amx_bf16(0.05));
    }
    EXPECT_GT(amx, 2.0 * dot);
}

TEST(Peak, NoAmxMeansZero) {
    if (cpu_features().amx_bf16) GTEST_SKIP() << "needs a CPU without AMX-BF16";
    EXPECT_FALSE(request_amx());
    EXPECT_EQ(measure_peak_gflops_amx_bf16(0.01), 0.0);
}

TEST(CpuFeatures, ModelAndHalfPrecisionFeatures) {
    const CpuFeatures& f = cpu_features();
    EXPECT_FALSE(f.model.empty());
    const std::string half = half_precision_features();
    EXPECT_EQ(half.find("avx512_bf16") != std::string::npos, f.avx512_bf16);
    EXPECT_EQ(half.find("amx_bf16") != std::string::npos, f.amx_bf16);
    EXPECT_EQ(half.find("avx512_fp16") != std::string::npos, f.avx512_fp16);
    if (f.avx512_bf16 || f.avx512_fp16) {
        EXPECT_TRUE(f.avx512);
    }
}

}  // namespace
}  // namespace bagualu::kernels

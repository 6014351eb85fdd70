// gemm_bf16 / grouped_gemm_bf16 with a float B rounded to bf16 as the kernel packs it: bitwise the
// same products on B's narrowed copy (bf16_from_float of every value), on every path of this CPU
// whose bf16 kernel packs floats (AVX2, AVX-512, AMX: all but the generic one). B holds values
// that need rounding, ties, NaNs, infinities, signed zeros and denormals; shapes are ragged around
// the 32-column panels and the k block, with B stored by k (tb = T) and by row (tb = N), a padded
// ldb, empty and one-row groups and gathered rows of A. A ctest SKIP names the missing feature
// where no path has it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "gemm_paths.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/gemm/kernels.h"
#include "kernels/grouped_gemm.h"

namespace bagualu::kernels {
namespace {

using testing::PathGuard;
using testing::supported_paths;

// Floats that mostly need rounding to bf16, with specials sprinkled in.
std::vector<float> float_operand(Rng& rng, size_t n) {
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              -std::numeric_limits<float>::signaling_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              -0.0f,
                              0.0f,
                              1e-40f,       // denormal: vcvtneps2bf16 would flush it
                              -3e-39f,      // denormal
                              1.00390625f,  // 1 + 2^-8: a tie, rounds to even (1)
                              1.01171875f,  // 1 + 3 * 2^-8: a tie, rounds up
                              3.4e38f};
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        v[i] = static_cast<float>(rng.uniform() * 4.0 - 2.0);
        if (i % 37 == 5) v[i] = specials[(i / 37) % std::size(specials)];
    }
    return v;
}

std::vector<bf16> narrowed(const std::vector<float>& x) {
    std::vector<bf16> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_from_float(x[i]);
    return out;
}

std::vector<bf16> bf16_operand(Rng& rng, size_t n) {
    std::vector<bf16> v(n);
    for (bf16& x : v) x = bf16_from_float(static_cast<float>(rng.uniform() * 2.0 - 1.0));
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The paths whose bf16 kernel packs float operands (each left active while f runs).
template <typename F>
int on_float_b_paths(F&& f) {
    PathGuard guard;
    int ran = 0;
    for (const gemm::Path p : supported_paths()) {
        gemm::set_active_path(p);
        if (!gemm_bf16_float_b()) {
            EXPECT_FALSE(grouped_gemm_bf16_float_b() && p != gemm::Path::onednn &&
                         p != gemm::Path::automatic)
                << gemm::path_name(p);
            continue;
        }
        SCOPED_TRACE(gemm::path_name(p));
        f();
        ++ran;
    }
    return ran;
}

TEST(GemmFloatB, PacksTheFloatsAsTheirNarrowedCopy) {
    Rng rng(31);
    const int ran = on_float_b_paths([&] {
        struct Shape {
            int M, N, K;
        };
        for (const Shape s : {Shape{1, 1, 1}, Shape{13, 37, 29}, Shape{50, 70, 401},
                              Shape{33, 96, 771}, Shape{64, 13, 2}}) {
            for (const Trans tb : {Trans::T, Trans::N}) {
                SCOPED_TRACE(::testing::Message() << s.M << "x" << s.N << "x" << s.K
                                                  << (tb == Trans::T ? " NT" : " NN"));
                const int ldb               = (tb == Trans::T ? s.K : s.N) + 3;
                const size_t b_rows         = size_t(tb == Trans::T ? s.N : s.K);
                const std::vector<float> B  = float_operand(rng, b_rows * size_t(ldb));
                const std::vector<bf16> B16 = narrowed(B);
                const std::vector<bf16> A   = bf16_operand(rng, size_t(s.M) * size_t(s.K));
                std::vector<float> want(size_t(s.M) * size_t(s.N), 0.5f), got = want;
                gemm_bf16(Trans::N, tb, s.M, s.N, s.K, 1.0f, A.data(), s.K, B16.data(), ldb, 0.25f,
                          want.data(), s.N);
                gemm_bf16(Trans::N, tb, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), ldb, 0.25f,
                          got.data(), s.N);
                EXPECT_TRUE(same_bits(got, want));
            }
        }
    });
    if (ran == 0) GTEST_SKIP() << "needs AVX2 (a bf16 GEMM kernel that packs floats)";
}

// The panels themselves, byte for byte: the 16-bit kernels take denormal bf16 operands for zero
// (AMX, vdpbf16ps and oneDNN alike), so no product shows a packer that flushes the denormals
// the narrowed copy keeps (as the conversion instructions do, kernels/gemm/avx512/pack_pairs.h);
// the panels do. Every row count and depth around the panel and pair edges, B stored by k and
// by row, all-denormal stretches among the specials.
void expect_float_panels(const gemm::KernelSpec& s, Rng& rng) {
    for (const bool k_contiguous : {true, false}) {
        for (const auto& [rn, kc] :
             {std::pair{1, 1}, std::pair{31, 33}, std::pair{32, 64}, std::pair{45, 77}}) {
            SCOPED_TRACE(::testing::Message()
                         << rn << " rows, depth " << kc << (k_contiguous ? " by k" : " by row"));
            const int ld         = (k_contiguous ? kc : rn) + 5;
            std::vector<float> B = float_operand(rng, size_t(k_contiguous ? rn : kc) * ld);
            for (size_t i = 0; i < B.size(); i += 97) {  // 40 denormals in a row
                for (size_t j = i; j < std::min(B.size(), i + 40); ++j)
                    B[j] = (j % 2 ? -1.0f : 1.0f) * 1e-39f * float(1 + j % 7);
            }
            const std::vector<bf16> B16 = narrowed(B);
            // the panels, then slack the packers may write past them
            const size_t bytes = size_t((rn + s.nr - 1) / s.nr) * size_t(s.nr) *
                                 size_t((kc + s.kstep - 1) / s.kstep * s.kstep) *
                                 size_t(s.elem_bytes);
            std::vector<unsigned char> want(bytes + 4096, 0xa5), got(bytes + 4096, 0xa5);
            s.pack_b(gemm::PackSrc{B16.data(), ld, k_contiguous}, 0, rn, 0, kc, want.data());
            s.pack_b_f32(gemm::PackSrc{B.data(), ld, k_contiguous}, 0, rn, 0, kc, got.data());
            EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0);
        }
    }
}

TEST(GemmFloatB, PanelsAreThoseOfTheNarrowedCopy) {
    Rng rng(33);
    const int ran =
        on_float_b_paths([&] { expect_float_panels(gemm::bf16_spec(gemm::active_path()), rng); });
    if (ran == 0) GTEST_SKIP() << "needs AVX2 (a bf16 GEMM kernel that packs floats)";
}

// The kernels that widen bf16 to float round a float B as they pack it as well: AVX2's, and
// AVX-512's without AVX512_BF16, which a CPU with AVX512_BF16 does not pick for its path, so
// its packers are checked here directly wherever the CPU has AVX-512.
TEST(GemmFloatB, WideningKernelsPanelsAreThoseOfTheNarrowedCopy) {
    Rng rng(34);
    int ran = 0;
    if (gemm::path_supported(gemm::Path::avx2)) {
        SCOPED_TRACE("avx2 bf16_kernel");
        ASSERT_NE(gemm::avx2::bf16_kernel().pack_b_f32, nullptr);
        expect_float_panels(gemm::avx2::bf16_kernel(), rng);
        ++ran;
    }
    if (gemm::path_supported(gemm::Path::avx512)) {
        SCOPED_TRACE("avx512 bf16_kernel (widening)");
        ASSERT_NE(gemm::avx512::bf16_kernel().pack_b_f32, nullptr);
        expect_float_panels(gemm::avx512::bf16_kernel(), rng);
        ++ran;
    }
    if (ran == 0) GTEST_SKIP() << "needs AVX2 (the widening bf16 kernels)";
}

TEST(GemmFloatB, GroupedFormPacksTheFloatsAsTheirNarrowedCopy) {
    Rng rng(32);
    const int ran = on_float_b_paths([&] {
        const std::vector<int32_t> offsets = {0, 0, 7, 40, 41, 91};  // groups of 0, 7, 33, 1, 50
        const int G = 5, R = offsets.back();
        for (const auto& [N, K] : {std::pair{70, 401}, std::pair{33, 29}}) {
            for (const Trans tb : {Trans::T, Trans::N}) {
                for (const bool gather : {false, true}) {
                    SCOPED_TRACE(::testing::Message()
                                 << N << "x" << K << (tb == Trans::T ? " NT" : " NN")
                                 << (gather ? " gathered" : ""));
                    const int ldb               = (tb == Trans::T ? K : N) + 3;
                    const size_t stride_b       = size_t(tb == Trans::T ? N : K) * size_t(ldb) + 5;
                    const std::vector<float> B  = float_operand(rng, size_t(G) * stride_b);
                    const std::vector<bf16> B16 = narrowed(B);
                    const std::vector<bf16> A   = bf16_operand(rng, size_t(R) * size_t(K));
                    std::vector<int32_t> rows(static_cast<size_t>(R), 0);
                    for (int i = 0; i < R; ++i) rows[size_t(i)] = (i * 17) % R;
                    const int32_t* a_rows = gather ? rows.data() : nullptr;
                    std::vector<float> want(size_t(R) * size_t(N), 1.0f), got = want;
                    grouped_gemm_bf16(Trans::N, tb, G, offsets.data(), N, K, 1.0f, A.data(), K,
                                      B16.data(), ldb, stride_b, 0.0f, want.data(), N, a_rows);
                    grouped_gemm_bf16(Trans::N, tb, G, offsets.data(), N, K, 1.0f, A.data(), K,
                                      B.data(), ldb, stride_b, 0.0f, got.data(), N, a_rows);
                    EXPECT_TRUE(same_bits(got, want));
                }
            }
        }
    });
    if (ran == 0) GTEST_SKIP() << "needs AVX2 (a bf16 GEMM kernel that packs floats)";
}

}  // namespace
}  // namespace bagualu::kernels

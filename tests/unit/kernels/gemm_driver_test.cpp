// The packed driver with k pairs (kstep 2), the layout of the AVX-512 BF16 kernel, run here on any
// CPU: the real pair packer of gemm/pack.h and the shared micro-kernel template, with a scalar
// stand-in for vdpbf16ps. Checks padding of odd K, edge tiles and the driver's K blocking.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/gemm/driver.h"
#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/pack.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels::gemm {
namespace {

// A 4-lane register; as a B or A operand each lane holds a (k, k + 1) pair of bf16 bits.
struct Reg {
    float f[4];
};

struct PairOps {
    using reg                  = Reg;
    using packed_t             = bf16;
    static constexpr int width = 4;
    static constexpr int kstep = 2;
    static reg zero() { return reg{}; }
    static reg load_b(const bf16* p) {
        reg r;
        std::memcpy(r.f, p, sizeof r.f);
        return r;
    }
    static reg bcast_a(const bf16* p) {
        float pair;
        std::memcpy(&pair, p, sizeof pair);
        return reg{{pair, pair, pair, pair}};
    }
    // acc += a.hi * b.hi, then += a.lo * b.lo, each rounded, as vdpbf16ps does.
    static reg madd(reg acc, reg a, reg b) {
        for (int l = 0; l < width; ++l) {
            const uint32_t x = std::bit_cast<uint32_t>(a.f[l]), y = std::bit_cast<uint32_t>(b.f[l]);
            acc.f[l] += bf16_to_float(bf16(x >> 16)) * bf16_to_float(bf16(y >> 16));
            acc.f[l] += bf16_to_float(bf16(x & 0xffff)) * bf16_to_float(bf16(y & 0xffff));
        }
        return acc;
    }
    static reg set1(float x) { return reg{{x, x, x, x}}; }
    static reg mul(reg a, reg b) {
        for (int l = 0; l < width; ++l) a.f[l] *= b.f[l];
        return a;
    }
    static reg loadu(const float* p) { return reg{{p[0], p[1], p[2], p[3]}}; }
    static void storeu(float* p, reg x) { std::memcpy(p, x.f, sizeof x.f); }
    static reg fmadd(reg a, reg b, reg c) {
        for (int l = 0; l < width; ++l) c.f[l] += a.f[l] * b.f[l];
        return c;
    }
    static float fmadd_scalar(float a, float b, float c) { return a * b + c; }
};

constexpr int kMR = 3, kNV = 2, kNR = kNV * PairOps::width;

template <int R>
void pack_pairs(PackSrc src, int r0, int rn, int p0, int kc, void* dst) {
    pack_panels<R, 2, bf16, bf16>(src, r0, rn, p0, kc, static_cast<bf16*>(dst));
}

// Small blocks so that every loop of the driver runs several times, including odd K blocks.
constexpr KernelSpec kPairSpec{
    kMR, kNR, 2, 2, 9, 10, 24, pack_pairs<kMR>, pack_pairs<kNR>, micro_tile<PairOps, kMR, kNV>};

TEST(GemmDriver, BF16PairLayoutMatchesReference) {
    Rng rng(7);
    for (int t = 0; t < 40; ++t) {
        const Trans ta = (t & 1) ? Trans::T : Trans::N, tb = (t & 2) ? Trans::T : Trans::N;
        const int M = 1 + int(rng.below(40)), N = 1 + int(rng.below(60)),
                  K   = 1 + int(rng.below(45));
        const int lda = (ta == Trans::N ? K : M) + 1, ldb = (tb == Trans::N ? N : K) + 2;
        const int ldc = N + 3;
        std::vector<bf16> A(size_t((ta == Trans::N ? M : K) * lda));
        std::vector<bf16> B(size_t((tb == Trans::N ? K : N) * ldb));
        std::vector<float> C(size_t(M * ldc));
        for (bf16& x : A) x = bf16_from_float(float(rng.uniform() * 2 - 1));
        for (bf16& x : B) x = bf16_from_float(float(rng.uniform() * 2 - 1));
        for (float& x : C) x = float(rng.uniform());
        std::vector<float> want = C;
        const float beta        = (t % 3 == 0) ? 0.0f : 0.5f;
        ref::gemm_bf16(ta, tb, M, N, K, 1.25f, A.data(), lda, B.data(), ldb, beta, want.data(),
                       ldc);
        gemm_packed(kPairSpec, ta, tb, M, N, K, 1.25f, A.data(), lda, B.data(), ldb, beta, C.data(),
                    ldc);
        // Same bound as gemm_test.cpp: (K + 4) u times the magnitude, here at most |alpha| K + 1.
        const double tol = (K + 4) * std::ldexp(1.0, -24) * (1.25 * K + 1.0);
        for (int i = 0; i < M; ++i) {
            for (int j = 0; j < N; ++j) {
                const size_t k = size_t(i * ldc + j);
                ASSERT_NEAR(C[k], want[k], tol) << "t=" << t << " M=" << M << " N=" << N
                                                << " K=" << K << " at " << i << "," << j;
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::kernels::gemm

// AVX2 + FMA GEMM kernels: a 6 x 16 float tile (12 ymm accumulators, 2 B loads and 6
// broadcasts per k), with the packers of avx2/pack.h. bf16 inputs are widened to float while
// packing and use the same float kernel (AVX2 has no bf16 arithmetic); a float B (the weights)
// is rounded to bf16 as it is packed, so that no narrowed copy of it is made. Blocks for 32 KiB L1
// and 512 KiB L2 (Zen 3): a 256 x 16 B micro-panel (16 KiB) stays in L1, a 144 x 256 A block in L2.
#include "kernels/gemm/kernels.h"

#include <immintrin.h>

#include "kernels/gemm/avx2/pack.h"
#include "kernels/gemm/microkernel.h"

namespace bagualu::kernels::gemm::avx2 {

namespace {

struct OpsF32 {
    using reg                  = __m256;
    using packed_t             = float;
    static constexpr int width = 8;
    static constexpr int kstep = 1;
    static reg zero() { return _mm256_setzero_ps(); }
    static reg load_b(const float* p) { return _mm256_load_ps(p); }
    static reg bcast_a(const float* p) { return _mm256_broadcast_ss(p); }
    static reg madd(reg acc, reg a, reg b) { return _mm256_fmadd_ps(a, b, acc); }
    static reg set1(float x) { return _mm256_set1_ps(x); }
    static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
    static reg loadu(const float* p) { return _mm256_loadu_ps(p); }
    static void storeu(float* p, reg x) { _mm256_storeu_ps(p, x); }
    static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static float fmadd_scalar(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
};

constexpr int kMR = 6;
constexpr int kNV = 2;
constexpr int kNR = kNV * OpsF32::width;

template <int R, typename Src>
void pack(PackSrc src, int r0, int rn, int p0, int kc, void* dst) {
    pack_panels_f32<R, Src>(src, r0, rn, p0, kc, static_cast<float*>(dst));
}

constexpr KernelSpec kF32 =
    float_kernel_spec<OpsF32, kMR, kNV>(144, 256, 4096, pack<kMR, float>, pack<kNR, float>);
constexpr KernelSpec kBf16 = [] {
    KernelSpec s{kMR,
                 kNR,
                 1,
                 4,
                 144,
                 256,
                 4096,
                 pack<kMR, bf16>,
                 pack<kNR, bf16>,
                 micro_tile<OpsF32, kMR, kNV>,
                 nullptr,
                 pack<kNR, F32AsBf16>};
    s.pack_b_f32_rows = true;
    return s;
}();

}  // namespace

const KernelSpec& f32_kernel() { return kF32; }
const KernelSpec& bf16_kernel() { return kBf16; }

}  // namespace bagualu::kernels::gemm::avx2

// AVX-512 GEMM kernels: a 12 x 32 float tile (24 zmm accumulators) with FMA, and the same tile
// for bf16 with AVX512_BF16 vdpbf16ps, which multiplies pairs of k at once: packed panels hold
// (k, k + 1) pairs side by side and an odd K is padded with a zero. Without AVX512_BF16, bf16
// inputs are widened to float while packing and use the float tile.
#include "kernels/gemm/kernels.h"

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/gemm/avx2/pack.h"
#include "kernels/gemm/avx512/pack_pairs.h"
#include "kernels/gemm/microkernel.h"

namespace bagualu::kernels::gemm::avx512 {

namespace {

struct OpsF32 {
    using reg                  = __m512;
    using packed_t             = float;
    static constexpr int width = 16;
    static constexpr int kstep = 1;
    static reg zero() { return _mm512_setzero_ps(); }
    static reg load_b(const float* p) { return _mm512_load_ps(p); }
    static reg bcast_a(const float* p) { return _mm512_set1_ps(*p); }
    static reg madd(reg acc, reg a, reg b) { return _mm512_fmadd_ps(a, b, acc); }
    static reg set1(float x) { return _mm512_set1_ps(x); }
    static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
    static reg loadu(const float* p) { return _mm512_loadu_ps(p); }
    static void storeu(float* p, reg x) { _mm512_storeu_ps(p, x); }
    static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    static float fmadd_scalar(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
};

// One 32-bit lane holds a (k, k + 1) pair of bf16; vdpbf16ps adds both products to the float
// accumulator lane.
struct OpsBf16Dot : OpsF32 {
    using packed_t             = bf16;
    static constexpr int kstep = 2;
    static reg load_b(const bf16* p) { return _mm512_load_ps(p); }
    static reg bcast_a(const bf16* p) {
        int32_t pair;
        __builtin_memcpy(&pair, p, sizeof pair);
        return _mm512_castsi512_ps(_mm512_set1_epi32(pair));
    }
    static reg madd(reg acc, reg a, reg b) {
        return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(a),
                                (__m512bh)_mm512_castps_si512(b));
    }
};

constexpr int kMR = 12;
constexpr int kNV = 2;
constexpr int kNR = kNV * OpsF32::width;

template <int R, typename Src>
void pack_f32(PackSrc src, int r0, int rn, int p0, int kc, void* dst) {
    avx2::pack_panels_f32<R, Src>(src, r0, rn, p0, kc, static_cast<float*>(dst));
}

template <int R, typename T = bf16>
void pack_pairs(PackSrc src, int r0, int rn, int p0, int kc, void* dst) {
    pack_pairs_avx512<R, T>(src, r0, rn, p0, kc, static_cast<bf16*>(dst));
}

constexpr KernelSpec kF32 =
    float_kernel_spec<OpsF32, kMR, kNV>(240, 192, 4096, pack_f32<kMR, float>, pack_f32<kNR, float>);
// Without AVX512_BF16: bf16 widened as it is packed, a float B rounded to bf16 as it is packed
// (as the AVX2 kernel's).
constexpr KernelSpec kBf16 = [] {
    KernelSpec s{kMR,
                 kNR,
                 1,
                 4,
                 240,
                 192,
                 4096,
                 pack_f32<kMR, bf16>,
                 pack_f32<kNR, bf16>,
                 micro_tile<OpsF32, kMR, kNV>,
                 nullptr,
                 pack_f32<kNR, avx2::F32AsBf16>};
    s.pack_b_f32_rows = true;
    return s;
}();
constexpr KernelSpec kBf16Dot = [] {
    KernelSpec s{kMR,
                 kNR,
                 2,
                 2,
                 240,
                 384,
                 4096,
                 pack_pairs<kMR>,
                 pack_pairs<kNR>,
                 micro_tile<OpsBf16Dot, kMR, kNV>,
                 nullptr,
                 pack_pairs<kNR, float>};
    return s;
}();

static_assert(kBf16Dot.kc <= kMaxPairK, "the pair packer's zero row covers one k block");

}  // namespace

const KernelSpec& f32_kernel() { return kF32; }
const KernelSpec& bf16_kernel() { return kBf16; }
const KernelSpec& bf16_dot_kernel() {
    // The tile order measured per CPU on bench-medium's products: on an Intel Xeon (one with AMX,
    // where this kernel runs only when asked for) row by row was 0.91x column by column (median);
    // on an AMD Zen 5 1.01-1.09x (median 1.02). So column by column where the CPU has AMX.
    static const KernelSpec s = [] {
        KernelSpec k         = kBf16Dot;
        k.column_tiles_outer = cpu_features().amx_bf16;
        return k;
    }();
    return s;
}

}  // namespace bagualu::kernels::gemm::avx512

// Portable GEMM kernels (no intrinsics): the shared micro-kernel over 4-float "vectors" held in
// plain arrays, a 4 x 8 tile the compiler maps to whatever SIMD the baseline target has. Used
// where neither AVX2 nor AVX-512 is available. Multiply and add round separately (no FMA).
#include "kernels/gemm/kernels.h"

#include "kernels/gemm/microkernel.h"
#include "kernels/gemm/pack.h"

namespace bagualu::kernels::gemm::generic {

namespace {

struct Vec4 {
    float v[4];
};

struct Ops {
    using reg                  = Vec4;
    using packed_t             = float;
    static constexpr int width = 4;
    static constexpr int kstep = 1;
    static reg zero() { return reg{}; }
    static reg load_b(const float* p) { return reg{{p[0], p[1], p[2], p[3]}}; }
    static reg bcast_a(const float* p) { return reg{{*p, *p, *p, *p}}; }
    static reg madd(reg acc, reg a, reg b) {
        for (int l = 0; l < width; ++l) acc.v[l] += a.v[l] * b.v[l];
        return acc;
    }
    static reg set1(float x) { return reg{{x, x, x, x}}; }
    static reg mul(reg a, reg b) {
        for (int l = 0; l < width; ++l) a.v[l] *= b.v[l];
        return a;
    }
    static reg loadu(const float* p) { return load_b(p); }
    static void storeu(float* p, reg x) {
        for (int l = 0; l < width; ++l) p[l] = x.v[l];
    }
    static reg fmadd(reg a, reg b, reg c) {
        for (int l = 0; l < width; ++l) c.v[l] += a.v[l] * b.v[l];
        return c;
    }
    static float fmadd_scalar(float a, float b, float c) { return a * b + c; }
};

constexpr int kMR = 4;
constexpr int kNV = 2;
constexpr int kNR = kNV * Ops::width;

template <int R, typename Src>
void pack(PackSrc src, int r0, int rn, int p0, int kc, void* dst) {
    pack_panels<R, 1, Src, float>(src, r0, rn, p0, kc, static_cast<float*>(dst));
}

constexpr KernelSpec kF32 =
    float_kernel_spec<Ops, kMR, kNV>(128, 256, 2048, pack<kMR, float>, pack<kNR, float>);
constexpr KernelSpec kBf16{
    kMR, kNR, 1, 4, 128, 256, 2048, pack<kMR, bf16>, pack<kNR, bf16>, micro_tile<Ops, kMR, kNV>};

}  // namespace

const KernelSpec& f32_kernel() { return kF32; }
const KernelSpec& bf16_kernel() { return kBf16; }

}  // namespace bagualu::kernels::gemm::generic

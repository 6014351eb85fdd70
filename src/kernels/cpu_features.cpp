// CPUID probing. __builtin_cpu_supports covers OS support (XCR0) for AVX and AVX-512 state;
// AVX512_BF16 is CPUID leaf 7, sub-leaf 1, EAX bit 5, which older compilers do not name.
#include "kernels/cpu_features.h"

#include <cpuid.h>

namespace bagualu::kernels {

namespace {

bool cpuid_avx512_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    return (eax >> 5) & 1u;
}

CpuFeatures probe() {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512   = f.avx2_fma && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && cpuid_avx512_bf16();
    return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = probe();
    return features;
}

}  // namespace bagualu::kernels

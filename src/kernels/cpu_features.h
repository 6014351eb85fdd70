// What the CPU we run on can execute, read once from CPUID (with OS support for the wider
// registers). Kernels use it to pick an implementation; nothing here is compiled for an ISA.
#pragma once

namespace bagualu::kernels {

struct CpuFeatures {
    bool avx2_fma    = false;  // AVX2 + FMA3
    bool avx512      = false;  // AVX-512 F, BW, VL, DQ (what our avx512/ files are built for)
    bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps), on top of avx512
};

const CpuFeatures& cpu_features();

}  // namespace bagualu::kernels

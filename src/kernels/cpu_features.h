// What the CPU we run on can execute, read once from CPUID (with OS support for the wider
// registers). Kernels use it to pick an implementation; nothing here is compiled for an ISA.
#pragma once
#include <cstddef>
#include <string>

namespace bagualu::kernels {

struct CpuFeatures {
    bool avx2_fma    = false;  // AVX2 + FMA3
    bool avx512      = false;  // AVX-512 F, BW, VL, DQ (what our avx512/ files are built for)
    bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps), on top of avx512
    bool avx512_fp16 = false;  // AVX512_FP16 (fp16 arithmetic), on top of avx512
    // AMX-TILE + AMX-BF16 in CPUID with the tile state enabled by the OS (XCR0 bits 17, 18).
    // Before a thread touches tiles, request_amx() must have succeeded once in the process.
    bool amx_bf16 = false;
    std::string model;  // the CPUID brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+"
};

const CpuFeatures& cpu_features();

// Data cache sizes in bytes: L1d and L2 of one core, L3 as the CPU reports it (shared). Read
// once: sysconf(_SC_LEVEL*_CACHE_SIZE), else CPUID leaf 4, else 32 KiB, 1 MiB and 8 MiB.
struct CacheSizes {
    size_t l1d = 0, l2 = 0, l3 = 0;
};
const CacheSizes& cache_sizes();

// Asks Linux for permission to use the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM), once per
// process; true when granted. False when the CPU or the kernel has no AMX.
bool request_amx();

// "avx512_bf16 amx_bf16 avx512_fp16": the 16-bit features present, space-separated ("" if none).
std::string half_precision_features();

}  // namespace bagualu::kernels

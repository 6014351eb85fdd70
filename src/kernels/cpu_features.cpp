// CPUID probing. __builtin_cpu_supports covers OS support (XCR0) for AVX and AVX-512 state;
// the newer features are read from CPUID directly, which older compilers do not name:
// AVX512_BF16 leaf 7 sub-leaf 1 EAX bit 5; AMX-BF16, AVX512_FP16, AMX-TILE leaf 7 sub-leaf 0
// EDX bits 22, 23, 24; the tile state is usable when XCR0 bits 17 and 18 are set.
#include "kernels/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace bagualu::kernels {

namespace {

bool cpuid_avx512_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    return (eax >> 5) & 1u;
}

unsigned cpuid7_edx() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return edx;
}

// XCR0 through xgetbv, when the OS has enabled it (CPUID.1:ECX.OSXSAVE, bit 27).
unsigned long long xcr0() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __cpuid(1, eax, ebx, ecx, edx);
    if (!((ecx >> 27) & 1u)) return 0;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}

std::string brand_string() {
    unsigned regs[12] = {};
    if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000004u) return "unknown";
    for (unsigned i = 0; i < 3; ++i) {
        __cpuid(0x80000002u + i, regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3]);
    }
    char buf[49] = {};
    std::memcpy(buf, regs, 48);
    std::string s(buf);
    const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
    return b == std::string::npos ? "unknown" : s.substr(b, e - b + 1);
}

CpuFeatures probe() {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512   = f.avx2_fma && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    f.avx512_bf16         = f.avx512 && cpuid_avx512_bf16();
    const unsigned edx    = cpuid7_edx();
    f.avx512_fp16         = f.avx512 && ((edx >> 23) & 1u);
    const bool tile_state = (xcr0() & (3ull << 17)) == (3ull << 17);
    f.amx_bf16            = ((edx >> 22) & 1u) && ((edx >> 24) & 1u) && tile_state;
    f.model               = brand_string();
    return f;
}

// CPUID leaf 4 (deterministic cache parameters): the size of the data or unified cache of
// `level`, 0 when the leaf or the level is absent.
size_t cpuid4_cache_bytes(unsigned level) {
    if (__get_cpuid_max(0, nullptr) < 4) return 0;
    for (unsigned i = 0; i < 16; ++i) {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        __cpuid_count(4, i, eax, ebx, ecx, edx);
        const unsigned type = eax & 0x1fu;  // 0 none, 1 data, 2 instruction, 3 unified
        if (type == 0) break;
        if (type == 2 || ((eax >> 5) & 0x7u) != level) continue;
        const size_t ways = ((ebx >> 22) & 0x3ffu) + 1, parts = ((ebx >> 12) & 0x3ffu) + 1;
        const size_t line = (ebx & 0xfffu) + 1, sets = size_t(ecx) + 1;
        return ways * parts * line * sets;
    }
    return 0;
}

size_t cache_bytes(int sysconf_name, unsigned level, size_t fallback) {
    const long s = ::sysconf(sysconf_name);
    if (s > 0) return static_cast<size_t>(s);
    const size_t c = cpuid4_cache_bytes(level);
    return c > 0 ? c : fallback;
}

}  // namespace

const CacheSizes& cache_sizes() {
    static const CacheSizes sizes{cache_bytes(_SC_LEVEL1_DCACHE_SIZE, 1, size_t(32) << 10),
                                  cache_bytes(_SC_LEVEL2_CACHE_SIZE, 2, size_t(1) << 20),
                                  cache_bytes(_SC_LEVEL3_CACHE_SIZE, 3, size_t(8) << 20)};
    return sizes;
}

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = probe();
    return features;
}

bool request_amx() {
    static const bool granted = [] {
        if (!cpu_features().amx_bf16) return false;
        constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return granted;
}

std::string half_precision_features() {
    const CpuFeatures& f = cpu_features();
    std::string out;
    const auto add = [&](bool on, const char* name) {
        if (!on) return;
        if (!out.empty()) out += ' ';
        out += name;
    };
    add(f.avx512_bf16, "avx512_bf16");
    add(f.amx_bf16, "amx_bf16");
    add(f.avx512_fp16, "avx512_fp16");
    return out;
}

}  // namespace bagualu::kernels

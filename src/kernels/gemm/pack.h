// Portable packing of op(A) / op(B) blocks into the panel layout of driver.h, for any panel
// height R, k-interleave KS and element conversion (float -> float, bf16 -> float, bf16 -> bf16).
// Included by each ISA's kernels.cpp: everything here has internal linkage, so every ISA gets
// its own copy compiled with its own flags and the linker never mixes them.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm {
namespace {

template <typename Dst, typename Src>
inline Dst convert_elem(Src x) {
    if constexpr (std::is_same_v<Dst, float> && std::is_same_v<Src, bf16>) {
        return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
    } else {
        return static_cast<Dst>(x);
    }
}

// Rows [r0, r0 + rn) x k in [p0, p0 + kc) of op(X) -> panels (kcp / KS, R, KS), zero-padded.
template <int R, int KS, typename Src, typename Dst>
void pack_panels(PackSrc src, int r0, int rn, int p0, int kc, Dst* dst) {
    const int kcp = (kc + KS - 1) / KS * KS;
    for (int p = 0; p < rn; p += R) {
        const int rows = std::min(R, rn - p);
        Dst* d         = dst + size_t(p) * size_t(kcp);
        if (src.k_contiguous) {
            for (int r = 0; r < rows; ++r) {
                const Src* s = src.row<Src>(r0 + p + r) + size_t(p0);
                for (int k = 0; k < kc; ++k) {
                    d[(k / KS) * R * KS + r * KS + k % KS] = convert_elem<Dst>(s[k]);
                }
            }
        } else {
            for (int k = 0; k < kc; ++k) {
                const Src* s = src.row<Src>(p0 + k) + size_t(r0 + p);
                Dst* dk      = d + (k / KS) * R * KS + k % KS;
                for (int r = 0; r < rows; ++r) dk[r * KS] = convert_elem<Dst>(s[r]);
            }
        }
        for (int k = kc; k < kcp; ++k) {
            for (int r = 0; r < rows; ++r) d[(k / KS) * R * KS + r * KS + k % KS] = Dst{};
        }
        for (int g = 0; g < kcp / KS; ++g) {
            for (int i = rows * KS; i < R * KS; ++i) d[g * R * KS + i] = Dst{};
        }
    }
}

}  // namespace
}  // namespace bagualu::kernels::gemm

// GEMM through oneDNN's matmul primitive (FP32, and BF16 inputs with FP32 output), run on our
// compute pool: C is cut into one static slice per pool thread (rows, or columns when C is wide)
// and every thread executes a single-threaded primitive on its slice. oneDNN's own OpenMP
// threads are never started this way, so nothing spins against our pinned workers; where the
// CPU has AMX, oneDNN picks its AMX kernels (brg:avx512_core_amx_bf16) by itself. Side effect:
// the OpenMP thread count (a per-thread setting) of every thread that ran a call stays 1.
// Primitives are created once per (slice shape, strides, alpha, beta) and kept in a bounded,
// thread-safe cache. For a fixed thread count the slices are fixed, so results are bitwise the
// same run to run; they differ from our kernels' (another summation order).
#pragma once
#include <cstddef>
#include <string>

#include "kernels/gemm.h"

namespace bagualu::kernels::gemm::onednn {

// True when oneDNN has a native (non-reference) matmul for FP32 on this CPU.
bool available();
// True when oneDNN has a native BF16 matmul on this CPU (AVX512_BF16 or AMX).
bool bf16_available();

// Same contract as kernels::gemm_f32 / gemm_bf16 (kernels/gemm.h).
void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);
void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc);

// "2.6.3": the oneDNN library loaded.
std::string version();
// The implementation oneDNN picks for a single-threaded matmul of this kind, e.g.
// "brg:avx512_core_amx_bf16" ("" when it cannot create one).
std::string impl_name(bool bf16, int M, int N, int K);

// Primitives held now, and the most the cache keeps (least recently used ones go first).
size_t cache_entries();
inline constexpr size_t kCacheCapacity = 256;

}  // namespace bagualu::kernels::gemm::onednn

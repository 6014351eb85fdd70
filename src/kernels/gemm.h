// GEMM, row-major. The only matrix-multiply entry points the rest of the code uses.
//   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
// op(X) is X or X^T. lda/ldb/ldc are row strides (elements) of A, B and C as stored.
// When beta == 0, C is not read (it may hold NaN). Runs on the compute pool, so call it from
// outside pool jobs (not inside parallel_for).
// The implementation is chosen once at run time from the CPU, or forced with the environment
// variable BGL_GEMM=ref|generic|avx2|avx512|openblas|onednn|auto (see gemm/dispatch.h and
// gemm_backend_name()). Results of ours do not depend on the thread count; onednn and auto give
// bitwise-equal results for a fixed thread count (and, for auto, a fixed choice table).
#pragma once
#include <string>

#include "core/dtype.h"

namespace bagualu::kernels {

enum class Trans { N, T };

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

// A and B in bf16, C in float; products are accumulated in float32.
void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc);

// Whether the active implementation's bf16 kernel packs a float B itself, rounding each value to
// bf16 as it packs (ours but the generic one: AVX2, AVX-512, AMX; not under auto or onednn),
// so that the overload below can run.
bool gemm_bf16_float_b();
// gemm_bf16 with B in float32, each value rounded to bf16 (bf16_from_float) as it is packed:
// bitwise gemm_bf16 on B's narrowed copy, without writing and reading the copy (B is packed
// about once per product: the weights of kernels/mixed.h's linear layers). Only where
// gemm_bf16_float_b().
void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
// Whether a float B stored by row (tb = N: the weights of the backward dy·W products) is best
// packed from its floats too, rather than narrowed to a 16-bit copy first: where the bf16
// kernel says so (KernelSpec::pack_b_f32_rows: the AMX one, faster there, and those that widen
// bf16 to float, which copy B's rows either way; not AVX512_BF16's, docs/results.md). For
// B stored by k packing from the floats is always the faster, wherever gemm_bf16_float_b().
bool gemm_bf16_float_b_rows();

// Whether gemm_bf16 on the active implementation widens its operands to float and runs the
// float kernel: always on AVX2 and the generic and reference kernels, with OpenBLAS, and on
// AVX-512 without AVX512_BF16 (and under onednn/auto when oneDNN has no native bf16 matmul on
// this CPU). Then gemm_f32 on float arrays that hold bf16 values computes the same exact
// products in float32, without converting to 16 bits first (on our kernels and OpenBLAS,
// bitwise the same result: the widening kernels share the float kernel's blocking). False where
// 16-bit operands have arithmetic of their own (AVX512_BF16 dot products, oneDNN on
// AVX512_BF16 or AMX).
bool gemm_bf16_widens();
// Name of the implementation gemm_f32/gemm_bf16 dispatch to ("avx512", "avx2", "generic",
// "ref", "openblas", "onednn" or "auto").
std::string gemm_backend_name();

}  // namespace bagualu::kernels

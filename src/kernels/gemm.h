// GEMM for float32, row-major. The only matrix-multiply entry point the rest of the code uses.
//   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
// op(X) is X or X^T. lda/ldb/ldc are row strides (elements) of A, B and C as stored.
// When beta == 0, C is not read (it may hold NaN).
// The implementation is chosen once at run time (see gemm_backend_name()).
#pragma once
#include <string>

namespace bagualu::kernels {

enum class Trans { N, T };

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

// Name of the implementation gemm_f32 dispatches to ("openblas", "avx512", ...).
std::string gemm_backend_name();

}  // namespace bagualu::kernels

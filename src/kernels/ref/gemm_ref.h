// Reference GEMM: three plain loops with double accumulation. The oracle the packed kernels are
// tested against, and the BGL_GEMM=ref path. Same contract as kernels/gemm.h; slow on purpose.
#pragma once
#include "kernels/gemm.h"

namespace bagualu::kernels::ref {

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc);

}  // namespace bagualu::kernels::ref

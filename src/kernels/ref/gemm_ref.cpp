// Reference GEMM: C = alpha * op(A) op(B) + beta * C, every sum in double, rounded once.
#include "kernels/ref/gemm_ref.h"

#include <cstddef>

namespace bagualu::kernels::ref {

namespace {

inline double to_double(float x) { return x; }
inline double to_double(bf16 x) { return bf16_to_float(x); }

template <typename T>
void gemm_any(Trans ta, Trans tb, int M, int N, int K, float alpha, const T* A, int lda, const T* B,
              int ldb, float beta, float* C, int ldc) {
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double sum = 0.0;
            for (int k = 0; k < K; ++k) {
                const size_t ia = ta == Trans::N ? size_t(i) * size_t(lda) + size_t(k)
                                                 : size_t(k) * size_t(lda) + size_t(i);
                const size_t ib = tb == Trans::N ? size_t(k) * size_t(ldb) + size_t(j)
                                                 : size_t(j) * size_t(ldb) + size_t(k);
                sum += to_double(A[ia]) * to_double(B[ib]);
            }
            float& c         = C[size_t(i) * size_t(ldc) + size_t(j)];
            const double out = double(alpha) * sum + (beta == 0.0f ? 0.0 : double(beta) * c);
            c                = static_cast<float>(out);
        }
    }
}

}  // namespace

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
    gemm_any(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc) {
    gemm_any(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace bagualu::kernels::ref

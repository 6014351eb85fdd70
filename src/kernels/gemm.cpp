// gemm_f32 dispatch. Until the packed kernels land, every call goes to OpenBLAS.
#include "kernels/gemm.h"

#include <cblas.h>

#include "core/thread_pool.h"

namespace bagualu::kernels {

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    static const int threads = [] {
        int n = compute_pool().size();
        openblas_set_num_threads(n);
        return n;
    }();
    (void)threads;
    cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans,
                tb == Trans::T ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta,
                C, ldc);
}

std::string gemm_backend_name() { return "openblas"; }

}  // namespace bagualu::kernels

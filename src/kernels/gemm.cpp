// gemm_f32 / gemm_bf16 entry points and the choice of implementation (see gemm/dispatch.h).
// Ours are the packed kernels of gemm/ (avx512, avx2, generic) and the naive ref/; "openblas"
// calls cblas_sgemm (and cblas_sbgemm for bf16).
#include "kernels/gemm.h"

#include <cblas.h>

#include <atomic>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/gemm/kernels.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels {

namespace gemm {

namespace {

constexpr Path kAllPaths[] = {Path::ref, Path::generic, Path::avx2, Path::avx512,
                              Path::openblas};

Path initial_path() {
    const char* env = std::getenv("BGL_GEMM");
    if (env == nullptr || *env == '\0') return best_path();
    for (Path p : kAllPaths) {
        if (std::string_view(env) == path_name(p)) {
            if (!path_supported(p)) input_error("BGL_GEMM={}: not supported on this CPU", env);
            return p;
        }
    }
    input_error("BGL_GEMM={}: expected ref, generic, avx2, avx512 or openblas", env);
}

std::atomic<Path>& path_slot() {
    static std::atomic<Path> slot{initial_path()};
    return slot;
}

void openblas_threads() {
    static const bool once = [] {
        openblas_set_num_threads(compute_pool().size());
        return true;
    }();
    (void)once;
}

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::T ? CblasTrans : CblasNoTrans; }

// The OpenBLAS we link has no bf16 GEMM (cblas_sbgemm needs a BUILD_BFLOAT16 build), so the
// inputs are widened into grow-only float copies and multiplied with cblas_sgemm.
void openblas_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                   const bf16* B, int ldb, float beta, float* C, int ldc) {
    thread_local std::vector<float> a32, b32;
    // rows x cols stored with stride ld; the last row may end at its last column.
    const auto widen = [](std::vector<float>& dst, const bf16* src, int rows, int cols, int ld) {
        const size_t n = rows == 0 ? 0 : size_t(rows - 1) * size_t(ld) + size_t(cols);
        if (dst.size() < n + 1) dst.resize(n + 1);
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
    };
    widen(a32, A, ta == Trans::N ? M : K, ta == Trans::N ? K : M, lda);
    widen(b32, B, tb == Trans::N ? K : N, tb == Trans::N ? N : K, ldb);
    openblas_threads();
    cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, a32.data(), lda,
                b32.data(), ldb, beta, C, ldc);
}

const KernelSpec& bf16_spec(Path p) {
    switch (p) {
        case Path::avx512:
            return cpu_features().avx512_bf16 ? avx512::bf16_dot_kernel() : avx512::bf16_kernel();
        case Path::avx2: return avx2::bf16_kernel();
        default: return generic::bf16_kernel();
    }
}

}  // namespace

const KernelSpec& f32_spec(Path p) {
    switch (p) {
        case Path::avx512: return avx512::f32_kernel();
        case Path::avx2: return avx2::f32_kernel();
        default: return generic::f32_kernel();
    }
}

const char* path_name(Path p) {
    switch (p) {
        case Path::ref: return "ref";
        case Path::generic: return "generic";
        case Path::avx2: return "avx2";
        case Path::avx512: return "avx512";
        case Path::openblas: return "openblas";
    }
    return "?";
}

bool path_supported(Path p) {
    switch (p) {
        case Path::avx2: return cpu_features().avx2_fma;
        case Path::avx512: return cpu_features().avx512;
        default: return true;
    }
}

Path best_path() {
    if (path_supported(Path::avx512)) return Path::avx512;
    if (path_supported(Path::avx2)) return Path::avx2;
    return Path::generic;
}

Path active_path() { return path_slot().load(std::memory_order_relaxed); }

void set_active_path(Path p) {
    BGL_CHECK(path_supported(p), "gemm path {} is not supported on this CPU", path_name(p));
    path_slot().store(p, std::memory_order_relaxed);
}

}  // namespace gemm

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref) {
        ref::gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else if (p == gemm::Path::openblas) {
        gemm::openblas_threads();
        cblas_sgemm(CblasRowMajor, gemm::cblas_trans(ta), gemm::cblas_trans(tb), M, N, K, alpha,
                    A, lda, B, ldb, beta, C, ldc);
    } else {
        gemm::gemm_packed(gemm::f32_spec(p), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                          ldc);
    }
}

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref) {
        ref::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else if (p == gemm::Path::openblas) {
        gemm::openblas_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        gemm::gemm_packed(gemm::bf16_spec(p), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                          ldc);
    }
}

std::string gemm_backend_name() { return gemm::path_name(gemm::active_path()); }

}  // namespace bagualu::kernels

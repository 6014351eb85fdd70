// gemm_f32 / gemm_bf16 entry points and the choice of implementation (see gemm/dispatch.h).
// Ours are the packed kernels of gemm/ (avx512, avx2, generic) and the naive ref/; "openblas"
// calls cblas_sgemm (and cblas_sbgemm for bf16); "onednn" runs oneDNN's matmul on our pool
// (gemm/onednn.h); "auto" picks per shape between the best of ours and oneDNN (gemm/choice.h).
#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/function_ref.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/choice.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/gemm/kernels.h"
#include "kernels/gemm/onednn.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels {

namespace gemm {

namespace {

constexpr Path kAllPaths[] = {Path::ref, Path::generic,  Path::avx2,   Path::avx512,
                              Path::amx, Path::openblas, Path::onednn, Path::automatic};

Path initial_path() {
    const char* env = std::getenv("BGL_GEMM");
    if (env == nullptr || *env == '\0') return best_path();
    if (const std::optional<Path> p = path_of_name(env)) {
        if (!path_supported(*p)) input_error("BGL_GEMM={}: not supported on this CPU", env);
        return *p;
    }
    input_error("BGL_GEMM={}: expected ref, generic, avx2, avx512, amx, openblas, onednn or auto",
                env);
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

}  // namespace

const KernelSpec& bf16_spec(Path p) {
    switch (p) {
        case Path::amx:
            return avx512::bf16_amx_kernel();
        case Path::avx512:
            return cpu_features().avx512_bf16 ? avx512::bf16_dot_kernel() : avx512::bf16_kernel();
        case Path::avx2:
            return avx2::bf16_kernel();
        default:
            return generic::bf16_kernel();
    }
}

const KernelSpec& f32_spec(Path p) {
    switch (p) {
        case Path::avx512:
        case Path::amx:
            return avx512::f32_kernel();
        case Path::avx2:
            return avx2::f32_kernel();
        default:
            return generic::f32_kernel();
    }
}

const char* path_name(Path p) {
    switch (p) {
        case Path::ref:
            return "ref";
        case Path::generic:
            return "generic";
        case Path::avx2:
            return "avx2";
        case Path::avx512:
            return "avx512";
        case Path::amx:
            return "amx";
        case Path::openblas:
            return "openblas";
        case Path::onednn:
            return "onednn";
        case Path::automatic:
            return "auto";
    }
    return "?";
}

std::optional<Path> path_of_name(std::string_view name) {
    for (Path p : kAllPaths) {
        if (name == path_name(p)) return p;
    }
    return std::nullopt;
}

PackingBound packing_bound(Path path, const CacheSizes& caches, int threads, int max_m, int max_n,
                           int max_k, bool bf16, PackDriver driver,
                           std::optional<bool> avx512_bf16) {
    const bool grouped = driver != PackDriver::packed;
    if (path == Path::automatic || (grouped && path == Path::onednn)) path = best_path();
    std::vector<const KernelSpec*> specs;
    switch (path) {
        case Path::ref:
        case Path::openblas:
        case Path::onednn:
            return {};
        case Path::avx512:  // the 16-bit kernel is one of two, by the CPU's AVX512_BF16
            specs = {&avx512::f32_kernel()};
            if (bf16 && avx512_bf16) {
                specs = {*avx512_bf16 ? &avx512::bf16_dot_kernel() : &avx512::bf16_kernel()};
            } else if (bf16) {
                specs = {&avx512::bf16_kernel(), &avx512::bf16_dot_kernel()};
            }
            break;
        default:
            specs = {bf16 ? &bf16_spec(path) : &f32_spec(path)};
    }
    PackingBound out;
    for (const KernelSpec* s : specs) {
        KernelSpec spec = *s;
        if (bf16 && driver == PackDriver::grouped_tn) spec.kc = f32_spec(path).kc;
        out.join(packing_bound(spec, caches, threads, max_m, max_n, max_k, driver));
    }
    return out;
}

bool path_supported(Path p) {
    switch (p) {
        case Path::avx2:
            return cpu_features().avx2_fma;
        case Path::avx512:
            return cpu_features().avx512;
        case Path::amx:
            // the packers of the tiles' operands are AVX-512 (BW, VL)
            return cpu_features().avx512 && cpu_features().amx_bf16 && request_amx();
        case Path::onednn:
            return onednn::available();  // auto: ours where oneDNN is not
        default:
            return true;
    }
}

Path best_path() {
    if (path_supported(Path::amx)) return Path::amx;
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

namespace gemm {

namespace {

void f32_on(Path p, Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
    if (p == Path::ref) {
        ref::gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else if (p == Path::openblas) {
        openblas_threads();
        cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
    } else if (p == Path::onednn) {
        onednn::gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        gemm_packed(f32_spec(p), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

void bf16_on(Path p, Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
             const bf16* B, int ldb, float beta, float* C, int ldc) {
    if (p == Path::ref) {
        ref::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else if (p == Path::openblas) {
        openblas_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else if (p == Path::onednn && onednn::bf16_available()) {
        onednn::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        // onednn without a native bf16 matmul on this CPU: the best of ours.
        const Path q = p == Path::onednn ? best_path() : p;
        gemm_packed(bf16_spec(q), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

// BGL_GEMM=auto: the recorded choice for this shape, or the faster of the best of ours and
// oneDNN, each timed on the real operands into a scratch C (one warm-up call, then up to three
// timed; only one when a call takes over 0.1 s), recorded for the rest of the process.
Path choose(const GemmKey& key, FunctionRef<void(Path, float*, int)> run) {
    if (const std::optional<Path> p = choice_table().find(key)) return *p;
    const Path ours = best_path();
    Path best       = ours;
    if (key.bf16 ? onednn::bf16_available() : onednn::available()) {
        std::vector<float> scratch(size_t(key.m) * size_t(key.n), 0.0f);
        const auto seconds = [&](Path p) {
            using clock     = std::chrono::steady_clock;
            const auto call = [&] {
                const auto t0 = clock::now();
                run(p, scratch.data(), key.n);
                return std::chrono::duration<double>(clock::now() - t0).count();
            };
            const double first = call();
            if (first > 0.1) return first;
            double fastest = std::numeric_limits<double>::infinity();
            for (int r = 0; r < 3; ++r) fastest = std::min(fastest, call());
            return fastest;
        };
        if (seconds(Path::onednn) < seconds(ours)) best = Path::onednn;
    }
    choice_table().set(key, best);
    return best;
}

}  // namespace

}  // namespace gemm

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    gemm::Path p = gemm::active_path();
    if (p == gemm::Path::automatic) {
        p = gemm::choose({false, ta, tb, M, N, K}, [&](gemm::Path q, float* c, int ldc_q) {
            gemm::f32_on(q, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, c, ldc_q);
        });
    }
    gemm::f32_on(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    gemm::Path p = gemm::active_path();
    if (p == gemm::Path::automatic) {
        p = gemm::choose({true, ta, tb, M, N, K}, [&](gemm::Path q, float* c, int ldc_q) {
            gemm::bf16_on(q, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, c, ldc_q);
        });
    }
    gemm::bf16_on(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool gemm_bf16_float_b() {
    const gemm::Path p = gemm::active_path();
    return (p == gemm::Path::generic || p == gemm::Path::avx2 || p == gemm::Path::avx512 ||
            p == gemm::Path::amx) &&
           gemm::bf16_spec(p).pack_b_f32 != nullptr;
}

bool gemm_bf16_float_b_rows() {
    return gemm_bf16_float_b() && gemm::bf16_spec(gemm::active_path()).pack_b_f32_rows;
}

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(gemm_bf16_float_b(),
              "gemm_bf16 with a float B on a path whose bf16 kernel cannot pack it");
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    gemm::KernelSpec s = gemm::bf16_spec(gemm::active_path());
    s.pack_b           = s.pack_b_f32;
    gemm::gemm_packed(s, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// Whether gemm_bf16 on path p widens its operands (gemm_bf16_widens).
bool widens_on(gemm::Path p) {
    switch (p) {
        case gemm::Path::ref:
        case gemm::Path::generic:
        case gemm::Path::avx2:
        case gemm::Path::openblas:
            return true;
        case gemm::Path::avx512:
            return !cpu_features().avx512_bf16;
        case gemm::Path::amx:
            return false;
        case gemm::Path::onednn:
        case gemm::Path::automatic:
            // gemm_bf16 runs oneDNN's native bf16 matmul, or the best of ours
            return !gemm::onednn::bf16_available() && widens_on(gemm::best_path());
    }
    return false;
}

}  // namespace

bool gemm_bf16_widens() { return widens_on(gemm::active_path()); }

std::string gemm_backend_name() { return gemm::path_name(gemm::active_path()); }

}  // namespace bagualu::kernels

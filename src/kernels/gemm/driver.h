// Packed, cache-blocked GEMM driver (Goto/BLIS loop nest) shared by every packed implementation.
// An implementation is a KernelSpec: register tile, cache blocks and three functions (pack A,
// pack B, micro-kernel) compiled for one ISA. The driver itself holds no ISA code: it splits C
// over M and N among the threads (never K), walks the NC/KC/MC blocks and calls
// the spec's functions. Every element of C is summed in the same order (k blocks of kc, in
// increasing k) for any thread count and whichever thread computes it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"

namespace bagualu::kernels::gemm {

// A packing source: element (r, k) of op(X) is X[r * ld + k] when k_contiguous, else
// X[k * ld + r]. data points to float or bf16, as the spec expects. With rows, the source is
// gathered: stored row i (r when k_contiguous, else k) is row rows[i] of data, so that a
// product can read the rows of a permutation in place (the experts' tokens, kernels/
// grouped_gemm.h) and pack them as it would the permuted copy.
struct PackSrc {
    const void* data;
    int ld;
    bool k_contiguous;
    const int32_t* rows = nullptr;

    // Stored row i, as T.
    template <typename T>
    const T* row(int i) const {
        const size_t r = rows ? static_cast<size_t>(rows[i]) : static_cast<size_t>(i);
        return static_cast<const T*>(data) + r * static_cast<size_t>(ld);
    }
};

// The most rows a register tile read in place by row (KernelSpec::micro_rows) may have.
inline constexpr int kMaxMicroRows = 32;

struct KernelSpec {
    int mr, nr;      // register tile (rows of A, columns of B)
    int kstep;       // k values interleaved per packed group: 1 (fp32) or 2 (bf16 pairs)
    int elem_bytes;  // size of one packed element
    int mc, kc, nc;  // cache blocks: mc % mr == 0, nc % nr == 0, kc % kstep == 0
    // Pack rows [r0, r0 + rn) x k in [p0, p0 + kc) of op(X) into ceil(rn / R) panels, each
    // (kcp / kstep, R, kstep) with kcp = kc rounded up to kstep, zero-padded; R is mr for A and
    // nr for B. May write up to kPackSlack bytes past the last panel.
    void (*pack_a)(PackSrc src, int r0, int rn, int p0, int kc, void* dst);
    void (*pack_b)(PackSrc src, int r0, int rn, int p0, int kc, void* dst);
    // C tile (m, n) = alpha * a-panel @ b-panel + beta * C, with m <= mr, n <= nr, kcp the padded
    // depth. beta == 0: C is not read.
    void (*micro)(int kcp, const void* a, const void* b, float* c, int ldc, float alpha, float beta,
                  int m, int n);
    // The same tile with A read where it lies, op(A) stored by k (element (i, k) at
    // a[k * lda + i], all mr rows readable), instead of from a packed panel: bitwise micro on
    // the packed rows (kstep 1 specs only, else nullptr).
    void (*micro_cols)(int kc, const float* a, int lda, const void* b, float* c, int ldc,
                       float alpha, float beta, int m, int n) = nullptr;
    // pack_b for a float op(B) whose values are rounded to the spec's 16-bit type as they are
    // packed: the panels pack_b makes of the narrowed copy (16-bit specs that have it, else
    // nullptr).
    void (*pack_b_f32)(PackSrc src, int r0, int rn, int p0, int kc, void* dst) = nullptr;
    // pack_b_f32 is the faster for an op(B) stored by row as well (for B stored by k it always
    // is): measured per kernel, docs/results.md (the AMX kernel; not AVX512_BF16's).
    bool pack_b_f32_rows = false;
    // The register tiles of a k block column by column (a B panel held in L1 while A's panels
    // stream) instead of row by row (driver.cpp for_tiles); measured per kernel, docs/results.md.
    bool column_tiles_outer = false;
    // Called by a thread before its first micro-kernel of a product and after its last (the
    // AMX kernel loads and releases its tile configuration), or nullptr.
    void (*enter)() = nullptr;
    void (*leave)() = nullptr;
    // The same tile with op(A) stored by row read where it lies, rows[i] pointing at row i's
    // first value of the k block (all mr rows readable), instead of from a packed panel: bitwise
    // micro on the packed rows (kstep 1 specs with mr <= kMaxMicroRows only, else nullptr).
    void (*micro_rows)(int kc, const float* const* rows, const void* b, float* c, int ldc,
                       float alpha, float beta, int m, int n) = nullptr;
    // The same tile with op(A) stored by row, not gathered, read where it lies in the spec's
    // element type: a points at row 0's first value of the k block, row i lies i * lda elements
    // on (all mr rows readable), and kc is a multiple of strided_k: bitwise micro on the packed
    // rows, for every tile of a product (16-bit specs whose A tiles load rows at any stride: AMX;
    // else nullptr).
    void (*micro_strided)(int kc, const void* a, int lda, const void* b, float* c, int ldc,
                          float alpha, float beta, int m, int n) = nullptr;
    int strided_k                                                = 0;
};

// enter() on construction, leave() on destruction, where the spec has them.
class KernelScope {
   public:
    explicit KernelScope(const KernelSpec& s) : s_(s) {
        if (s_.enter) s_.enter();
    }
    ~KernelScope() {
        if (s_.leave) s_.leave();
    }
    KernelScope(const KernelScope&)            = delete;
    KernelScope& operator=(const KernelScope&) = delete;

   private:
    const KernelSpec& s_;
};

inline constexpr int kPackSlack = 256;

// C = alpha * op(A) @ op(B) + beta * C with A and B of the element type spec's packers read.
// Units of C (column strip x row block) are cut into one range per thread; a thread takes the
// units of its own range, then helps in the others', so a thread slowed by other work on its core
// does not hold up the call, and each strip of op(B) is packed about once. With more than two
// threads a strip, a small op(B) is packed once by all of them together instead.
void gemm_packed(const KernelSpec& spec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                 const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc);

// The cache sizes gemm_packed blocks for (MC and the strip width NC; KC is the spec's): the
// CPU's (kernels/cpu_features.h) unless a test sets others; nullptr restores the CPU's. Not
// thread-safe: set it between GEMMs.
void set_blocking_caches(const CacheSizes* caches);

// Bytes of one k block of a strip's packed B that gemm_packed plans for: half of L2 (of the
// blocking caches above), clamped to [64 KiB, 2 MiB]. The grouped driver's strips use it too.
size_t b_slice_bytes();
// The driver a product runs on: gemm_packed, or the grouped driver's forward form (grouped_gemm
// and its bf16 forms, M the groups' rows, K the depth) or its weight-gradient form
// (grouped_gemm_tn, M x N the weight, K the rows), which reserve the largest unit gemm_rect can
// have.
enum class PackDriver { packed, grouped, grouped_tn };

// The most the packing buffers keep for products of at most max_m x max_n x max_k (M, N, K) on
// `threads` threads blocked for `caches`, in bytes as allocated (rounding and slack included):
// each thread that works on a product grows and keeps an A block and a B strip, and with more
// than two threads the calling thread may also keep the whole op(B) packed once for all
// (gemm_packed's shared-B case). Buffers are per thread and shared by every kind of product, so
// the bytes of several products are their bounds' component-wise maximum (join). For the
// planner's memory model (plan/footprint.h); tests hold it against pack_buffer_bytes().
struct PackingBound {
    size_t a = 0, b = 0;  // per thread
    size_t shared_b = 0;  // once, on the calling thread
    size_t total(int threads) const { return size_t(threads) * (a + b) + shared_b; }
    void join(const PackingBound& o) {
        a        = std::max(a, o.a);
        b        = std::max(b, o.b);
        shared_b = std::max(shared_b, o.shared_b);
    }
};
PackingBound packing_bound(const KernelSpec& spec, const CacheSizes& caches, int threads, int max_m,
                           int max_n, int max_k, PackDriver driver = PackDriver::packed);
// The same for the kernel a path runs the products on, its float kernel or (bf16) its bf16 one
// (the weight-gradient form's with the float kernel's depth block, as grouped_gemm_tn_bf16 runs
// it): on avx512, the AVX512_BF16 kernel or the widening one as avx512_bf16 says, the larger of
// the two where it is not known; zero for the paths that do not use our packed kernels (ref,
// openblas, onednn; the grouped products run ours under onednn). `auto` counts as the best of
// ours on this CPU.
PackingBound packing_bound(Path path, const CacheSizes& caches, int threads, int max_m, int max_n,
                           int max_k, bool bf16, PackDriver driver = PackDriver::packed,
                           std::optional<bool> avx512_bf16 = std::nullopt);
// Bytes every thread's packing buffers hold now (a thread's are freed when it exits).
size_t pack_buffer_bytes();

// Whether gemm_packed with this many threads gives each thread a run of row blocks over every
// strip rather than a run of strips (where a thread's share of a row of C is under a page; the
// sums are the same either way). For tests.
bool ranges_by_rows(const KernelSpec& spec, int M, int N, int K, int threads);

// C = beta * C (C = 0 when beta == 0, without reading C): the K == 0 or alpha == 0 case.
void scale_c(int M, int N, float beta, float* C, int ldc);

// ---- pieces of the grouped driver (gemm/grouped.cpp) ----

// The widest strip of C for which gemm_rect reads an op(A) stored by k where it lies
// (KernelSpec::micro_cols) instead of packing it; 0 when the spec cannot.
int a_in_place_cols(const KernelSpec& spec);

// Rows [m0, m1) x columns [n0, n1) of C = alpha * op(A) @ op(B) + beta * C on the calling
// thread, with its own packing buffers. The sums of an element do not depend on the rectangle.
void gemm_rect(const KernelSpec& spec, PackSrc a, PackSrc b, int m0, int m1, int n0, int n1, int K,
               float alpha, float beta, float* C, int ldc);

// Grows the calling thread's packing buffers so that no later gemm_rect with m1 - m0 <= max_m,
// n1 - n0 <= max_n and K <= max_k allocates.
void reserve_pack_buffers(const KernelSpec& spec, int max_m, int max_n, int max_k);

}  // namespace bagualu::kernels::gemm

// grouped_gemm_f32 / grouped_gemm_tn_f32 and their bf16 forms (kernels/grouped_gemm.h) on the
// packed driver: units of (group, column strip, row block) handed out to the threads as they
// come free, each run by gemm_rect with the same packing and micro-kernel as gemm_f32 (gemm_bf16
// for the bf16 forms), so each element is summed in the same order as there. The ref and
// openblas paths loop over gemm_f32 (gemm_bf16) instead.
// Packing buffers are reserved for the largest unit a call can have (mc rows, a strip, one kc
// block), so the row counts changing from call to call (routing) do not make them grow again.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/driver.h"
#include "kernels/grouped_gemm.h"

namespace bagualu::kernels {

namespace gemm {

namespace {

void check_offsets(int G, const int32_t* offsets) {
    BGL_CHECK(G >= 0 && (G == 0 || offsets != nullptr), "G={}", G);
    for (int g = 0; g < G; ++g) {
        BGL_CHECK(offsets[g] >= 0 && offsets[g] <= offsets[g + 1], "offsets[{}..{}] = {}, {}", g,
                  g + 1, offsets[g], offsets[g + 1]);
    }
}

// Both forms are cut into units, each a (group, column strip, row block) rectangle of C over
// the group's whole depth, numbered group by group and taken from a shared counter as threads
// come free (as gemm_packed hands out its units): a thread slowed by other work on its core takes
// fewer, an empty group has none, a tiny one a single small unit. A unit runs gemm_rect, whose
// sums do not depend on the rectangle, so neither does any result on the thread count.

// Below this many multiply-adds in all, one thread.
constexpr double kMinThreadedWork = 1 << 18;
// Units per thread to aim for, so that a stalled thread's share can be taken over.
constexpr int kUnitsPerThread = 4;

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

struct UnitPlan {
    int cols, strips;  // strip width (a multiple of nr) and strips per group
    int rows;          // row block (a multiple of mr)
    int threads;
};

// Units for `busy` groups of about `avg_rows` rows each, N columns and depth up to K (kc-blocked),
// strips as wide as gemm_packed's B slice (a k block of it in half of L2, from the CPU's caches)
// allows (and at most max_cols when that is not 0) and of (nearly) equal width, then row blocks
// only as short as needed to give every thread units_per_thread units. Each strip packs the group's
// A rows again, so a narrow last strip would pay that for a sliver of the products. (A fixed 256
// KiB slice cut an expert's 384 columns into 320 + 64 on a CPU with 1 MiB of L2: docs/results.md.)
// Each row block packs its strip of B again: where the groups and strips alone give the threads
// their units (and max_rows, the largest group's rows, is given), a group is cut only where it
// holds more than half a thread's share of all total_rows, not at the average (64 experts of
// about 256 rows were cut at 264, 40% of them into a block and a sliver that packed the weights
// again).
struct Strips {
    int cols, count;  // width (a multiple of nr) and how many
};
Strips strips_of(const KernelSpec& s, int N, int K, int max_cols) {
    const int kcp = round_up(std::min(s.kc, K), s.kstep);
    int cols      = int(b_slice_bytes() / (size_t(kcp) * size_t(s.elem_bytes))) / s.nr * s.nr;
    cols          = std::clamp(cols, s.nr, std::min(s.nc, round_up(N, s.nr)));
    if (max_cols > 0) cols = std::min(cols, max_cols);
    const int count = ceil_div(N, cols);
    return {round_up(ceil_div(N, count), s.nr), count};
}

UnitPlan plan_units(const KernelSpec& s, int busy, int avg_rows, int N, int K, double madds,
                    int units_per_thread = kUnitsPerThread, int max_cols = 0, int max_rows = 0,
                    int64_t total_rows = 0) {
    UnitPlan p{};
    p.threads             = madds < kMinThreadedWork ? 1 : compute_pool().size();
    const Strips st       = strips_of(s, N, K, max_cols);
    p.cols                = st.cols;
    p.strips              = st.count;
    const int want_blocks = ceil_div(units_per_thread * p.threads, busy * p.strips);
    int rows              = ceil_div(avg_rows, want_blocks);
    if (want_blocks == 1 && max_rows > 0) {
        const int64_t half_share = (total_rows + 2 * p.threads - 1) / (2 * p.threads);
        rows                     = std::max(rows, int(std::min<int64_t>(max_rows, half_share)));
    }
    p.rows = round_up(std::max(1, rows), s.mr);
    return p;
}

// The groups in decreasing order of their rows (offsets[g + 1] - offsets[g], which both forms'
// work grows with), ties in group order: handed out in that order, the largest groups' units
// go first and the small ones fill the end, so the threads end closer together than in group
// order (8 experts of 350-650 rows are 8 units for 2 threads). In a grow-only buffer of the
// calling thread.
const int* largest_first(int G, const int32_t* offsets) {
    thread_local std::vector<int> order;
    order.resize(size_t(G));
    std::iota(order.begin(), order.end(), 0);
    // std::sort with the index as the tie-break: in place (a stable sort takes a buffer)
    std::sort(order.begin(), order.end(), [&](int a, int b) {
        const int ra = offsets[a + 1] - offsets[a], rb = offsets[b + 1] - offsets[b];
        return ra > rb || (ra == rb && a < b);
    });
    return order.data();
}

// Runs unit(g, i0, i1, j0, j1) for every unit, on p.threads threads, taking the groups in
// `order` (G entries); rows_of(g) is group g's row count (0: no units). Every thread first
// reserves its packing buffers for the largest unit, whether or not it gets one this time, so
// that no later call allocates.
template <typename Rows, typename Unit>
void run_units(const KernelSpec& s, const UnitPlan& p, int G, const int* order, int N, int K,
               Rows rows_of, Unit unit) {
    int64_t total = 0;
    for (int g = 0; g < G; ++g) total += int64_t(p.strips) * ceil_div(rows_of(g), p.rows);
    std::atomic<int64_t> next{0};
    auto body = [&](int) {
        reserve_pack_buffers(s, s.mc, p.cols, K);
        int o        = 0;  // position in order of the current group
        int64_t base = 0;  // units before it
        for (int64_t u = next.fetch_add(1, std::memory_order_relaxed); u < total;
             u         = next.fetch_add(1, std::memory_order_relaxed)) {
            int mblocks = ceil_div(rows_of(order[o]), p.rows);
            while (u >= base + int64_t(p.strips) * mblocks) {
                base += int64_t(p.strips) * mblocks;
                mblocks = ceil_div(rows_of(order[++o]), p.rows);
            }
            const int g = order[o], local = int(u - base), strip = local / mblocks,
                      blk = local % mblocks;
            const int j0 = strip * p.cols, i0 = blk * p.rows;
            unit(g, i0, std::min(rows_of(g), i0 + p.rows), j0, std::min(N, j0 + p.cols));
        }
    };
    if (p.threads == 1 || total <= 1) {
        body(0);
    } else {
        compute_pool().run(body);
    }
}

// Forward form: group g is rows [offsets[g], offsets[g+1]) of A and C times its own op(B_g).
// TA, TB: the element types the spec's packers read (float or bf16).
template <typename TA, typename TB = TA>
void grouped_packed(const KernelSpec& s, Trans ta, Trans tb, int G, const int32_t* offsets, int N,
                    int K, float alpha, const TA* A, int lda, const int32_t* a_rows, const TB* B,
                    int ldb, size_t stride_b, float beta, float* C, int ldc,
                    GroupEpilogue epilogue) {
    const int row0 = offsets[0], R = offsets[G] - offsets[0];
    if (R == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        scale_c(R, N, beta, C + size_t(row0) * size_t(ldc), ldc);
        for (int g = 0; epilogue && g < G; ++g) {
            if (offsets[g + 1] > offsets[g]) epilogue(g, 0, offsets[g + 1] - offsets[g], 0, N);
        }
        return;
    }
    int busy = 0, max_rows = 0;
    for (int g = 0; g < G; ++g) {
        busy += offsets[g + 1] > offsets[g];
        max_rows = std::max(max_rows, offsets[g + 1] - offsets[g]);
    }
    const UnitPlan p    = plan_units(s, busy, ceil_div(R, busy), N, K, double(R) * N * K,
                                     kUnitsPerThread, 0, max_rows, R);
    const size_t a_step = ta == Trans::N ? size_t(lda) : 1;
    const auto rows_of  = [&](int g) { return offsets[g + 1] - offsets[g]; };
    const int* order    = largest_first(G, offsets);
    run_units(s, p, G, order, N, K, rows_of, [&](int g, int i0, int i1, int j0, int j1) {
        const PackSrc a = a_rows ? PackSrc{A, lda, true, a_rows + offsets[g]}
                                 : PackSrc{A + size_t(offsets[g]) * a_step, lda, ta == Trans::N};
        const PackSrc w{B + size_t(g) * stride_b, ldb, tb == Trans::T};
        gemm_rect(s, a, w, i0, i1, j0, j1, K, alpha, beta, C + size_t(offsets[g]) * size_t(ldc),
                  ldc);
        if (epilogue) epilogue(g, i0, i1, j0, j1);
    });
}

// The weight-gradient form's widest strip: as wide as A read in place allows (below).
int tn_max_cols(const KernelSpec& s) { return a_in_place_cols(s); }

// Weight-gradient form: group g's output is its own (M, N) matrix with depth K_g, never split
// over the depth.
// T: the element type the spec's packers read (float or bf16).
template <typename T>
void grouped_tn_packed(const KernelSpec& s, int G, const int32_t* offsets, int M, int N,
                       float alpha, const T* A, int lda, const T* B, int ldb, const int32_t* b_rows,
                       float beta, float* C, int ldc, size_t stride_c, GroupEpilogue epilogue) {
    int64_t depth = 0;  // sum of K_g over groups with work
    int busy      = 0;
    for (int g = 0; g < G; ++g) {
        const int kg = offsets[g + 1] - offsets[g];
        if (kg == 0 || alpha == 0.0f) {
            scale_c(M, N, beta, C + size_t(g) * stride_c, ldc);
        } else {
            depth += kg;
            ++busy;
        }
    }
    if (busy == 0) return;
    // Strips planned for a whole kc block whatever the depths, so that the packing buffers do
    // not grow when the routing changes.
    // A unit packs its strip of B (K_g rows of it) for every k block; row blocks of one strip
    // would each pack it again, so a group's output rows are cut only when the groups and strips
    // are fewer than the threads (one expert of 256 x 768 over 2,048 rows ran at 0.8x gemm_f32's
    // TN product with four units a thread, as fast with one: docs/results.md).
    // Where the spec reads A in place, strips no wider than that allows: A (K_g x M, stored by
    // k) is then never packed, so narrower strips cost nothing and give the threads more units
    // of B's columns (8 experts' weight gradients 4-8% faster, docs/results.md).
    const UnitPlan p   = plan_units(s, busy, M, N, s.kc, double(depth) * M * N, 1, tn_max_cols(s));
    const auto rows_of = [&](int g) {
        return offsets[g + 1] > offsets[g] && alpha != 0.0f ? M : 0;
    };
    const int* order = largest_first(G, offsets);
    run_units(s, p, G, order, N, s.kc, rows_of, [&](int g, int i0, int i1, int j0, int j1) {
        const int kg = offsets[g + 1] - offsets[g];
        const PackSrc a{A + size_t(offsets[g]) * size_t(lda), lda, false};
        const PackSrc x = b_rows ? PackSrc{B, ldb, false, b_rows + offsets[g]}
                                 : PackSrc{B + size_t(offsets[g]) * size_t(ldb), ldb, false};
        gemm_rect(s, a, x, i0, i1, j0, j1, kg, alpha, beta, C + size_t(g) * stride_c, ldc);
        if (epilogue) epilogue(g, i0, i1, j0, j1);
    });
}

// The grouped GEMM is ours only: under onednn and auto it runs the best of our packed kernels.
Path packed_path(Path p) { return p == Path::onednn || p == Path::automatic ? best_path() : p; }

}  // namespace

}  // namespace gemm

namespace gemm {
namespace {

// Rows src[rows[i]] (width w of ld) for i in [0, n), copied one after another (ld w) into a
// grow-only buffer of the calling thread: the ref and openblas paths' gathered operand.
template <typename T>
const T* gather_rows(const T* src, int ld, const int32_t* rows, int n, int w) {
    thread_local std::vector<T> buf;
    if (buf.size() < size_t(n) * size_t(w)) buf.resize(size_t(n) * size_t(w));
    for (int i = 0; i < n; ++i) {
        std::copy_n(src + size_t(rows[i]) * size_t(ld), w, buf.data() + size_t(i) * size_t(w));
    }
    return buf.data();
}

// The forward form for element type T: per group through `loop` (gemm_f32 / gemm_bf16) on the
// ref and openblas paths, else the grouped driver on spec(the packed path).
template <typename T>
void grouped_forward(const KernelSpec& (*spec)(Path),
                     void (*loop)(Trans, Trans, int, int, int, float, const T*, int, const T*, int,
                                  float, float*, int),
                     Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                     const T* A, int lda, const int32_t* a_rows, const T* B, int ldb,
                     size_t stride_b, float beta, float* C, int ldc, GroupEpilogue epilogue) {
    BGL_CHECK(N >= 0 && K >= 0, "N={} K={}", N, K);
    BGL_CHECK(!a_rows || ta == Trans::N, "gathered rows of A need op(A) = A");
    check_offsets(G, offsets);
    if (G == 0) return;
    const Path p = active_path();
    if (p == Path::ref || p == Path::openblas) {
        const size_t a_step = ta == Trans::N ? size_t(lda) : 1;
        for (int g = 0; g < G; ++g) {
            const int rows = offsets[g + 1] - offsets[g];
            const T* a     = a_rows ? gather_rows(A, lda, a_rows + offsets[g], rows, K)
                                    : A + size_t(offsets[g]) * a_step;
            loop(ta, tb, rows, N, K, alpha, a, a_rows ? K : lda, B + size_t(g) * stride_b, ldb,
                 beta, C + size_t(offsets[g]) * size_t(ldc), ldc);
            if (epilogue && rows > 0 && N > 0) epilogue(g, 0, rows, 0, N);
        }
        return;
    }
    grouped_packed(spec(packed_path(p)), ta, tb, G, offsets, N, K, alpha, A, lda, a_rows, B, ldb,
                   stride_b, beta, C, ldc, epilogue);
}

// The weight-gradient form for element type T: per group through `loop` (gemm_f32 /
// gemm_bf16) on the ref and openblas paths, else the grouped driver on spec(the packed path).
template <typename T, typename SpecOf>
void grouped_tn(SpecOf spec,
                void (*loop)(Trans, Trans, int, int, int, float, const T*, int, const T*, int,
                             float, float*, int),
                int G, const int32_t* offsets, int M, int N, float alpha, const T* A, int lda,
                const T* B, int ldb, const int32_t* b_rows, float beta, float* C, int ldc,
                size_t stride_c, GroupEpilogue epilogue) {
    BGL_CHECK(M >= 0 && N >= 0, "M={} N={}", M, N);
    check_offsets(G, offsets);
    if (G == 0 || M == 0 || N == 0) return;
    const Path p = active_path();
    if (p == Path::ref || p == Path::openblas) {
        for (int g = 0; g < G; ++g) {
            const int kg = offsets[g + 1] - offsets[g];
            const T* b   = b_rows ? gather_rows(B, ldb, b_rows + offsets[g], kg, N)
                                  : B + size_t(offsets[g]) * size_t(ldb);
            loop(Trans::T, Trans::N, M, N, kg, alpha, A + size_t(offsets[g]) * size_t(lda), lda, b,
                 b_rows ? N : ldb, beta, C + size_t(g) * stride_c, ldc);
            if (epilogue && kg > 0 && alpha != 0.0f) epilogue(g, 0, M, 0, N);
        }
        return;
    }
    grouped_tn_packed(spec(packed_path(p)), G, offsets, M, N, alpha, A, lda, B, ldb, b_rows, beta,
                      C, ldc, stride_c, epilogue);
}

// The bf16 weight-gradient kernel: the path's bf16 kernel with the float kernel's depth block,
// so that grouped_gemm_tn_depth_block() splits both forms exactly (the block is even, so no k
// pair straddles a split).
KernelSpec bf16_tn_spec(Path p) {
    KernelSpec s = bf16_spec(p);
    s.kc         = f32_spec(p).kc;
    BGL_CHECK(s.kc % s.kstep == 0, "kc {} kstep {}", s.kc, s.kstep);
    return s;
}

}  // namespace
}  // namespace gemm

void grouped_gemm_f32(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                      const float* A, int lda, const float* B, int ldb, size_t stride_b, float beta,
                      float* C, int ldc, const int32_t* a_rows, GroupEpilogue epilogue) {
    gemm::grouped_forward<float>(gemm::f32_spec, gemm_f32, ta, tb, G, offsets, N, K, alpha, A, lda,
                                 a_rows, B, ldb, stride_b, beta, C, ldc, epilogue);
}

void grouped_gemm_bf16(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                       const bf16* A, int lda, const bf16* B, int ldb, size_t stride_b, float beta,
                       float* C, int ldc, const int32_t* a_rows, GroupEpilogue epilogue) {
    gemm::grouped_forward<bf16>(gemm::bf16_spec, gemm_bf16, ta, tb, G, offsets, N, K, alpha, A, lda,
                                a_rows, B, ldb, stride_b, beta, C, ldc, epilogue);
}

bool grouped_gemm_bf16_float_b() {
    const gemm::Path p = gemm::active_path();
    return p != gemm::Path::ref && p != gemm::Path::openblas &&
           gemm::bf16_spec(gemm::packed_path(p)).pack_b_f32 != nullptr;
}

bool grouped_gemm_bf16_float_b_rows() {
    return grouped_gemm_bf16_float_b() &&
           gemm::bf16_spec(gemm::packed_path(gemm::active_path())).pack_b_f32_rows;
}

void grouped_gemm_bf16(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                       const bf16* A, int lda, const float* B, int ldb, size_t stride_b, float beta,
                       float* C, int ldc, const int32_t* a_rows, GroupEpilogue epilogue) {
    BGL_CHECK(grouped_gemm_bf16_float_b(),
              "grouped_gemm_bf16 with a float B on a path whose bf16 kernel cannot pack it");
    BGL_CHECK(N >= 0 && K >= 0, "N={} K={}", N, K);
    BGL_CHECK(!a_rows || ta == Trans::N, "gathered rows of A need op(A) = A");
    gemm::check_offsets(G, offsets);
    if (G == 0) return;
    gemm::KernelSpec s = gemm::bf16_spec(gemm::packed_path(gemm::active_path()));
    s.pack_b           = s.pack_b_f32;
    gemm::grouped_packed<bf16, float>(s, ta, tb, G, offsets, N, K, alpha, A, lda, a_rows, B, ldb,
                                      stride_b, beta, C, ldc, epilogue);
}

void grouped_gemm_tn_f32(int G, const int32_t* offsets, int M, int N, float alpha, const float* A,
                         int lda, const float* B, int ldb, float beta, float* C, int ldc,
                         size_t stride_c, const int32_t* b_rows, GroupEpilogue epilogue) {
    gemm::grouped_tn<float>(gemm::f32_spec, gemm_f32, G, offsets, M, N, alpha, A, lda, B, ldb,
                            b_rows, beta, C, ldc, stride_c, epilogue);
}

void grouped_gemm_tn_bf16(int G, const int32_t* offsets, int M, int N, float alpha, const bf16* A,
                          int lda, const bf16* B, int ldb, float beta, float* C, int ldc,
                          size_t stride_c, const int32_t* b_rows, GroupEpilogue epilogue) {
    gemm::grouped_tn<bf16>(gemm::bf16_tn_spec, gemm_bf16, G, offsets, M, N, alpha, A, lda, B, ldb,
                           b_rows, beta, C, ldc, stride_c, epilogue);
}

bool whole_groups_suit(int G, const int32_t* offsets) {
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref || p == gemm::Path::openblas || G < 2) return false;
    gemm::check_offsets(G, offsets);
    int busy = 0, max_rows = 0;
    for (int g = 0; g < G; ++g) {
        busy += offsets[g + 1] > offsets[g];
        max_rows = std::max(max_rows, offsets[g + 1] - offsets[g]);
    }
    const int64_t total = int64_t{offsets[G]} - offsets[0];
    return busy >= 2 && 2 * int64_t{compute_pool().size()} * max_rows <= total;
}

void for_each_group(int G, const int32_t* offsets, double madds_per_row,
                    FunctionRef<void(int g, int thread)> job) {
    const gemm::Path p = gemm::active_path();
    BGL_CHECK(p != gemm::Path::ref && p != gemm::Path::openblas,
              "for_each_group on the {} path, which has no per-thread product", gemm::path_name(p));
    gemm::check_offsets(G, offsets);
    if (G == 0) return;
    const double madds = double(offsets[G] - offsets[0]) * madds_per_row;
    const int threads  = madds < gemm::kMinThreadedWork ? 1 : compute_pool().size();
    const int* order   = gemm::largest_first(G, offsets);
    std::atomic<int> next{0};
    auto body = [&](int thread) {
        for (int i = next.fetch_add(1, std::memory_order_relaxed); i < G;
             i     = next.fetch_add(1, std::memory_order_relaxed)) {
            job(order[i], thread);
        }
    };
    if (threads == 1) {
        body(0);
    } else {
        compute_pool().run(body);
    }
}

namespace gemm {
namespace {

// One group's product C (M, N) = alpha * op(A) op(B) + beta * C over depth K on the calling
// thread with spec s, in the grouped driver's strips (strips_of for a depth of strip_k, at most
// max_cols wide), each over all the group's rows (a rectangle never changes a sum).
void group_strips(const KernelSpec& s, PackSrc a, PackSrc b, int M, int N, int K, int strip_k,
                  int max_cols, float alpha, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    const Strips st = strips_of(s, N, strip_k, max_cols);
    reserve_pack_buffers(s, s.mc, st.cols, strip_k);
    for (int j0 = 0; j0 < N; j0 += st.cols)
        gemm_rect(s, a, b, 0, M, j0, std::min(N, j0 + st.cols), K, alpha, beta, C, ldc);
}

// One group's forward-form product (grouped_packed's unit of it).
void group_forward(const KernelSpec& s, Trans ta, Trans tb, int M, int N, int K, float alpha,
                   const void* A, int lda, const int32_t* a_rows, const void* B, int ldb,
                   float beta, float* C, int ldc) {
    BGL_CHECK(!a_rows || ta == Trans::N, "gathered rows of A need op(A) = A");
    const PackSrc a = a_rows ? PackSrc{A, lda, true, a_rows} : PackSrc{A, lda, ta == Trans::N};
    group_strips(s, a, PackSrc{B, ldb, tb == Trans::T}, M, N, K, K, 0, alpha, beta, C, ldc);
}

// One group's weight-gradient product (grouped_tn_packed's unit of it).
void group_tn(const KernelSpec& s, int M, int N, int K, float alpha, const void* A, int lda,
              const void* B, int ldb, const int32_t* b_rows, float beta, float* C, int ldc) {
    group_strips(s, PackSrc{A, lda, false}, PackSrc{B, ldb, false, b_rows}, M, N, K, s.kc,
                 tn_max_cols(s), alpha, beta, C, ldc);
}

Path group_path() { return packed_path(active_path()); }

}  // namespace
}  // namespace gemm

void group_gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                    const int32_t* a_rows, const float* B, int ldb, float beta, float* C, int ldc) {
    gemm::group_forward(gemm::f32_spec(gemm::group_path()), ta, tb, M, N, K, alpha, A, lda, a_rows,
                        B, ldb, beta, C, ldc);
}

void group_gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                     const int32_t* a_rows, const bf16* B, int ldb, float beta, float* C, int ldc) {
    gemm::group_forward(gemm::bf16_spec(gemm::group_path()), ta, tb, M, N, K, alpha, A, lda, a_rows,
                        B, ldb, beta, C, ldc);
}

void group_gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                     const int32_t* a_rows, const float* B, int ldb, float beta, float* C,
                     int ldc) {
    BGL_CHECK(grouped_gemm_bf16_float_b(),
              "group_gemm_bf16 with a float B on a path whose bf16 kernel cannot pack it");
    gemm::KernelSpec s = gemm::bf16_spec(gemm::group_path());
    s.pack_b           = s.pack_b_f32;
    gemm::group_forward(s, ta, tb, M, N, K, alpha, A, lda, a_rows, B, ldb, beta, C, ldc);
}

void group_gemm_tn_f32(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                       int ldb, const int32_t* b_rows, float beta, float* C, int ldc) {
    gemm::group_tn(gemm::f32_spec(gemm::group_path()), M, N, K, alpha, A, lda, B, ldb, b_rows, beta,
                   C, ldc);
}

void group_gemm_tn_bf16(int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
                        int ldb, const int32_t* b_rows, float beta, float* C, int ldc) {
    gemm::group_tn(gemm::bf16_tn_spec(gemm::group_path()), M, N, K, alpha, A, lda, B, ldb, b_rows,
                   beta, C, ldc);
}

int grouped_gemm_tn_depth_block() {
    const gemm::Path p = gemm::active_path();
    if (p == gemm::Path::ref || p == gemm::Path::openblas) return 0;
    const int kc = gemm::f32_spec(gemm::packed_path(p)).kc;
    BGL_CHECK(kc <= kMaxTnDepthBlock, "kc {} above {}", kc, kMaxTnDepthBlock);
    return kc;
}

}  // namespace bagualu::kernels

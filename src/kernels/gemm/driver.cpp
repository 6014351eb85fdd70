// Goto/BLIS blocked GEMM. gemm_rect, for one thread's rectangle: jc (NC) -> pc (KC) -> pack B ->
// ic (MC) -> pack A -> the register tiles of the block (for_tiles: row by row, ir (MR) -> jr (NR),
// or column by column, as the spec says) -> micro-kernel. gemm_packed: units of C (a column
// strip x a row block, whole depth), each thread taking those of its own range first, then
// helping in the others'; B packed per strip and thread.
// Threads write disjoint parts of C, so they need no barrier; packing buffers are per thread,
// 64-byte aligned and grow-only (allocated with operator new, so allocation counters see them).
#include "kernels/gemm/driver.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <thread>
#include <utility>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"

namespace bagualu::kernels::gemm {

namespace {

// What every thread's packing buffers hold (pack_buffer_bytes).
std::atomic<size_t> g_pack_bytes{0};

// The bytes PackBuffer::get allocates for a request of `bytes`.
constexpr size_t pack_alloc_bytes(size_t bytes) { return (bytes + kPackSlack + 63) / 64 * 64; }

class PackBuffer {
   public:
    PackBuffer() = default;
    ~PackBuffer() { release(); }
    PackBuffer(const PackBuffer&)            = delete;
    PackBuffer& operator=(const PackBuffer&) = delete;

    void* get(size_t bytes) {
        if (bytes > capacity_) {
            const size_t rounded = pack_alloc_bytes(bytes);
            void* p              = ::operator new (rounded, std::align_val_t{64});
            release();
            data_     = p;
            capacity_ = rounded - kPackSlack;
            g_pack_bytes.fetch_add(rounded, std::memory_order_relaxed);
        }
        return data_;
    }

   private:
    void release() {
        if (data_) {
            ::operator delete (data_, std::align_val_t{64});
            g_pack_bytes.fetch_sub(capacity_ + kPackSlack, std::memory_order_relaxed);
        }
        data_     = nullptr;
        capacity_ = 0;
    }

    void* data_      = nullptr;
    size_t capacity_ = 0;
};

thread_local PackBuffer t_a_buffer;
thread_local PackBuffer t_b_buffer;
thread_local PackBuffer t_shared_b_buffer;  // the calling thread's, for the whole of op(B)

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

// Bytes of the A and B packing buffers gemm_rect needs for a rectangle of m x n and depth K.
size_t a_pack_bytes(const KernelSpec& s, int m, int K) {
    const int kc_max = round_up(std::min(s.kc, K), s.kstep);
    const int mc_max = std::min(s.mc, round_up(m, s.mr));
    return size_t(kc_max) * size_t(mc_max) * size_t(s.elem_bytes);
}
size_t b_pack_bytes(const KernelSpec& s, int n, int K) {
    const int kc_max = round_up(std::min(s.kc, K), s.kstep);
    const int nc_max = std::min(s.nc, round_up(n, s.nr));
    return size_t(kc_max) * size_t(nc_max) * size_t(s.elem_bytes);
}

}  // namespace

namespace {

// op(A) is read in place instead of packed when its rows are used for at most this many column
// tiles: packing copies A, which pays only when many tiles read it again (an expert's narrow
// layer reads a row for a few). Stored by k (A transposed, as the weight gradients read their
// row operand): KernelSpec::micro_cols; stored by row, gathered rows included (the experts'
// tokens): KernelSpec::micro_rows. Stored by k, the micro-kernel fetches A's steps ahead itself
// (ColsA, kernels/gemm/microkernel.h), so A is read in place for up to twice as many tiles.
constexpr int kInPlaceMaxTiles     = 4;
constexpr int kInPlaceMaxColsTiles = 8;

// A spec with micro_strided reads an op(A) stored by row (not gathered) in place whatever the
// width, where every k block is whole k tiles (K and kc multiples of strided_k) and every row
// starts on a cache line (data and the row stride multiples of 64 bytes; with rows across two
// lines a tile load touched twice the lines and the products ran slower than on packed A:
// 0.78-0.94x on bench-medium's forward shapes, aligned 1.0-1.19x, docs/results.md).
bool a_strided(const KernelSpec& s, PackSrc a, int K) {
    const size_t row_bytes = size_t(a.ld) * size_t(s.elem_bytes);
    return s.micro_strided && a.k_contiguous && !a.rows && K % s.strided_k == 0 &&
           s.kc % s.strided_k == 0 && reinterpret_cast<uintptr_t>(a.data) % 64 == 0 &&
           row_bytes % 64 == 0;
}

bool a_in_place(const KernelSpec& s, PackSrc a, int cols, int K) {
    if (a.k_contiguous && s.micro_strided) return a_strided(s, a, K);
    if (a.k_contiguous) return s.micro_rows && cols <= kInPlaceMaxTiles * s.nr;
    return !a.rows && cols <= a_in_place_cols(s);
}

// A's rows [i0, i0 + mc) for the k block [pc, pc + kc): with in_place, its whole tiles are read
// where they lie and only a last short tile is packed (into abuf at its place); returns how many
// rows are read in place.
int prepare_a(const KernelSpec& s, PackSrc a, bool in_place, int i0, int mc, int pc, int kc,
              char* abuf) {
    const int full = in_place ? mc / s.mr * s.mr : 0;
    if (full < mc) {
        const size_t at = size_t(full) * size_t(round_up(kc, s.kstep)) * size_t(s.elem_bytes);
        s.pack_a(a, i0 + full, mc - full, pc, kc, abuf + at);
    }
    return full;
}

// The tile of rows [ir, ir + m) of that block times the packed B panel bp into cp.
inline void a_tile(const KernelSpec& s, PackSrc a, int full, const char* abuf, int i0, int ir,
                   int pc, int kc, const char* bp, float* cp, int ldc, float alpha, float beta,
                   int m, int n) {
    if (ir < full) {
        if (a.k_contiguous && s.micro_strided) {  // in place only where a_strided
            const char* ap = static_cast<const char*>(a.data) +
                             (size_t(i0 + ir) * size_t(a.ld) + size_t(pc)) * size_t(s.elem_bytes);
            s.micro_strided(kc, ap, a.ld, bp, cp, ldc, alpha, beta, m, n);
            return;
        }
        if (a.k_contiguous) {
            const float* rows[kMaxMicroRows];
            for (int i = 0; i < s.mr; ++i) rows[i] = a.row<float>(i0 + ir + i) + pc;
            s.micro_rows(kc, rows, bp, cp, ldc, alpha, beta, m, n);
            return;
        }
        const float* ap =
            static_cast<const float*>(a.data) + size_t(pc) * size_t(a.ld) + size_t(i0 + ir);
        s.micro_cols(kc, ap, a.ld, bp, cp, ldc, alpha, beta, m, n);
        return;
    }
    const int kcp  = round_up(kc, s.kstep);
    const char* ap = abuf + size_t(ir) * size_t(kcp) * size_t(s.elem_bytes);
    s.micro(kcp, ap, bp, cp, ldc, alpha, beta, m, n);
}

// The register tiles of one k block, rows [0, mc) x columns [0, nw) of the block, in the spec's
// order: tile(ir, jr, m, n) for the tile of rows [ir, ir + m) and columns [jr, jr + n). Row by
// row, one row of tiles reads its A panel from L1 while B's panels stream from L2, and C is
// walked along its rows; column by column (KernelSpec::column_tiles_outer), a B panel stays in
// L1 and C is walked down a column of tiles, whose rows a power-of-two ldc maps to the same
// cache sets. The order changes which tile runs first, never a sum.
template <typename Tile>
inline void for_tiles(const KernelSpec& s, int mc, int nw, Tile&& tile) {
    if (s.column_tiles_outer) {
        for (int jr = 0; jr < nw; jr += s.nr) {
            for (int ir = 0; ir < mc; ir += s.mr)
                tile(ir, jr, std::min(s.mr, mc - ir), std::min(s.nr, nw - jr));
        }
        return;
    }
    for (int ir = 0; ir < mc; ir += s.mr) {
        for (int jr = 0; jr < nw; jr += s.nr)
            tile(ir, jr, std::min(s.mr, mc - ir), std::min(s.nr, nw - jr));
    }
}

}  // namespace

int a_in_place_cols(const KernelSpec& s) { return s.micro_cols ? kInPlaceMaxColsTiles * s.nr : 0; }

void gemm_rect(const KernelSpec& s, PackSrc a, PackSrc b, int m0, int m1, int n0, int n1, int K,
               float alpha, float beta, float* C, int ldc) {
    const size_t elem   = static_cast<size_t>(s.elem_bytes);
    auto* bbuf          = static_cast<char*>(t_b_buffer.get(b_pack_bytes(s, n1 - n0, K)));
    auto* abuf          = static_cast<char*>(t_a_buffer.get(a_pack_bytes(s, m1 - m0, K)));
    const bool in_place = a_in_place(s, a, n1 - n0, K);
    const KernelScope scope(s);

    for (int jc = n0; jc < n1; jc += s.nc) {
        const int nc = std::min(s.nc, n1 - jc);
        for (int pc = 0; pc < K; pc += s.kc) {
            const int kc       = std::min(s.kc, K - pc);
            const int kcp      = round_up(kc, s.kstep);
            const float beta_k = pc == 0 ? beta : 1.0f;
            s.pack_b(b, jc, nc, pc, kc, bbuf);
            for (int ic = m0; ic < m1; ic += s.mc) {
                const int mc   = std::min(s.mc, m1 - ic);
                const int full = prepare_a(s, a, in_place, ic, mc, pc, kc, abuf);
                for_tiles(s, mc, nc, [&](int ir, int jr, int m, int n) {
                    const char* bp = bbuf + size_t(jr) * size_t(kcp) * elem;
                    float* cp      = C + size_t(ic + ir) * size_t(ldc) + size_t(jc + jr);
                    a_tile(s, a, full, abuf, ic, ir, pc, kc, bp, cp, ldc, alpha, beta_k, m, n);
                });
            }
        }
    }
}

void reserve_pack_buffers(const KernelSpec& s, int max_m, int max_n, int max_k) {
    t_a_buffer.get(a_pack_bytes(s, max_m, max_k));
    t_b_buffer.get(b_pack_bytes(s, max_n, max_k));
}

void scale_c(int M, int N, float beta, float* C, int ldc) {
    for (int i = 0; i < M; ++i) {
        float* c = C + size_t(i) * size_t(ldc);
        if (beta == 0.0f) {
            std::fill(c, c + N, 0.0f);
        } else if (beta != 1.0f) {
            for (int j = 0; j < N; ++j) c[j] *= beta;
        }
    }
}

// ---- gemm_packed: column strips x row blocks, a range of them per thread ----
//
// C is cut into strips of `cols` columns and each strip into row blocks (row_block); a unit is one
// (strip, row block) over the whole depth. Units are numbered strip by strip and cut into one
// consecutive range per thread (or, where a thread's share of a row of C would be under a page,
// a range is a run of row blocks over every strip: Plan::by_rows). A thread takes the units of its
// own range from the range's counter, then helps in the other ranges through their counters, so a
// thread whose core is busy with other work takes fewer units rather than holding up the call (a
// static split waits for its slowest thread). A thread packs op(B) of a strip for every k block
// when it takes its first unit of that strip, so with ranges each strip is packed about once, by
// its range's thread (with a single counter the threads took turns within a strip, so each packed
// every strip); a unit packs its rows of op(A) per k block into an L2-sized block. The strip's B
// slice for one k block (kc x cols) is sized for L2 next to the A block. No thread ever waits for
// another's packing: a late-starting thread delays only what it takes. Which thread runs a unit
// changes nothing in its sums.
//
// Measured with two threads on the Zen 5 of docs/results.md against the previous scheme (one
// counter, and a small op(B) packed once by all threads together, each unit waiting for the
// slices it needs; that now serves only more than two threads a strip, gemm_shared_b below):
// `bench kernels` on bench-medium's products, median 1.08x (0.98-1.34x), the squares 1.14-1.34x.

namespace {

struct Plan {
    int cols, rows;       // strip width (multiple of nr), largest row block (multiple of mr)
    int strips, mblocks;  // units = strips * mblocks
    int threads;
    bool by_rows;  // the threads' ranges are row blocks over every strip, not strips
};

// The cache budgets of the blocking, from the sizes the CPU reports (kernels/cpu_features.h);
// KC is the spec's, fixed, so the sums are the same whatever the caches (only which elements
// of C a unit covers changes).
//   slice: one k block of a strip's packed B (KC x NC), half of L2, the A block the rest;
//   a_block: a unit's packed A rows for one k block (MC x KC), a quarter of L2;
//   strip: a thread's packed strip over all k blocks, its share of half of L3, at most 8 MiB.
struct Budgets {
    size_t slice, a_block, strip;
};
const CacheSizes* g_blocking_caches = nullptr;  // set_blocking_caches

Budgets budgets(const CacheSizes& c, int threads) {
    Budgets b;
    b.slice   = std::clamp(c.l2 / 2, size_t(64) << 10, size_t(2) << 20);
    b.a_block = std::clamp(c.l2 / 4, size_t(32) << 10, size_t(1) << 20);
    b.strip = std::clamp(c.l3 / 2 / size_t(std::max(threads, 1)), size_t(1) << 20, size_t(8) << 20);
    return b;
}
Budgets budgets(int threads) {
    return budgets(g_blocking_caches ? *g_blocking_caches : cache_sizes(), threads);
}

// MC: rows of a unit, a multiple of mr whose packed A block (one k block) fits its budget.
int rows_cap(const KernelSpec& s, const Budgets& b, int kcp) {
    const size_t bytes = size_t(kcp) * size_t(s.elem_bytes) * size_t(s.mr);
    return std::max(1, static_cast<int>(b.a_block / bytes)) * s.mr;
}
// Units per thread to aim for, so that a stalled thread's share can be taken over.
constexpr int kUnitsPerThread     = 4;
constexpr double kMinThreadedWork = 1 << 18;  // below this many multiply-adds, one thread
constexpr int kMaxRanges          = 256;      // at most this many threads get a range
constexpr size_t kPageBytes       = 4096;
constexpr int kRowsPerThreadForB  = 256;

Plan make_plan(const KernelSpec& s, int M, int N, int K, int threads) {
    const size_t elem = size_t(s.elem_bytes);
    const int kcp     = round_up(std::min(s.kc, K), s.kstep);
    const int kp      = round_up(K, s.kstep);
    const Budgets b   = budgets(threads);
    int cols          = static_cast<int>(b.slice / (size_t(kcp) * elem)) / s.nr * s.nr;
    cols = std::min(cols, static_cast<int>(b.strip / (size_t(kp) * elem)) / s.nr * s.nr);
    cols = std::clamp(cols, s.nr, std::min(s.nc, round_up(N, s.nr)));
    Plan p{};
    p.threads = double(M) * N * K < kMinThreadedWork ? 1 : threads;
    p.strips  = ceil_div(N, cols);
    // Strips of (nearly) equal width: a narrow last strip would pack all of A again for a sliver
    // of the products, and leave its range's thread short of work.
    p.cols = round_up(ceil_div(N, p.strips), s.nr);
    // Row blocks: enough for kUnitsPerThread units a thread, each within its A budget, and the
    // units a multiple of the threads where the tiles allow, so that no thread is left with one
    // unit more than the other at the end of the call. The blocks share the row tiles evenly.
    // Each unit reads its strip's packed B over the whole depth: a strip larger than the slice
    // budget does not stay in L2 from one unit to the next and comes again from L3 for each, so
    // then the units are as tall as the A budget allows, one a thread where it allows (deep
    // products, the weight gradients over 2,048 tokens: bf16 on AMX 1.04-1.16x, float 1.02-1.10x;
    // docs/results.md).
    const int tiles          = ceil_div(M, s.mr);
    const int cap            = rows_cap(s, b, kcp) / s.mr;
    const size_t strip_bytes = size_t(kp) * size_t(p.cols) * elem;
    const int per_thread     = strip_bytes > b.slice ? 1 : kUnitsPerThread;
    int mblocks = std::max(ceil_div(per_thread * p.threads, p.strips), ceil_div(tiles, cap));
    mblocks     = std::min(mblocks, tiles);
    for (int more = mblocks; more <= std::min(tiles, mblocks + p.threads - 1); ++more) {
        if (p.strips * more % p.threads == 0) {
            mblocks = more;
            break;
        }
    }
    p.mblocks = mblocks;
    p.rows    = ceil_div(tiles, mblocks) * s.mr;
    // Ranges of strips split each row of C among the threads. Where a thread's share of a row
    // is under a page (4 KiB), the threads write into the same pages, and with the register
    // tiles walked row by row each core's prefetchers, which stay within a page, fetch lines
    // the other core is writing: 1024^3 and the (2,048 x 768) products of configs/default.toml
    // ran 8-18% slower in float32 than with each thread on rows of its own (docs/results.md).
    // So there the ranges are row blocks, each over every strip, and each thread packs every
    // strip of op(B): only where a thread has at least kRowsPerThreadForB rows to spread that
    // packing over. Column by column (the AVX512_BF16 kernel) was not slowed.
    p.by_rows = p.threads > 1 && p.strips > 1 && p.mblocks >= p.threads && !s.column_tiles_outer &&
                size_t(N) * sizeof(float) < size_t(p.threads) * kPageBytes &&
                M >= kRowsPerThreadForB * p.threads;
    return p;
}

// Rows [i0, i1) of row block blk: the blocks share M's row tiles evenly (the first
// tiles % mblocks blocks one tile more), at most plan.rows rows each.
std::pair<int, int> row_block(const KernelSpec& s, const Plan& p, int blk, int M) {
    const int tiles = ceil_div(M, s.mr);
    const int base = tiles / p.mblocks, extra = tiles % p.mblocks;
    const int t0 = blk * base + std::min(blk, extra);
    const int t1 = t0 + base + (blk < extra ? 1 : 0);
    return {std::min(M, t0 * s.mr), std::min(M, t1 * s.mr)};
}

// One unit: rows [i0, i1) x columns [j0, j1) of C over the whole depth, with the strip's B
// already packed in `bstrip` (k blocks one after another, each (kcp, cols rounded to nr)).
void run_unit(const KernelSpec& s, PackSrc a, const char* bstrip, int i0, int i1, int j0, int j1,
              int K, float alpha, float beta, float* C, int ldc, char* abuf) {
    const size_t elem   = size_t(s.elem_bytes);
    const int nw        = j1 - j0;
    const int nwr       = round_up(nw, s.nr);
    const int mc        = i1 - i0;
    const bool in_place = a_in_place(s, a, nw, K);
    for (int pc = 0; pc < K; pc += s.kc) {
        const int kc       = std::min(s.kc, K - pc);
        const int kcp      = round_up(kc, s.kstep);
        const float beta_k = pc == 0 ? beta : 1.0f;
        const char* bslice = bstrip + size_t(pc) * size_t(nwr) * elem;
        const int full     = prepare_a(s, a, in_place, i0, mc, pc, kc, abuf);
        for_tiles(s, mc, nw, [&](int ir, int jr, int m, int n) {
            const char* bp = bslice + size_t(jr) * size_t(kcp) * elem;
            float* cp      = C + size_t(i0 + ir) * size_t(ldc) + size_t(j0 + jr);
            a_tile(s, a, full, abuf, i0, ir, pc, kc, bp, cp, ldc, alpha, beta_k, m, n);
        });
    }
}

void pack_strip(const KernelSpec& s, PackSrc b, int j0, int j1, int K, char* dst) {
    const size_t elem = size_t(s.elem_bytes);
    const int nwr     = round_up(j1 - j0, s.nr);
    // In increasing k: a block's packer may write past its end, into the next block's place.
    for (int pc = 0; pc < K; pc += s.kc) {
        s.pack_b(b, j0, j1 - j0, pc, std::min(s.kc, K - pc), dst + size_t(pc) * size_t(nwr) * elem);
    }
}

// When more than two threads share each strip (many cores, few strips), each would pack the
// strips its range touches, so op(B) would be packed many times over. Then, if the whole of op(B)
// packed is small (it fits in L3 with room to spare), it is packed once for all threads instead:
// packing tasks (strip, k block) are taken from a counter first, each marked ready when done,
// then units of row blocks over all of N, packing A once per k block. A unit waits for a B slice
// only while another thread is still packing it. With one or two threads a strip the ranges were
// faster (a late-starting thread's slices hold up the other; docs/results.md).
constexpr size_t kSharedBBytes = size_t(4) << 20;
constexpr int kMaxPackTasks    = 256;

bool use_shared_b(const KernelSpec& s, const Plan& p, int K) {
    const size_t elem = size_t(s.elem_bytes);
    return p.threads > 2 * p.strips &&
           size_t(round_up(K, s.kstep)) * size_t(p.strips) * size_t(p.cols) * elem <=
               kSharedBBytes &&
           p.strips * ceil_div(K, s.kc) <= kMaxPackTasks;
}

void gemm_shared_b(const KernelSpec& s, const Plan& plan, PackSrc a, PackSrc b, int M, int N, int K,
                   float alpha, float beta, float* C, int ldc) {
    const size_t elem = size_t(s.elem_bytes);
    const int kblocks = ceil_div(K, s.kc);
    const int tasks   = plan.strips * kblocks;
    // Slices are spaced by the packers' slack, so that packing one never writes into another.
    const size_t kcp_max = size_t(round_up(std::min(s.kc, K), s.kstep));
    const size_t slice   = (kcp_max * size_t(plan.cols) * elem + kPackSlack + 63) / 64 * 64;
    auto* bbuf           = static_cast<char*>(t_shared_b_buffer.get(slice * size_t(tasks)));
    // Row blocks: at least kUnitsPerThread per thread, at most mc rows.
    const int rows =
        std::clamp(round_up(ceil_div(M, kUnitsPerThread * plan.threads), s.mr), s.mr, s.mc);
    const int mblocks = ceil_div(M, rows);
    std::atomic<int> next_pack{0}, next_unit{0};
    std::atomic<uint8_t> ready[kMaxPackTasks];
    for (int t = 0; t < tasks; ++t) ready[t].store(0, std::memory_order_relaxed);

    auto body = [&](int) {
        const KernelScope scope(s);
        for (int t = next_pack.fetch_add(1, std::memory_order_relaxed); t < tasks;
             t     = next_pack.fetch_add(1, std::memory_order_relaxed)) {
            const int strip = t / kblocks, pc = (t % kblocks) * s.kc;
            const int j0 = strip * plan.cols, j1 = std::min(N, j0 + plan.cols);
            s.pack_b(b, j0, j1 - j0, pc, std::min(s.kc, K - pc), bbuf + size_t(t) * slice);
            ready[t].store(1, std::memory_order_release);
        }
        auto* abuf = static_cast<char*>(t_a_buffer.get(kcp_max * size_t(rows) * elem));
        for (int u = next_unit.fetch_add(1, std::memory_order_relaxed); u < mblocks;
             u     = next_unit.fetch_add(1, std::memory_order_relaxed)) {
            const int i0 = u * rows, mc = std::min(M, i0 + rows) - i0;
            for (int kb = 0; kb < kblocks; ++kb) {
                const int pc       = kb * s.kc;
                const int kc       = std::min(s.kc, K - pc);
                const int kcp      = round_up(kc, s.kstep);
                const float beta_k = pc == 0 ? beta : 1.0f;
                s.pack_a(a, i0, mc, pc, kc, abuf);
                for (int strip = 0; strip < plan.strips; ++strip) {
                    const int t = strip * kblocks + kb;
                    for (int spin = 0; !ready[t].load(std::memory_order_acquire); ++spin) {
                        if (spin > 64) std::this_thread::yield();
                    }
                    const char* bslice = bbuf + size_t(t) * slice;
                    const int j0 = strip * plan.cols, nw = std::min(N, j0 + plan.cols) - j0;
                    for_tiles(s, mc, nw, [&](int ir, int jr, int m, int n) {
                        const char* ap = abuf + size_t(ir) * size_t(kcp) * elem;
                        const char* bp = bslice + size_t(jr) * size_t(kcp) * elem;
                        float* cp      = C + size_t(i0 + ir) * size_t(ldc) + size_t(j0 + jr);
                        s.micro(kcp, ap, bp, cp, ldc, alpha, beta_k, m, n);
                    });
                }
            }
        }
    };
    if (plan.threads == 1) {
        body(0);
    } else {
        compute_pool().run(body);
    }
}

}  // namespace

void set_blocking_caches(const CacheSizes* caches) { g_blocking_caches = caches; }

size_t b_slice_bytes() { return budgets(1).slice; }

size_t pack_buffer_bytes() { return g_pack_bytes.load(std::memory_order_relaxed); }

PackingBound packing_bound(const KernelSpec& s, const CacheSizes& caches, int threads, int max_m,
                           int max_n, int max_k, PackDriver driver) {
    PackingBound out;
    if (max_m <= 0 || max_n <= 0 || max_k <= 0) return out;
    const size_t e      = size_t(s.elem_bytes);
    const Budgets b     = budgets(caches, threads);
    const size_t kp     = size_t(round_up(max_k, s.kstep));  // whole depth
    const size_t kc     = size_t(round_up(s.kc, s.kstep));
    const size_t m_rows = size_t(round_up(max_m, s.mr));
    const size_t n_cols = size_t(round_up(max_n, s.nr));
    // the largest k block: the weight-gradient form's is a whole kc block whatever the depth
    const size_t kcp =
        driver == PackDriver::grouped_tn ? kc : size_t(round_up(std::min(s.kc, max_k), s.kstep));
    if (driver != PackDriver::packed) {
        // The grouped driver reserves for gemm_rect's largest unit whatever the rows: A, mc rows
        // of a k block; B, a strip of a k block within the slice budget (at least nr columns,
        // at most nc and N).
        out.a = pack_alloc_bytes(kcp * size_t(s.mc) * e);
        out.b = pack_alloc_bytes(std::min(std::max(b.slice, kcp * size_t(s.nr) * e),
                                          kcp * std::min(size_t(s.nc), n_cols) * e));
        return out;
    }
    // A: a unit's rows (a multiple of mr within the A budget, at least one tile) of a k block;
    // with more than two threads, the shared-B case's blocks of at most mc rows.
    const size_t a_units  = std::min(std::max(b.a_block, kcp * size_t(s.mr) * e), kcp * m_rows * e);
    const size_t a_shared = threads > 2 ? kcp * std::min(size_t(s.mc), m_rows) * e : 0;
    out.a                 = pack_alloc_bytes(std::max(a_units, a_shared));
    // B: a strip over the whole depth: at least nr columns, else as wide as both the strip
    // budget (over the depth) and the slice budget (over one k block: at most depth / kc
    // slices) allow, at most nc and N.
    const size_t nr_strip = kp * size_t(s.nr) * e;
    const size_t slices   = std::max(b.slice, b.slice * kp / kc);
    out.b = pack_alloc_bytes(std::min({std::max(b.strip, nr_strip), std::max(slices, nr_strip),
                                       kp * std::min(size_t(s.nc), n_cols) * e}));
    // The shared op(B), where more than twice as many threads as strips work on a product (so
    // at most (threads - 1) / 2 strips): its k blocks, each as deep as the first (the depth
    // rounded up to kc), over the strips' columns (N, plus up to nr - 1 of rounding a strip),
    // each k block of a strip within the slice budget (or nr columns), packed B of at most
    // kSharedBBytes over the unrounded depth (so at most twice that over the rounded one), each
    // task's slice spaced by the packers' slack and 64-byte aligned.
    if (threads > 2) {
        const size_t strips = size_t(std::max(1, (threads - 1) / 2));
        const size_t kb     = size_t(ceil_div(max_k, s.kc));
        const size_t depth  = kb > 1 ? kb * kc : kp;
        const size_t cap    = (kb > 1 ? 2 : 1) * kSharedBBytes;
        const size_t packed = std::min({cap, depth * (size_t(max_n) + strips * size_t(s.nr)) * e,
                                        strips * kb * std::max(b.slice, kcp * size_t(s.nr) * e)});
        const size_t tasks  = std::min(size_t(kMaxPackTasks), strips * kb);
        out.shared_b        = pack_alloc_bytes(packed + tasks * (size_t(kPackSlack) + 63));
    }
    return out;
}

bool ranges_by_rows(const KernelSpec& spec, int M, int N, int K, int threads) {
    return M > 0 && N > 0 && K > 0 && make_plan(spec, M, N, K, threads).by_rows;
}

void gemm_packed(const KernelSpec& spec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                 const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    const PackSrc a{A, lda, ta == Trans::N};
    const PackSrc b{B, ldb, tb == Trans::T};
    ThreadPool& pool = compute_pool();
    const Plan p     = make_plan(spec, M, N, K, pool.size());
    if (use_shared_b(spec, p, K)) {
        gemm_shared_b(spec, p, a, b, M, N, K, alpha, beta, C, ldc);
        return;
    }
    const int units   = p.strips * p.mblocks;
    const size_t elem = size_t(spec.elem_bytes);
    struct alignas(64) Range {  // units [next, end) not taken yet; a cache line each
        std::atomic<int> next;
        int end;
        int b0, nb;  // by rows: the range's row blocks [b0, b0 + nb), strip by strip
    };
    const int nranges = std::min({p.threads, p.by_rows ? p.mblocks : units, kMaxRanges});
    Range ranges[kMaxRanges];
    for (int r = 0; r < nranges; ++r) {
        if (p.by_rows) {
            const int b0 = p.mblocks * r / nranges, b1 = p.mblocks * (r + 1) / nranges;
            ranges[r].next.store(p.strips * b0, std::memory_order_relaxed);
            ranges[r].end = p.strips * b1;
            ranges[r].b0  = b0;
            ranges[r].nb  = b1 - b0;
        } else {
            ranges[r].next.store(int(int64_t(units) * r / nranges), std::memory_order_relaxed);
            ranges[r].end = int(int64_t(units) * (r + 1) / nranges);
            ranges[r].b0 = ranges[r].nb = 0;
        }
    }
    auto body = [&](int tid) {
        const KernelScope scope(spec);
        auto* bbuf = static_cast<char*>(
            t_b_buffer.get(size_t(round_up(K, spec.kstep)) * size_t(p.cols) * elem));
        auto* abuf = static_cast<char*>(t_a_buffer.get(
            size_t(round_up(std::min(spec.kc, K), spec.kstep)) * size_t(p.rows) * elem));
        int packed = -1;  // strip whose B is in bbuf
        for (int i = 0; i < nranges; ++i) {
            Range& range = ranges[(tid + i) % nranges];
            for (int u = range.next.fetch_add(1, std::memory_order_relaxed); u < range.end;
                 u     = range.next.fetch_add(1, std::memory_order_relaxed)) {
                // by rows, the units of a range are numbered strip by strip over its row blocks
                const int w     = p.by_rows ? u - p.strips * range.b0 : u;
                const int nb    = p.by_rows ? range.nb : p.mblocks;
                const int strip = w / nb, blk = (p.by_rows ? range.b0 : 0) + w % nb;
                const int j0 = strip * p.cols, j1 = std::min(N, j0 + p.cols);
                const auto [i0, i1] = row_block(spec, p, blk, M);
                if (strip != packed) {
                    pack_strip(spec, b, j0, j1, K, bbuf);
                    packed = strip;
                }
                run_unit(spec, a, bbuf, i0, i1, j0, j1, K, alpha, beta, C, ldc, abuf);
            }
        }
    };
    if (p.threads == 1 || units == 1) {
        body(0);
    } else {
        pool.run(body);
    }
}

}  // namespace bagualu::kernels::gemm

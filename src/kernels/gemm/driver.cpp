// Goto/BLIS blocked GEMM: per thread, jc (NC) -> pc (KC) -> pack B -> ic (MC) -> pack A ->
// jr (NR) -> ir (MR) -> micro-kernel. Threads own disjoint rectangles of C, so they share nothing
// and need no barrier; packing buffers are per thread, 64-byte aligned and grow-only.
#include "kernels/gemm/driver.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/thread_pool.h"

namespace bagualu::kernels::gemm {

namespace {

class PackBuffer {
   public:
    PackBuffer() = default;
    ~PackBuffer() { std::free(data_); }
    PackBuffer(const PackBuffer&)            = delete;
    PackBuffer& operator=(const PackBuffer&) = delete;

    void* get(size_t bytes) {
        if (bytes > capacity_) {
            const size_t rounded = (bytes + kPackSlack + 63) / 64 * 64;
            void*        p       = std::aligned_alloc(64, rounded);
            if (!p) throw std::bad_alloc();
            std::free(data_);
            data_     = p;
            capacity_ = rounded - kPackSlack;
        }
        return data_;
    }

   private:
    void*  data_     = nullptr;
    size_t capacity_ = 0;
};

thread_local PackBuffer t_a_buffer;
thread_local PackBuffer t_b_buffer;

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

// [begin, end) of part `i` of `parts` when n items are dealt out in whole units of `unit`.
struct Range {
    int begin, end;
};
Range split(int n, int unit, int parts, int i) {
    const int64_t units = ceil_div(n, unit);
    const int     b     = static_cast<int>(units * i / parts) * unit;
    const int     e     = static_cast<int>(units * (i + 1) / parts) * unit;
    return {std::min(b, n), std::min(e, n)};
}

struct Grid {
    int tm, tn;
};

// Threads tm x tn over (M, N) minimising the slowest thread's time, modelled as its register
// tiles times the tile cost plus its packing (each packed element costs about as much as
// `kPackCost` multiply-adds). Fewer threads win ties; tiny problems run on one thread.
Grid choose_grid(const KernelSpec& s, int M, int N, int K, int threads) {
    constexpr double kPackCost = 16.0;
    constexpr double kMinWork  = 1 << 18;  // below this many multiply-adds, one thread
    if (threads <= 1 || double(M) * N * K < kMinWork) return {1, 1};
    const int mb   = ceil_div(M, s.mr);
    const int nb   = ceil_div(N, s.nr);
    Grid      best = {1, 1};
    double    best_cost = 0.0;
    for (int t = 1; t <= threads; ++t) {
        for (int tm = 1; tm <= t; ++tm) {
            if (t % tm != 0) continue;
            const int tn = t / tm;
            if (tm > mb || tn > nb) continue;
            const double rows  = double(ceil_div(mb, tm)) * s.mr;
            const double cols  = double(ceil_div(nb, tn)) * s.nr;
            const double a_packs = ceil_div(static_cast<int>(cols), s.nc);
            const double cost =
                rows * cols * K + kPackCost * K * (rows * a_packs + cols);
            if (t == 1 || cost < best_cost * 0.98) {
                best      = {tm, tn};
                best_cost = cost;
            }
        }
    }
    return best;
}

void gemm_rect(const KernelSpec& s, PackSrc a, PackSrc b, int m0, int m1, int n0, int n1, int K,
               float alpha, float beta, float* C, int ldc) {
    const size_t elem   = static_cast<size_t>(s.elem_bytes);
    const int    kc_max = round_up(std::min(s.kc, K), s.kstep);
    const int    nc_max = std::min(s.nc, round_up(n1 - n0, s.nr));
    const int    mc_max = std::min(s.mc, round_up(m1 - m0, s.mr));
    auto* bbuf = static_cast<char*>(t_b_buffer.get(size_t(kc_max) * size_t(nc_max) * elem));
    auto* abuf = static_cast<char*>(t_a_buffer.get(size_t(kc_max) * size_t(mc_max) * elem));

    for (int jc = n0; jc < n1; jc += s.nc) {
        const int nc = std::min(s.nc, n1 - jc);
        for (int pc = 0; pc < K; pc += s.kc) {
            const int   kc     = std::min(s.kc, K - pc);
            const int   kcp    = round_up(kc, s.kstep);
            const float beta_k = pc == 0 ? beta : 1.0f;
            s.pack_b(b, jc, nc, pc, kc, bbuf);
            for (int ic = m0; ic < m1; ic += s.mc) {
                const int mc = std::min(s.mc, m1 - ic);
                s.pack_a(a, ic, mc, pc, kc, abuf);
                for (int jr = 0; jr < nc; jr += s.nr) {
                    const char* bp = bbuf + size_t(jr) * size_t(kcp) * elem;
                    const int   n  = std::min(s.nr, nc - jr);
                    for (int ir = 0; ir < mc; ir += s.mr) {
                        const char* ap = abuf + size_t(ir) * size_t(kcp) * elem;
                        float*      cp = C + size_t(ic + ir) * size_t(ldc) + size_t(jc + jr);
                        s.micro(kcp, ap, bp, cp, ldc, alpha, beta_k, std::min(s.mr, mc - ir), n);
                    }
                }
            }
        }
    }
}

}  // namespace

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

void gemm_packed(const KernelSpec& spec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                 const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    const PackSrc a{A, lda, ta == Trans::N};
    const PackSrc b{B, ldb, tb == Trans::T};
    ThreadPool&   pool = compute_pool();
    const Grid    g    = choose_grid(spec, M, N, K, pool.size());
    auto          body = [&](int tid) {
        if (tid >= g.tm * g.tn) return;
        const Range rows = split(M, spec.mr, g.tm, tid / g.tn);
        const Range cols = split(N, spec.nr, g.tn, tid % g.tn);
        if (rows.begin >= rows.end || cols.begin >= cols.end) return;
        gemm_rect(spec, a, b, rows.begin, rows.end, cols.begin, cols.end, K, alpha, beta, C, ldc);
    };
    if (g.tm * g.tn == 1) {
        body(0);
    } else {
        pool.run(body);
    }
}

}  // namespace bagualu::kernels::gemm

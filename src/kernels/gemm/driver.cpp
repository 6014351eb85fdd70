// Goto/BLIS blocked GEMM: per thread, jc (NC) -> pc (KC) -> pack B -> ic (MC) -> pack A ->
// jr (NR) -> ir (MR) -> micro-kernel. Threads own disjoint rectangles of C, so they share nothing
// and need no barrier; packing buffers are per thread, 64-byte aligned and grow-only (allocated
// with operator new, so allocation counters see them).
#include "kernels/gemm/driver.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

#include "core/thread_pool.h"

namespace bagualu::kernels::gemm {

namespace {

class PackBuffer {
   public:
    PackBuffer() = default;
    ~PackBuffer() { release(); }
    PackBuffer(const PackBuffer&)            = delete;
    PackBuffer& operator=(const PackBuffer&) = delete;

    void* get(size_t bytes) {
        if (bytes > capacity_) {
            const size_t rounded = (bytes + kPackSlack + 63) / 64 * 64;
            void*        p       = ::operator new(rounded, std::align_val_t{64});
            release();
            data_     = p;
            capacity_ = rounded - kPackSlack;
        }
        return data_;
    }

   private:
    void release() {
        if (data_) ::operator delete(data_, std::align_val_t{64});
        data_ = nullptr;
    }

    void*  data_     = nullptr;
    size_t capacity_ = 0;
};

thread_local PackBuffer t_a_buffer;
thread_local PackBuffer t_b_buffer;

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

Range split(int n, int unit, int parts, int i) {
    const int64_t units = ceil_div(n, unit);
    const int     b     = static_cast<int>(units * i / parts) * unit;
    const int     e     = static_cast<int>(units * (i + 1) / parts) * unit;
    return {std::min(b, n), std::min(e, n)};
}

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
    const size_t elem = static_cast<size_t>(s.elem_bytes);
    auto*        bbuf = static_cast<char*>(t_b_buffer.get(b_pack_bytes(s, n1 - n0, K)));
    auto*        abuf = static_cast<char*>(t_a_buffer.get(a_pack_bytes(s, m1 - m0, K)));

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

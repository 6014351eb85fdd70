// Ring and recursive halving/doubling reduce-scatter (online mean) and all-gather on top of
// Comm::sendrecv. See collectives.h for the contract. Scratch buffers are per thread and only
// grow, so repeated calls (every training step) do not allocate or page-fault again.
#include "dist/comm/collectives.h"

#include <bit>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/comm/counters.h"
#include "dist/comm/half.h"

namespace bagualu::dist {

namespace {

// ---- payload dtypes: storage type + float32 load/store ----

struct F32 {
    using T = float;
    static float load(float v) { return v; }
    static float store(float v) { return v; }
};
struct Bf16 {
    using T = uint16_t;
    static float load(uint16_t v) { return detail::float_from_bf16(v); }
    static uint16_t store(float v) { return detail::bf16_from_float(v); }
};
struct Fp16 {
    using T = uint16_t;
    static float load(uint16_t v) { return detail::float_from_fp16(v); }
    static uint16_t store(float v) { return detail::fp16_from_float(v); }
};

template <typename D>
void fold(typename D::T* out, const typename D::T* mean, const typename D::T* x, size_t n,
          float w) {
    for (size_t i = 0; i < n; ++i) {
        const float m = D::load(mean[i]);
        out[i]        = D::store(m + (D::load(x[i]) - m) * w);
    }
}

// Start of shard k of n over P, for k in [0, P]; floor(n*k/P) without overflowing n*k.
size_t bound(size_t n, int k, int P) {
    const auto uk = static_cast<size_t>(k);
    const auto up = static_cast<size_t>(P);
    return (n / up) * uk + (n % up) * uk / up;
}

bool is_pow2(int p) { return p > 0 && std::has_single_bit(static_cast<unsigned>(p)); }

// Per-thread scratch, grown on demand; slot selects one of a few independent buffers.
template <typename T>
T* scratch(int slot, size_t n) {
    thread_local std::vector<std::byte> bufs[3];
    auto& b = bufs[slot];
    if (b.size() < n * sizeof(T)) b.resize(n * sizeof(T));
    return reinterpret_cast<T*>(b.data());
}

template <typename T>
void exchange(Comm& comm, const T* send, size_t send_n, int dest, T* recv, size_t recv_n, int src) {
    comm.sendrecv(send, send_n * sizeof(T), dest, recv, recv_n * sizeof(T), src);
}

// ---- reduce-scatter (mean) ----

// Step s sends chunk (r-s-1) to r+1 and receives chunk (r-s-2) from r-1, which holds the mean of
// s+1 contributions; folding the local value makes s+2. After P-1 steps chunk r holds all P.
template <typename D>
void reduce_scatter_ring(Comm& comm, const typename D::T* in, size_t n, typename D::T* out) {
    using T                = typename D::T;
    const int P            = comm.size();
    const int r            = comm.rank();
    const int rt           = (r + 1) % P;
    const int lt           = (r - 1 + P) % P;
    const size_t max_chunk = n / static_cast<size_t>(P) + 1;
    T* recv                = scratch<T>(0, max_chunk);
    T* acc                 = scratch<T>(1, max_chunk);
    const T* send          = nullptr;
    for (int s = 0; s < P - 1; ++s) {
        const int cs     = ((r - s - 1) % P + P) % P;
        const int cr     = ((r - s - 2) % P + P) % P;
        const size_t so  = bound(n, cs, P);
        const size_t sn  = bound(n, cs + 1, P) - so;
        const size_t ro  = bound(n, cr, P);
        const size_t rn  = bound(n, cr + 1, P) - ro;
        const T* payload = s == 0 ? in + so : send;
        exchange(comm, payload, sn, rt, recv, rn, lt);
        T* dst = s == P - 2 ? out : acc;
        fold<D>(dst, recv, in + ro, rn, 1.0f / static_cast<float>(s + 2));
        send = acc;
    }
}

// Level with m = 2d ranks in the group [g, g+m): keep the half holding r, send the other half
// to r ^ d, fold the partner's half (same count of contributions) with weight 1/2.
template <typename D>
void reduce_scatter_halving(Comm& comm, const typename D::T* in, size_t n, typename D::T* out) {
    using T       = typename D::T;
    const int P   = comm.size();
    const int r   = comm.rank();
    T* work[2]    = {scratch<T>(0, n / 2 + 1), scratch<T>(1, n / 2 + 1)};
    T* recv       = scratch<T>(2, n / 2 + 1);
    const T* cur  = in;  // holds elements [bound(g), bound(g + m)) at offset 0
    size_t cur_lo = 0;
    int g         = 0;
    int flip      = 0;
    for (int d = P / 2; d >= 1; d /= 2) {
        const int partner    = r ^ d;
        const bool low       = r < g + d;
        const int keep_g     = low ? g : g + d;
        const int send_g     = low ? g + d : g;
        const size_t keep_lo = bound(n, keep_g, P);
        const size_t keep_n  = bound(n, keep_g + d, P) - keep_lo;
        const size_t send_lo = bound(n, send_g, P);
        const size_t send_n  = bound(n, send_g + d, P) - send_lo;
        exchange(comm, cur + (send_lo - cur_lo), send_n, partner, recv, keep_n, partner);
        T* dst = d == 1 ? out : work[flip];
        fold<D>(dst, cur + (keep_lo - cur_lo), recv, keep_n, 0.5f);
        cur    = dst;
        cur_lo = keep_lo;
        g      = keep_g;
        flip ^= 1;
    }
}

template <typename D>
void reduce_scatter_mean_impl(Comm& comm, std::span<const typename D::T> in,
                              std::span<typename D::T> out, CollAlgo algo) {
    using T           = typename D::T;
    const int P       = comm.size();
    const size_t n    = in.size();
    const ShardInfo s = shard_of(n, comm.rank(), P);
    BGL_CHECK(out.size() == s.size, "reduce_scatter_mean: out has {} elements, shard is {}",
              out.size(), s.size);
    count_comm(CommKind::reduce_scatter, n * sizeof(T));
    if (P == 1) {
        if (n > 0 && out.data() != in.data()) std::memmove(out.data(), in.data(), n * sizeof(T));
        return;
    }
    if (resolve_algo(algo, P, n * sizeof(T)) == CollAlgo::ring) {
        reduce_scatter_ring<D>(comm, in.data(), n, out.data());
    } else {
        reduce_scatter_halving<D>(comm, in.data(), n, out.data());
    }
}

// ---- all-gather ----

template <typename T>
void all_gather_impl(Comm& comm, std::span<const T> shard, std::span<T> out, CollAlgo algo) {
    const int P       = comm.size();
    const int r       = comm.rank();
    const size_t n    = out.size();
    const ShardInfo s = shard_of(n, r, P);
    BGL_CHECK(shard.size() == s.size, "all_gather: shard has {} elements, expected {}",
              shard.size(), s.size);
    count_comm(CommKind::all_gather, n * sizeof(T));
    if (s.size > 0 && shard.data() != out.data() + s.offset) {
        std::memmove(out.data() + s.offset, shard.data(), s.size * sizeof(T));
    }
    if (P == 1) return;
    T* o = out.data();
    if (resolve_algo(algo, P, n * sizeof(T)) == CollAlgo::ring) {
        // Step s forwards chunk (r-s) to r+1 and receives chunk (r-s-1) from r-1.
        const int rt = (r + 1) % P;
        const int lt = (r - 1 + P) % P;
        for (int st = 0; st < P - 1; ++st) {
            const int cs    = ((r - st) % P + P) % P;
            const int cr    = ((r - st - 1) % P + P) % P;
            const size_t so = bound(n, cs, P);
            const size_t ro = bound(n, cr, P);
            exchange(comm, o + so, bound(n, cs + 1, P) - so, rt, o + ro, bound(n, cr + 1, P) - ro,
                     lt);
        }
        return;
    }
    // Doubling: at distance d, this rank's group [g, g+d) swaps with the partner's group.
    for (int d = 1; d < P; d *= 2) {
        const int g         = r & ~(d - 1);
        const int pg        = g ^ d;
        const size_t mine   = bound(n, g, P);
        const size_t theirs = bound(n, pg, P);
        exchange(comm, o + mine, bound(n, g + d, P) - mine, r ^ d, o + theirs,
                 bound(n, pg + d, P) - theirs, r ^ d);
    }
}

}  // namespace

CollAlgo resolve_algo(CollAlgo algo, int P, size_t bytes) {
    if (algo == CollAlgo::halving_doubling) {
        BGL_CHECK(is_pow2(P), "halving/doubling needs a power-of-two number of ranks, got {}", P);
        return algo;
    }
    if (algo == CollAlgo::ring) return algo;
    return is_pow2(P) && bytes <= kSmallMessageBytes ? CollAlgo::halving_doubling : CollAlgo::ring;
}

int sendrecv_hops(CollAlgo resolved, int P) {
    if (P <= 1) return 0;
    if (resolved == CollAlgo::ring) return P - 1;
    BGL_CHECK(resolved == CollAlgo::halving_doubling && is_pow2(P), "sendrecv_hops: unresolved algorithm or P = {}", P);
    return std::countr_zero(static_cast<unsigned>(P));
}

ShardInfo shard_of(size_t n, int rank, int P) {
    BGL_CHECK(P > 0 && rank >= 0 && rank < P, "shard_of: rank {} of {}", rank, P);
    const size_t lo = bound(n, rank, P);
    return {lo, bound(n, rank + 1, P) - lo};
}

void fold_mean(float* out, const float* mean, const float* x, size_t n, float w) {
    fold<F32>(out, mean, x, n, w);
}
void fold_mean_bf16(uint16_t* out, const uint16_t* mean, const uint16_t* x, size_t n, float w) {
    fold<Bf16>(out, mean, x, n, w);
}
void fold_mean_fp16(uint16_t* out, const uint16_t* mean, const uint16_t* x, size_t n, float w) {
    fold<Fp16>(out, mean, x, n, w);
}

void reduce_scatter_mean(Comm& comm, std::span<const float> in, std::span<float> out,
                         CollAlgo algo) {
    reduce_scatter_mean_impl<F32>(comm, in, out, algo);
}
void reduce_scatter_mean_bf16(Comm& comm, std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo) {
    reduce_scatter_mean_impl<Bf16>(comm, in, out, algo);
}
void reduce_scatter_mean_fp16(Comm& comm, std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo) {
    reduce_scatter_mean_impl<Fp16>(comm, in, out, algo);
}

void all_gather(Comm& comm, std::span<const float> shard, std::span<float> out, CollAlgo algo) {
    all_gather_impl<float>(comm, shard, out, algo);
}
void all_gather(Comm& comm, std::span<const uint16_t> shard, std::span<uint16_t> out,
                CollAlgo algo) {
    all_gather_impl<uint16_t>(comm, shard, out, algo);
}

void allreduce_mean(Comm& comm, std::span<float> data, CollAlgo algo) {
    const ShardInfo s = shard_of(data.size(), comm.rank(), comm.size());
    const auto shard  = data.subspan(s.offset, s.size);
    reduce_scatter_mean(comm, data, shard, algo);
    all_gather(comm, shard, data, algo);
}
void allreduce_mean_bf16(Comm& comm, std::span<uint16_t> data, CollAlgo algo) {
    const ShardInfo s = shard_of(data.size(), comm.rank(), comm.size());
    const auto shard  = data.subspan(s.offset, s.size);
    reduce_scatter_mean_bf16(comm, data, shard, algo);
    all_gather(comm, std::span<const uint16_t>(shard), data, algo);
}
void allreduce_mean_fp16(Comm& comm, std::span<uint16_t> data, CollAlgo algo) {
    const ShardInfo s = shard_of(data.size(), comm.rank(), comm.size());
    const auto shard  = data.subspan(s.offset, s.size);
    reduce_scatter_mean_fp16(comm, data, shard, algo);
    all_gather(comm, std::span<const uint16_t>(shard), data, algo);
}

}  // namespace bagualu::dist

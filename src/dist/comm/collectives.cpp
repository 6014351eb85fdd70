// Ring and recursive halving/doubling reduce-scatter (online mean) and all-gather on top of
// Comm::sendrecv. See collectives.h for the contract. Scratch buffers are per thread and only
// grow, so repeated calls (every training step) do not allocate or page-fault again.
#include "dist/comm/collectives.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/comm/alltoallv.h"
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

// Halving/doubling over any P (collectives.h): p2 = bit_floor(P) virtual ranks; ranks 2v, 2v+1
// (v < extra) are virtual rank v, run by 2v + 1; rank q >= 2 extra is virtual rank q - extra.
struct Virtual {
    int p2, extra;
    explicit Virtual(int P)
        : p2(static_cast<int>(std::bit_floor(static_cast<unsigned>(P)))), extra(P - p2) {}
    int active(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
    int first(int v) const { return v < extra ? 2 * v : v + extra; }
    int of(int q) const { return q < 2 * extra ? q / 2 : q - extra; }
    bool paired(int q) const { return q < 2 * extra; }
    // Contributions held by virtual rank v entering the level of distance d: those of the
    // virtual ranks u = v (mod 2d), two for u < extra, one otherwise.
    int held(int v, int d) const {
        const int s = v & (2 * d - 1), step = 2 * d;
        return p2 / step + (extra > s ? (extra - s + step - 1) / step : 0);
    }
    // The fold weight of virtual rank v at distance d: its partner's share of the two halves.
    float weight(int v, int d) const {
        const int mine = held(v, d), theirs = held(v ^ d, d);
        return static_cast<float>(theirs) / static_cast<float>(mine + theirs);
    }
    // bounds of the virtual ranks' chunks: vb[v] = bd[first(v)], vb[p2] = bd[P]
    const size_t* bounds(const size_t* bd) const {
        thread_local std::vector<size_t> vb;
        vb.resize(static_cast<size_t>(p2) + 1);
        for (int v = 0; v < p2; ++v) vb[static_cast<size_t>(v)] = bd[first(v)];
        vb[static_cast<size_t>(p2)] = bd[p2 + extra];
        return vb.data();
    }
};

// Per-thread scratch, grown on demand; slot selects one of a few independent buffers.
template <typename T>
T* scratch(int slot, size_t n) {
    thread_local std::vector<std::byte> bufs[5];  // 0-2: one level, 3-4: over nodes
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
// bd: [P + 1], chunk k is [bd[k], bd[k + 1]).
template <typename D>
void reduce_scatter_ring(Comm& comm, const typename D::T* in, const size_t* bd,
                         typename D::T* out) {
    using T          = typename D::T;
    const int P      = comm.size();
    const int r      = comm.rank();
    const int rt     = (r + 1) % P;
    const int lt     = (r - 1 + P) % P;
    size_t max_chunk = 1;
    for (int k = 0; k < P; ++k) max_chunk = std::max(max_chunk, bd[k + 1] - bd[k]);
    T* recv       = scratch<T>(0, max_chunk);
    T* acc        = scratch<T>(1, max_chunk);
    const T* send = nullptr;
    for (int s = 0; s < P - 1; ++s) {
        const int cs     = ((r - s - 1) % P + P) % P;
        const int cr     = ((r - s - 2) % P + P) % P;
        const size_t so  = bd[cs];
        const size_t sn  = bd[cs + 1] - so;
        const size_t ro  = bd[cr];
        const size_t rn  = bd[cr + 1] - ro;
        const T* payload = s == 0 ? in + so : send;
        exchange(comm, payload, sn, rt, recv, rn, lt);
        T* dst = s == P - 2 ? out : acc;
        fold<D>(dst, recv, in + ro, rn, 1.0f / static_cast<float>(s + 2));
        send = acc;
    }
}

// Level with m = 2d virtual ranks in the group [g, g+m): keep the half holding v, send the other
// half to v ^ d, fold the partner's half with the partner's share of the contributions (1/2 over
// a power of two). A paired rank first takes its even mate's array, half by half, and folds it
// in (weight 1/2); it ends by sending the mate its shard (collectives.h).
template <typename D>
void reduce_scatter_halving(Comm& comm, const typename D::T* in, const size_t* bd,
                            typename D::T* out) {
    using T     = typename D::T;
    const int P = comm.size();
    const int r = comm.rank();
    const Virtual V(P);
    const size_t* vb = V.bounds(bd);
    const int v      = V.of(r);
    const int d0     = V.p2 / 2;
    // the first level's halves of virtual rank v (an idle mate sends them in this order)
    const bool low0       = v < d0;
    const size_t send0_lo = vb[low0 ? d0 : 0], send0_n = vb[low0 ? V.p2 : d0] - send0_lo;
    const size_t keep0_lo = vb[low0 ? 0 : d0], keep0_n = vb[low0 ? d0 : V.p2] - keep0_lo;
    if (V.paired(r) && r % 2 == 0) {
        exchange<T>(comm, in + send0_lo, send0_n, r + 1, nullptr, 0, r + 1);
        exchange<T>(comm, in + keep0_lo, keep0_n, r + 1, nullptr, 0, r + 1);
        exchange<T>(comm, nullptr, 0, r + 1, out, bd[r + 1] - bd[r], r + 1);
        return;
    }
    size_t half = 1;  // the most floats one level keeps or sends
    for (int d = d0; d >= 1; d /= 2) {
        for (int g = 0; g < V.p2; g += d) half = std::max(half, vb[g + d] - vb[g]);
    }
    T* work[2]     = {scratch<T>(0, half), scratch<T>(1, half)};
    T* recv        = scratch<T>(2, half);
    const T* cur   = in;  // holds elements [vb[g], vb[g + m]) at offset cur_lo
    size_t cur_lo  = 0;
    int g          = 0;
    int flip       = 0;
    const T* mine0 = nullptr;  // a paired rank's first kept half, the mate's folded in
    const T* send0 = nullptr;
    if (V.paired(r)) {
        exchange<T>(comm, nullptr, 0, r - 1, recv, send0_n, r - 1);
        fold<D>(work[0], in + send0_lo, recv, send0_n, 0.5f);
        exchange<T>(comm, nullptr, 0, r - 1, recv, keep0_n, r - 1);
        fold<D>(work[1], in + keep0_lo, recv, keep0_n, 0.5f);
        send0 = work[0];
        mine0 = work[1];
    }
    const bool whole_out = !V.paired(r);  // the last level writes out (a pair's: both shards)
    for (int d = d0; d >= 1; d /= 2) {
        const int partner    = V.active(v ^ d);
        const bool low       = v < g + d;
        const int keep_g     = low ? g : g + d;
        const int send_g     = low ? g + d : g;
        const size_t keep_lo = vb[keep_g];
        const size_t keep_n  = vb[keep_g + d] - keep_lo;
        const size_t send_lo = vb[send_g];
        const size_t send_n  = vb[send_g + d] - send_lo;
        const T* payload     = send0 && d == d0 ? send0 : cur + (send_lo - cur_lo);
        const T* mine        = mine0 && d == d0 ? mine0 : cur + (keep_lo - cur_lo);
        exchange(comm, payload, send_n, partner, recv, keep_n, partner);
        // (a pair's first level folds into work[1], where its kept half already is)
        T* dst = d == 1 && whole_out ? out : mine0 && d == d0 ? work[1] : work[flip];
        fold<D>(dst, mine, recv, keep_n, V.weight(v, d));
        cur    = dst;
        cur_lo = keep_lo;
        g      = keep_g;
        flip   = dst == work[0] ? 1 : 0;
    }
    if (V.paired(r)) {  // cur: the chunks of r - 1 and r
        exchange<T>(comm, cur + (bd[r - 1] - cur_lo), bd[r] - bd[r - 1], r - 1, nullptr, 0, r - 1);
        const size_t own = bd[r + 1] - bd[r];
        if (own > 0) std::memmove(out, cur + (bd[r] - cur_lo), own * sizeof(T));
    }
}

// Chunk bounds of an n-element array over P ranks: bd[k] = bound(n, k, P), k in [0, P].
std::vector<size_t>& even_bounds(int slot, size_t n, int P) {
    thread_local std::vector<size_t> bds[2];
    auto& bd = bds[slot];
    bd.resize(static_cast<size_t>(P) + 1);
    for (int k = 0; k <= P; ++k) bd[static_cast<size_t>(k)] = bound(n, k, P);
    return bd;
}

// One level: the chunks bd over comm, resolved for a whole array of `bytes`.
template <typename D>
void reduce_scatter_level(Comm& comm, const typename D::T* in, const size_t* bd, typename D::T* out,
                          CollAlgo algo, size_t bytes) {
    const int P = comm.size();
    if (P == 1) {
        const size_t len = bd[1] - bd[0];
        if (len > 0 && out != in + bd[0]) std::memmove(out, in + bd[0], len * sizeof(*in));
        return;
    }
    if (resolve_algo(algo, P, bytes) == CollAlgo::ring) {
        reduce_scatter_ring<D>(comm, in, bd, out);
    } else {
        reduce_scatter_halving<D>(comm, in, bd, out);
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
    reduce_scatter_level<D>(comm, in.data(), even_bounds(0, n, P).data(), out.data(), algo,
                            n * sizeof(T));
}

// ---- all-gather ----

// One level: this rank's chunk [bd[r], bd[r + 1]) of o is in place; every chunk afterwards.
template <typename T>
void all_gather_level(Comm& comm, T* o, const size_t* bd, CollAlgo algo, size_t bytes) {
    const int P = comm.size();
    const int r = comm.rank();
    if (P == 1) return;
    if (resolve_algo(algo, P, bytes) == CollAlgo::ring) {
        // Step s forwards chunk (r-s) to r+1 and receives chunk (r-s-1) from r-1.
        const int rt = (r + 1) % P;
        const int lt = (r - 1 + P) % P;
        for (int st = 0; st < P - 1; ++st) {
            const int cs = ((r - st) % P + P) % P;
            const int cr = ((r - st - 1) % P + P) % P;
            exchange(comm, o + bd[cs], bd[cs + 1] - bd[cs], rt, o + bd[cr], bd[cr + 1] - bd[cr],
                     lt);
        }
        return;
    }
    // Doubling over the virtual ranks: at distance d, this rank's group [g, g+d) swaps with the
    // partner's group; a pair's even rank hands its shard over first and gets everything last.
    const Virtual V(P);
    const size_t* vb = V.bounds(bd);
    if (V.paired(r) && r % 2 == 0) {
        exchange(comm, o + bd[r], bd[r + 1] - bd[r], r + 1, static_cast<T*>(nullptr), 0, r + 1);
        exchange(comm, static_cast<const T*>(nullptr), 0, r + 1, o + bd[0], bd[P] - bd[0], r + 1);
        return;
    }
    if (V.paired(r)) {
        exchange(comm, static_cast<const T*>(nullptr), 0, r - 1, o + bd[r - 1], bd[r] - bd[r - 1],
                 r - 1);
    }
    const int v = V.of(r);
    for (int d = 1; d < V.p2; d *= 2) {
        const int g       = v & ~(d - 1);
        const int pg      = g ^ d;
        const int partner = V.active(v ^ d);
        exchange(comm, o + vb[g], vb[g + d] - vb[g], partner, o + vb[pg], vb[pg + d] - vb[pg],
                 partner);
    }
    if (V.paired(r)) {
        exchange(comm, o + bd[0], bd[P] - bd[0], r - 1, static_cast<T*>(nullptr), 0, r - 1);
    }
}

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
    all_gather_level<T>(comm, out.data(), even_bounds(0, n, P).data(), algo, n * sizeof(T));
}

// ---- over nodes (collectives.h, "over nodes") ----

// Shard bounds of an n-element array over a comm of layout lay, and the same shards placed
// node-rank-major: the permuted array holds the chunks of ranks (node rank 0, node 0),
// (0, 1), ..., (1, 0), ..., so each node rank's region (its shards on every node) is contiguous.
struct NodePlan {
    std::vector<size_t> world;    // [P + 1] shard_of bounds
    std::vector<size_t> perm_at;  // [P] where rank q's shard starts in the permuted array
    std::vector<size_t> intra;    // [L + 1] the node ranks' regions in the permuted array
    std::vector<size_t> cross;    // [N + 1] this rank's region cut by node, region-relative
    size_t region = 0;            // elements of this rank's region
};

NodePlan node_plan(const NodeLayout& lay, size_t n, int P, int local) {
    const int N = lay.nodes, L = lay.per_node;
    NodePlan p;
    p.world.resize(static_cast<size_t>(P) + 1);
    for (int k = 0; k <= P; ++k) p.world[static_cast<size_t>(k)] = bound(n, k, P);
    p.perm_at.resize(static_cast<size_t>(P));
    p.intra.resize(static_cast<size_t>(L) + 1);
    size_t at = 0;
    for (int l = 0; l < L; ++l) {
        p.intra[static_cast<size_t>(l)] = at;
        for (int v = 0; v < N; ++v) {
            const auto q = static_cast<size_t>(lay.members[static_cast<size_t>(v * L + l)]);
            p.perm_at[q] = at;
            at += p.world[q + 1] - p.world[q];
        }
    }
    p.intra[static_cast<size_t>(L)] = at;
    const size_t base               = p.intra[static_cast<size_t>(local)];
    p.cross.resize(static_cast<size_t>(N) + 1);
    for (int v = 0; v < N; ++v) {
        const auto q = static_cast<size_t>(lay.members[static_cast<size_t>(v * L + local)]);
        p.cross[static_cast<size_t>(v)] = p.perm_at[q] - base;
    }
    p.region                        = p.intra[static_cast<size_t>(local) + 1] - base;
    p.cross[static_cast<size_t>(N)] = p.region;
    return p;
}

template <typename D>
void reduce_scatter_two_level(const NodeLayout& lay, const typename D::T* in, size_t n,
                              typename D::T* out, CollAlgo algo, int P) {
    using T          = typename D::T;
    const NodePlan p = node_plan(lay, n, P, lay.node->rank());
    T* perm          = scratch<T>(3, n);
    for (size_t q = 0; q < static_cast<size_t>(P); ++q) {
        const size_t len = p.world[q + 1] - p.world[q];
        if (len > 0) std::memcpy(perm + p.perm_at[q], in + p.world[q], len * sizeof(T));
    }
    T* mid = scratch<T>(4, p.region);
    reduce_scatter_level<D>(*lay.node, perm, p.intra.data(), mid, algo, n * sizeof(T));
    reduce_scatter_level<D>(*lay.cross, mid, p.cross.data(), out, algo, p.region * sizeof(T));
}

// The mean of v[0..K) as reduce_scatter_level computes it for the chunk of rank `owner` of K
// with the resolved algorithm a, the same folds in the same order. v is overwritten.
template <typename D>
typename D::T mean_as(typename D::T* v, typename D::T* tmp, int K, int owner, CollAlgo a) {
    using T = typename D::T;
    if (K == 1) return v[0];
    if (a == CollAlgo::ring) {  // chain from owner + 1 around to the owner, weights 1/j
        T m = v[(owner + 1) % K];
        for (int j = 2; j <= K; ++j) {
            fold<D>(&m, &m, &v[(owner + j) % K], 1, 1.0f / static_cast<float>(j));
        }
        return m;
    }
    // halving: the pairs' folds, then every virtual rank's partial at each level
    const Virtual V(K);
    const auto n2 = static_cast<size_t>(static_cast<unsigned>(V.p2));
    for (int u = 0; u < V.p2; ++u) {
        const int act = V.active(u);
        if (V.paired(act)) {
            fold<D>(&tmp[u], &v[act], &v[act - 1], 1, 0.5f);
        } else {
            tmp[u] = v[act];
        }
    }
    std::copy_n(tmp, n2, v);
    for (int d = V.p2 / 2; d >= 1; d /= 2) {
        for (int u = 0; u < V.p2; ++u) fold<D>(&tmp[u], &v[u], &v[u ^ d], 1, V.weight(u, d));
        std::copy_n(tmp, n2, v);
    }
    return v[V.of(owner)];
}

template <typename D>
void reduce_scatter_direct(Comm& comm, const NodeLayout& lay, const typename D::T* in, size_t n,
                           typename D::T* out, CollAlgo algo) {
    using T     = typename D::T;
    const int P = comm.size();
    const int N = lay.nodes, L = lay.per_node;
    const auto r = static_cast<size_t>(comm.rank());
    int node = 0, local = 0;  // this rank's place in the layout
    for (int k = 0; k < P; ++k) {
        if (static_cast<size_t>(lay.members[static_cast<size_t>(k)]) != r) continue;
        node  = k / L;
        local = k % L;
    }
    const NodePlan p = node_plan(lay, n, P, local);
    const size_t s   = p.world[r + 1] - p.world[r];
    T* recv          = scratch<T>(3, static_cast<size_t>(P) * s);
    std::vector<int64_t> sc(static_cast<size_t>(P)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    for (size_t q = 0; q < sc.size(); ++q) {
        sc[q] = static_cast<int64_t>(p.world[q + 1] - p.world[q]);
        sd[q] = static_cast<int64_t>(p.world[q]);
        rc[q] = static_cast<int64_t>(s);
        rd[q] = static_cast<int64_t>(q * s);
    }
    alltoallv_pairwise(comm, in, sc, sd, recv, rc, rd, sizeof(T));
    const CollAlgo a_in = resolve_algo(algo, L, n * sizeof(T));
    const CollAlgo a_x  = resolve_algo(algo, N, p.region * sizeof(T));
    std::vector<T> v(static_cast<size_t>(L)), means(static_cast<size_t>(N)),
        tmp(static_cast<size_t>(std::max(L, N)));
    for (size_t i = 0; i < s; ++i) {
        for (int u = 0; u < N; ++u) {
            for (int l = 0; l < L; ++l) {
                const auto q = static_cast<size_t>(lay.members[static_cast<size_t>(u * L + l)]);
                v[static_cast<size_t>(l)] = recv[q * s + i];
            }
            means[static_cast<size_t>(u)] = mean_as<D>(v.data(), tmp.data(), L, local, a_in);
        }
        out[i] = mean_as<D>(means.data(), tmp.data(), N, node, a_x);
    }
}

template <typename D>
void reduce_scatter_nodes(Comm& comm, const NodeLayout& lay, bool two_level,
                          std::span<const typename D::T> in, std::span<typename D::T> out,
                          CollAlgo algo) {
    if (lay.nodes <= 1) {
        reduce_scatter_mean_impl<D>(comm, in, out, algo);
        return;
    }
    using T           = typename D::T;
    const size_t n    = in.size();
    const ShardInfo s = shard_of(n, comm.rank(), comm.size());
    BGL_CHECK(out.size() == s.size, "reduce_scatter_mean: out has {} elements, shard is {}",
              out.size(), s.size);
    count_comm(CommKind::reduce_scatter, n * sizeof(T));
    if (two_level) {
        reduce_scatter_two_level<D>(lay, in.data(), n, out.data(), algo, comm.size());
    } else {
        reduce_scatter_direct<D>(comm, lay, in.data(), n, out.data(), algo);
    }
}

template <typename T>
void all_gather_nodes(Comm& comm, const NodeLayout& lay, bool two_level, std::span<const T> shard,
                      std::span<T> out, CollAlgo algo) {
    if (lay.nodes <= 1 || !two_level) {
        all_gather_impl<T>(comm, shard, out, algo);
        return;
    }
    const int P       = comm.size();
    const size_t n    = out.size();
    const ShardInfo s = shard_of(n, comm.rank(), P);
    BGL_CHECK(shard.size() == s.size, "all_gather: shard has {} elements, expected {}",
              shard.size(), s.size);
    count_comm(CommKind::all_gather, n * sizeof(T));
    const NodePlan p = node_plan(lay, n, P, lay.node->rank());
    const auto node  = static_cast<size_t>(lay.cross->rank());
    T* perm          = scratch<T>(3, n);
    T* mid           = perm + p.intra[static_cast<size_t>(lay.node->rank())];  // the region
    if (s.size > 0) std::memmove(mid + p.cross[node], shard.data(), s.size * sizeof(T));
    all_gather_level<T>(*lay.cross, mid, p.cross.data(), algo, p.region * sizeof(T));
    all_gather_level<T>(*lay.node, perm, p.intra.data(), algo, n * sizeof(T));
    for (size_t q = 0; q < static_cast<size_t>(P); ++q) {
        const size_t len = p.world[q + 1] - p.world[q];
        if (len > 0) std::memcpy(out.data() + p.world[q], perm + p.perm_at[q], len * sizeof(T));
    }
}

}  // namespace

CollAlgo resolve_algo(CollAlgo algo, int P, size_t bytes) {
    if (algo != CollAlgo::automatic) return algo;
    if (is_pow2(P) && bytes <= kSmallMessageBytes) return CollAlgo::halving_doubling;
    if (P > kRingMaxRanks && bytes / static_cast<size_t>(P) <= kLatencyBoundShardBytes) {
        return CollAlgo::halving_doubling;
    }
    return CollAlgo::ring;
}

CollTraffic coll_traffic(CollAlgo resolved, int P, double bytes, bool all_gather) {
    BGL_CHECK(resolved != CollAlgo::automatic, "coll_traffic: unresolved algorithm");
    if (P <= 1) return {};
    const double share = static_cast<double>(P - 1) / P * bytes;
    if (resolved == CollAlgo::ring) return {P - 1, share, share};
    const Virtual V(P);
    const int levels = std::countr_zero(static_cast<unsigned>(V.p2));
    if (V.extra == 0) return {levels, share, share};
    // the virtual ranks move (p2-1)/p2 of the array each; a pair also moves the whole array once
    // (hand-over or final copy) and a shard the other way
    const double halving = static_cast<double>(V.p2 - 1) / V.p2 * bytes, shard = bytes / P;
    const double sent = V.p2 * halving + V.extra * (bytes + shard);
    return {levels + (all_gather ? 2 : 3), bytes + halving, sent / P};
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

namespace bagualu::dist {

NodeLayout make_node_layout(Comm& comm, int node_id) {
    const int P = comm.size();
    std::vector<int> ids(static_cast<size_t>(P));
    comm.allgather(&node_id, sizeof(int), ids.data());
    std::vector<int> first;  // [node] its lowest rank's id, in rank order
    std::vector<int> node_of(ids.size()), local_of(ids.size());
    std::vector<int> count;
    for (size_t q = 0; q < ids.size(); ++q) {
        const auto it = std::find(first.begin(), first.end(), ids[q]);
        const auto v  = static_cast<size_t>(it - first.begin());
        if (it == first.end()) first.push_back(ids[q]), count.push_back(0);
        node_of[q]  = static_cast<int>(v);
        local_of[q] = count[v]++;
    }
    NodeLayout lay;
    const int N = static_cast<int>(first.size());
    if (N <= 1 || std::any_of(count.begin(), count.end(), [&](int c) { return c != count[0]; })) {
        lay.per_node = P;  // one node, or unequal nodes: treated as one
        for (int q = 0; q < P; ++q) lay.members.push_back(q);
        return lay;
    }
    lay.nodes    = N;
    lay.per_node = count[0];
    lay.members.resize(ids.size());
    for (size_t q = 0; q < ids.size(); ++q) {
        const auto at   = static_cast<size_t>(node_of[q] * lay.per_node + local_of[q]);
        lay.members[at] = static_cast<int>(q);
    }
    const auto me = static_cast<size_t>(comm.rank());
    lay.node      = comm.split(node_of[me], comm.rank());
    lay.cross     = comm.split(local_of[me], node_of[me]);
    return lay;
}

void reduce_scatter_mean(Comm& comm, const NodeLayout& layout, bool two_level,
                         std::span<const float> in, std::span<float> out, CollAlgo algo) {
    reduce_scatter_nodes<F32>(comm, layout, two_level, in, out, algo);
}
void reduce_scatter_mean_bf16(Comm& comm, const NodeLayout& layout, bool two_level,
                              std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo) {
    reduce_scatter_nodes<Bf16>(comm, layout, two_level, in, out, algo);
}
void reduce_scatter_mean_fp16(Comm& comm, const NodeLayout& layout, bool two_level,
                              std::span<const uint16_t> in, std::span<uint16_t> out,
                              CollAlgo algo) {
    reduce_scatter_nodes<Fp16>(comm, layout, two_level, in, out, algo);
}
void all_gather(Comm& comm, const NodeLayout& layout, bool two_level, std::span<const float> shard,
                std::span<float> out, CollAlgo algo) {
    all_gather_nodes<float>(comm, layout, two_level, shard, out, algo);
}
void all_gather(Comm& comm, const NodeLayout& layout, bool two_level,
                std::span<const uint16_t> shard, std::span<uint16_t> out, CollAlgo algo) {
    all_gather_nodes<uint16_t>(comm, layout, two_level, shard, out, algo);
}
void allreduce_mean(Comm& comm, const NodeLayout& layout, bool two_level, std::span<float> data,
                    CollAlgo algo) {
    const ShardInfo s = shard_of(data.size(), comm.rank(), comm.size());
    const auto shard  = data.subspan(s.offset, s.size);
    reduce_scatter_mean(comm, layout, two_level, data, shard, algo);
    all_gather(comm, layout, two_level, std::span<const float>(shard), data, algo);
}

}  // namespace bagualu::dist

// Pairwise and hierarchical all-to-all(v); see alltoallv.h. The hierarchical version moves
// bytes (elem_bytes folded into the counts) through three Comm::alltoallv_bytes calls: members ->
// leader, leader -> leader, leader -> members. Only leaders hold the whole node's traffic.
#include "dist/comm/alltoallv.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace bagualu::dist {

namespace {

void check_counts(const Comm& comm, std::span<const int64_t> a, std::span<const int64_t> b,
                  std::span<const int64_t> c, std::span<const int64_t> d) {
    const auto p = static_cast<size_t>(comm.size());
    BGL_CHECK(a.size() == p && b.size() == p && c.size() == p && d.size() == p,
              "alltoallv needs counts and displacements for each of {} ranks", p);
}

void copy_bytes(std::byte* dst, const std::byte* src, int64_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

std::vector<size_t> ranks_of(const std::vector<int>& members) {
    return {members.begin(), members.end()};
}

int64_t sum(std::span<const int64_t> v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

void alltoallv_pairwise(Comm& comm, const void* send, std::span<const int64_t> send_counts,
                        std::span<const int64_t> send_displs, void* recv,
                        std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                        size_t elem_bytes) {
    check_counts(comm, send_counts, send_displs, recv_counts, recv_displs);
    const auto P  = static_cast<size_t>(comm.size());
    const auto r  = static_cast<size_t>(comm.rank());
    const auto eb = static_cast<int64_t>(elem_bytes);
    const auto* s = static_cast<const std::byte*>(send);
    auto* d       = static_cast<std::byte*>(recv);
    BGL_CHECK(send_counts[r] == recv_counts[r], "alltoallv: rank {} sends {} to itself, expects {}",
              r, send_counts[r], recv_counts[r]);
    copy_bytes(d + recv_displs[r] * eb, s + send_displs[r] * eb, send_counts[r] * eb);
    for (size_t k = 1; k < P; ++k) {
        const size_t dest = (r + k) % P;
        const size_t src  = (r + P - k) % P;
        comm.sendrecv(s + send_displs[dest] * eb, static_cast<size_t>(send_counts[dest] * eb),
                      static_cast<int>(dest), d + recv_displs[src] * eb,
                      static_cast<size_t>(recv_counts[src] * eb), static_cast<int>(src));
    }
}

void alltoall_bruck(Comm& comm, const void* send, size_t block_bytes, void* recv) {
    const auto P   = static_cast<size_t>(comm.size());
    const auto r   = static_cast<size_t>(comm.rank());
    const auto* s  = static_cast<const std::byte*>(send);
    auto* d        = static_cast<std::byte*>(recv);
    const size_t b = block_bytes;
    const auto bb  = static_cast<int64_t>(b);
    // tmp[i]: the block bound for rank r + i; after the rounds, the block from rank r - i.
    // Grow-only buffers of the calling thread: no allocation once they have their size.
    thread_local std::vector<std::byte> tmp, out, in;
    if (tmp.size() < P * b) tmp.resize(P * b);
    if (out.size() < P * b) out.resize(P * b);
    if (in.size() < P * b) in.resize(P * b);
    for (size_t i = 0; i < P; ++i) copy_bytes(tmp.data() + i * b, s + ((r + i) % P) * b, bb);
    for (size_t step = 1; step < P; step <<= 1) {
        size_t n = 0;  // the blocks of this step, packed in order
        for (size_t i = 0; i < P; ++i) {
            if (i & step) copy_bytes(out.data() + (n++) * b, tmp.data() + i * b, bb);
        }
        comm.sendrecv(out.data(), n * b, static_cast<int>((r + step) % P), in.data(), n * b,
                      static_cast<int>((r + P - step) % P));
        size_t at = 0;
        for (size_t i = 0; i < P; ++i) {
            if (i & step) copy_bytes(tmp.data() + i * b, in.data() + (at++) * b, bb);
        }
    }
    for (size_t i = 0; i < P; ++i) copy_bytes(d + ((r + P - i) % P) * b, tmp.data() + i * b, bb);
}

bool use_bruck(CollAlgo algo, int P, size_t block) {
    if (P <= 2 || algo == CollAlgo::ring) return false;  // P <= 2: one step either way
    if (algo == CollAlgo::halving_doubling) return true;
    return P > kRingMaxRanks && block <= kLatencyBoundShardBytes;
}

BruckTraffic bruck_traffic(int P, double block) {
    BruckTraffic t;
    for (int step = 1; step < P; step <<= 1) {
        int n = 0;
        for (int i = 0; i < P; ++i) n += (i & step) ? 1 : 0;
        ++t.hops;
        t.sent_bytes += n * block;
    }
    return t;
}

int grid_rows(int group, int ranks) {
    if (group <= 1 || ranks <= 1) return 0;
    const int rows = std::gcd(group, ranks);
    return rows > 1 && rows < ranks ? rows : 0;
}

GridGroups make_grid_groups(Comm& comm, int row_size) {
    BGL_CHECK(row_size >= 1 && comm.size() % row_size == 0,
              "grid rows of {} do not divide {} ranks", row_size, comm.size());
    GridGroups g;
    g.row = comm.split(comm.rank() / row_size, comm.rank());
    g.col = comm.split(comm.rank() % row_size, comm.rank());
    return g;
}

void alltoallv_grid(GridGroups& grid, const void* send, std::span<const int64_t> send_counts,
                    std::span<const int64_t> send_displs, void* recv,
                    std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                    size_t elem_bytes) {
    Comm& row    = *grid.row;
    Comm& col    = *grid.col;
    const auto S = static_cast<size_t>(row.size());
    const auto G = static_cast<size_t>(col.size());
    BGL_CHECK(send_counts.size() == S * G && send_displs.size() == S * G &&
                  recv_counts.size() == S * G && recv_displs.size() == S * G,
              "alltoallv_grid needs counts and displacements for each of {} ranks", S * G);
    const auto eb = static_cast<int64_t>(elem_bytes);
    const auto* s = static_cast<const std::byte*>(send);
    auto* d       = static_cast<std::byte*>(recv);
    // Grow-only buffers of the calling thread: no allocation once they have their size.
    thread_local std::vector<int64_t> sizes_out, sizes_in, sc1, sd1, rc1, rd1, sc2, sd2, rc2, rd2,
        at;
    thread_local std::vector<std::byte> out1, in1, out2, in2;
    sizes_out.assign(S * G, 0);
    sizes_in.assign(S * G, 0);
    for (auto* v : {&sc1, &sd1, &rc1, &rd1}) v->assign(S, 0);
    for (auto* v : {&sc2, &sd2, &rc2, &rd2}) v->assign(G, 0);

    // Phase 1, inside the row: to row rank t, the blocks bound for (g', t), g' = 0 .. G-1 in
    // that order; first their sizes in bytes, G from each row rank.
    for (size_t t = 0; t < S; ++t) {
        for (size_t h = 0; h < G; ++h) sizes_out[t * G + h] = send_counts[h * S + t] * eb;
    }
    std::fill(sc1.begin(), sc1.end(), static_cast<int64_t>(G));
    for (size_t t = 0; t < S; ++t) sd1[t] = static_cast<int64_t>(t * G);
    row.alltoallv_bytes(sizes_out.data(), sc1, sd1, sizes_in.data(), sc1, sd1, sizeof(int64_t));
    int64_t n_out = 0, n_in = 0;
    for (size_t t = 0; t < S; ++t) {
        sd1[t] = n_out;
        rd1[t] = n_in;
        sc1[t] = 0;
        for (size_t h = 0; h < G; ++h) {
            sc1[t] += sizes_out[t * G + h];
            rc1[t] += sizes_in[t * G + h];
        }
        n_out += sc1[t];
        n_in += rc1[t];
    }
    if (out1.size() < static_cast<size_t>(n_out)) out1.resize(static_cast<size_t>(n_out));
    if (in1.size() < static_cast<size_t>(n_in)) in1.resize(static_cast<size_t>(n_in));
    for (size_t t = 0, off = 0; t < S; ++t) {
        for (size_t h = 0; h < G; ++h) {
            const size_t q = h * S + t;
            copy_bytes(out1.data() + off, s + send_displs[q] * eb, send_counts[q] * eb);
            off += static_cast<size_t>(send_counts[q] * eb);
        }
    }
    row.alltoallv_bytes(out1.data(), sc1, sd1, in1.data(), rc1, rd1, 1);

    // Phase 2, inside the column: to column rank h, the blocks from (g, t), t = 0 .. S-1, bound
    // for (h, s); from column rank h, the blocks of (h, t) for this rank, sizes known.
    at.assign(rd1.begin(), rd1.end());  // [t] next block of row rank t's data in in1
    n_out = 0;
    for (size_t h = 0; h < G; ++h) {
        sd2[h] = n_out;
        for (size_t t = 0; t < S; ++t) sc2[h] += sizes_in[t * G + h];
        n_out += sc2[h];
    }
    if (out2.size() < static_cast<size_t>(n_out)) out2.resize(static_cast<size_t>(n_out));
    for (size_t h = 0, off = 0; h < G; ++h) {
        for (size_t t = 0; t < S; ++t) {
            const int64_t b = sizes_in[t * G + h];
            copy_bytes(out2.data() + off, in1.data() + at[t], b);
            at[t] += b;
            off += static_cast<size_t>(b);
        }
    }
    n_in = 0;
    for (size_t h = 0; h < G; ++h) {
        rd2[h] = n_in;
        for (size_t t = 0; t < S; ++t) rc2[h] += recv_counts[h * S + t] * eb;
        n_in += rc2[h];
    }
    if (in2.size() < static_cast<size_t>(n_in)) in2.resize(static_cast<size_t>(n_in));
    col.alltoallv_bytes(out2.data(), sc2, sd2, in2.data(), rc2, rd2, 1);
    for (size_t h = 0, off = 0; h < G; ++h) {
        for (size_t t = 0; t < S; ++t) {
            const size_t q = h * S + t;
            copy_bytes(d + recv_displs[q] * eb, in2.data() + off, recv_counts[q] * eb);
            off += static_cast<size_t>(recv_counts[q] * eb);
        }
    }
}

NodeGroups make_node_groups(Comm& comm, std::unique_ptr<Comm> node) {
    NodeGroups g;
    g.node          = node ? std::move(node) : comm.split_shared();
    const bool lead = g.node->rank() == 0;
    g.leaders       = comm.split(lead ? 0 : -1, comm.rank());
    int info[2]     = {lead ? g.leaders->rank() : 0, g.node->rank()};
    g.node->broadcast(&info[0], sizeof(int), 0);
    const auto P = static_cast<size_t>(comm.size());
    std::vector<int> all(2 * P);
    comm.allgather(info, sizeof(info), all.data());
    g.node_of.resize(P);
    g.node_rank_of.resize(P);
    int num_nodes = 0;
    for (size_t q = 0; q < P; ++q) {
        g.node_of[q]      = all[2 * q];
        g.node_rank_of[q] = all[2 * q + 1];
        num_nodes         = std::max(num_nodes, g.node_of[q] + 1);
    }
    g.members.resize(static_cast<size_t>(num_nodes));
    for (size_t q = 0; q < P; ++q) {
        auto& m        = g.members[static_cast<size_t>(g.node_of[q])];
        const auto idx = static_cast<size_t>(g.node_rank_of[q]);
        if (m.size() <= idx) m.resize(idx + 1, -1);
        m[idx] = static_cast<int>(q);
    }
    for (const auto& m : g.members) {
        BGL_CHECK(std::find(m.begin(), m.end(), -1) == m.end(), "node layout has a hole");
    }
    const auto my_node = static_cast<size_t>(g.node_of[static_cast<size_t>(comm.rank())]);
    BGL_CHECK(g.members[my_node].size() == static_cast<size_t>(g.node->size()),
              "node comm and node layout disagree");
    return g;
}

void alltoallv_hierarchical(Comm& comm, NodeGroups& groups, const void* send,
                            std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_displs, void* recv,
                            std::span<const int64_t> recv_counts,
                            std::span<const int64_t> recv_displs, size_t elem_bytes) {
    check_counts(comm, send_counts, send_displs, recv_counts, recv_displs);
    const auto up      = static_cast<size_t>(comm.size());
    const auto eb      = static_cast<int64_t>(elem_bytes);
    Comm& node         = *groups.node;
    const auto L       = static_cast<size_t>(node.size());
    const bool leader  = node.rank() == 0;
    const auto* sbytes = static_cast<const std::byte*>(send);
    auto* rbytes       = static_cast<std::byte*>(recv);

    // 1. Pack this rank's send data by destination rank; share every member's counts.
    std::vector<std::byte> packed(static_cast<size_t>(sum(send_counts) * eb));
    for (size_t q = 0, off = 0; q < up; off += static_cast<size_t>(send_counts[q] * eb), ++q) {
        copy_bytes(packed.data() + off, sbytes + send_displs[q] * eb, send_counts[q] * eb);
    }
    std::vector<int64_t> all_sc(L * up), all_rc(L * up);  // [node rank][rank], elements
    node.allgather(send_counts.data(), up * sizeof(int64_t), all_sc.data());
    node.allgather(recv_counts.data(), up * sizeof(int64_t), all_rc.data());
    const auto sc = [&](size_t m, size_t q) { return all_sc[m * up + q] * eb; };
    const auto rc = [&](size_t m, size_t q) { return all_rc[m * up + q] * eb; };

    // 2. Gather to the leader: member m's packed data lands at gathered[gd[m]].
    std::vector<int64_t> zeros(L, 0), gsc(L, 0), grc(L, 0), gd(L, 0);
    gsc[0]                 = static_cast<int64_t>(packed.size());
    int64_t gathered_bytes = 0;
    if (leader) {
        for (size_t m = 0; m < L; ++m) {
            gd[m] = gathered_bytes;
            for (size_t q = 0; q < up; ++q) grc[m] += sc(m, q);
            gathered_bytes += grc[m];
        }
    }
    std::vector<std::byte> gathered(static_cast<size_t>(gathered_bytes));
    node.alltoallv_bytes(packed.data(), gsc, zeros, gathered.data(), grc, gd, 1);

    // 3. Leaders exchange: to node B, blocks (m -> n) for m in this node, n in B, in that order.
    std::vector<std::byte> to_members;
    std::vector<int64_t> msc(L, 0), msd(L, 0);
    if (leader) {
        Comm& leaders        = *groups.leaders;
        const auto num_nodes = static_cast<size_t>(leaders.size());
        const auto& mine =
            groups.members[static_cast<size_t>(groups.node_of[static_cast<size_t>(comm.rank())])];
        std::vector<int64_t> block_off(L * up);  // [m][dest rank] offset in gathered
        for (size_t m = 0; m < L; ++m) {
            int64_t off = gd[m];
            for (size_t q = 0; q < up; ++q) {
                block_off[m * up + q] = off;
                off += sc(m, q);
            }
        }
        std::vector<int64_t> lsc(num_nodes, 0), lsd(num_nodes, 0), lrc(num_nodes, 0),
            lrd(num_nodes, 0);
        std::vector<std::byte> lsend(gathered.size());
        int64_t off = 0;
        for (size_t b = 0; b < num_nodes; ++b) {
            lsd[b] = off;
            for (size_t m = 0; m < L; ++m) {
                for (const size_t q : ranks_of(groups.members[b])) {
                    copy_bytes(lsend.data() + off, gathered.data() + block_off[m * up + q],
                               sc(m, q));
                    off += sc(m, q);
                }
            }
            lsc[b] = off - lsd[b];
        }
        int64_t lrecv_bytes = 0;
        for (size_t a = 0; a < num_nodes; ++a) {
            lrd[a] = lrecv_bytes;
            for (const size_t q : ranks_of(groups.members[a])) {
                for (size_t n = 0; n < L; ++n) lrc[a] += rc(n, q);
            }
            lrecv_bytes += lrc[a];
        }
        std::vector<std::byte> from_nodes(static_cast<size_t>(lrecv_bytes));
        if (groups.leader_grid) {
            alltoallv_grid(*groups.leader_grid, lsend.data(), lsc, lsd, from_nodes.data(), lrc, lrd,
                           1);
        } else {
            leaders.alltoallv_bytes(lsend.data(), lsc, lsd, from_nodes.data(), lrc, lrd, 1);
        }

        // 4. Re-order for the scatter: member n gets its blocks ordered by source rank.
        std::vector<int64_t> pos(up * L);  // [source rank][n] offset in from_nodes
        for (size_t a = 0; a < num_nodes; ++a) {
            int64_t cur = lrd[a];
            for (const size_t q : ranks_of(groups.members[a])) {
                for (size_t n = 0; n < L; ++n) {
                    pos[q * L + n] = cur;
                    cur += rc(n, q);
                }
            }
        }
        to_members.resize(from_nodes.size());
        int64_t moff = 0;
        for (size_t n = 0; n < L; ++n) {
            msd[n] = moff;
            for (size_t q = 0; q < up; ++q) {
                copy_bytes(to_members.data() + moff, from_nodes.data() + pos[q * L + n], rc(n, q));
                moff += rc(n, q);
            }
            msc[n] = moff - msd[n];
        }
        BGL_CHECK(mine.size() == L, "leader's node has {} members, node comm {}", mine.size(), L);
    }

    // 5. Scatter within the node, then place each source's block at its displacement.
    std::vector<std::byte> unpacked(static_cast<size_t>(sum(recv_counts) * eb));
    std::vector<int64_t> urc(L, 0);
    urc[0] = static_cast<int64_t>(unpacked.size());
    node.alltoallv_bytes(to_members.data(), msc, msd, unpacked.data(), urc, zeros, 1);
    for (size_t q = 0, off = 0; q < up; off += static_cast<size_t>(recv_counts[q] * eb), ++q) {
        copy_bytes(rbytes + recv_displs[q] * eb, unpacked.data() + off, recv_counts[q] * eb);
    }
}

}  // namespace bagualu::dist

#include "moe/token_dispatcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <span>

#include "core/error.h"
#include "dist/comm/alltoallv.h"

namespace bagualu::moe {

// ---- RowRounds ----

void RowRounds::reset(const int64_t* totals, int El, int64_t budget, int64_t block) {
    BGL_CHECK(block >= 1 && budget >= block, "row budget {} below the block of {} rows", budget,
              block);
    totals_.assign(totals, totals + El);
    lo_.assign(static_cast<size_t>(El), 0);
    hi_.assign(static_cast<size_t>(El), 0);
    budget_ = budget;
    block_  = block;
    rounds_ = 0;
    for (bool done = false; !done;) {
        lo_ = hi_;
        advance();
        ++rounds_;
        done = std::equal(hi_.begin(), hi_.end(), totals_.begin());
    }
    round_ = -1;
}

void RowRounds::set_round(int r) {
    BGL_CHECK(r >= 0 && r < rounds_ && (r == 0 || r == round_ + 1), "round {} after {} of {}", r,
              round_, rounds_);
    if (r == 0) std::fill(hi_.begin(), hi_.end(), 0);
    lo_ = hi_;
    advance();
    round_ = r;
}

void RowRounds::advance() {
    int64_t space = budget_;
    for (size_t e = 0; e < totals_.size(); ++e) {
        const int64_t rest = totals_[e] - lo_[e];
        const int64_t take = rest <= space ? rest : space / block_ * block_;
        hi_[e]             = lo_[e] + take;
        space -= take;
    }
}

// ---- all-to-all time ----

namespace {
std::atomic<int64_t> g_a2a_raw_ns{0}, g_a2a_exposed_ns{0}, g_a2a_pieces{0}, g_a2a_beside{0};
}  // namespace

A2aSeconds a2a_seconds() {
    return {1e-9 * static_cast<double>(g_a2a_raw_ns.load(std::memory_order_relaxed)),
            1e-9 * static_cast<double>(g_a2a_exposed_ns.load(std::memory_order_relaxed)),
            g_a2a_pieces.load(std::memory_order_relaxed),
            g_a2a_beside.load(std::memory_order_relaxed)};
}

void reset_a2a_seconds() {
    g_a2a_raw_ns.store(0, std::memory_order_relaxed);
    g_a2a_exposed_ns.store(0, std::memory_order_relaxed);
    g_a2a_pieces.store(0, std::memory_order_relaxed);
    g_a2a_beside.store(0, std::memory_order_relaxed);
}

void count_dispatch_beside_shared() { g_a2a_beside.fetch_add(1, std::memory_order_relaxed); }

void add_a2a_seconds(double raw, double exposed) {
    g_a2a_raw_ns.fetch_add(static_cast<int64_t>(raw * 1e9), std::memory_order_relaxed);
    g_a2a_exposed_ns.fetch_add(static_cast<int64_t>(exposed * 1e9), std::memory_order_relaxed);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// ---- TokenDispatcher ----

TokenDispatcher::TokenDispatcher(dist::ParallelContext& par, int E, int C, int max_rows,
                                 int64_t budget, int64_t block, int chunks)
    : par_(par),
      E_(E),
      El_(E / par.ep_size()),
      C_(C),
      max_rows_(max_rows),
      ep_size_(par.ep_size()),
      budget_(budget),
      block_(block),
      mine_(static_cast<size_t>(E)),
      counts_(static_cast<size_t>(E)),  // ep_size * El
      count_counts_(static_cast<size_t>(par.ep_size()), E / par.ep_size()),
      count_displs_(static_cast<size_t>(par.ep_size())),
      starts_out_(2 * static_cast<size_t>(E)),
      starts_in_(2 * static_cast<size_t>(E)),
      pair_counts_(static_cast<size_t>(par.ep_size()), 2 * (E / par.ep_size())),
      pair_displs_(static_cast<size_t>(par.ep_size())),
      peer_rounds_(static_cast<size_t>(par.ep_size())),
      round_counts_(static_cast<size_t>(E)),
      send_rows_(static_cast<size_t>(E)),
      send_first_(static_cast<size_t>(E)),
      send_counts_(static_cast<size_t>(par.ep_size())),
      send_displs_(static_cast<size_t>(par.ep_size())),
      recv_counts_(static_cast<size_t>(par.ep_size())),
      recv_displs_(static_cast<size_t>(par.ep_size())),
      local_offsets_(static_cast<size_t>(E / par.ep_size() + 1)),
      staging_(static_cast<size_t>(budget) * static_cast<size_t>(C)) {
    BGL_CHECK(budget >= 1 && block >= 1, "row budget {}, block {}", budget, block);
    for (int q = 0; q < ep_size_; ++q) {
        count_displs_[static_cast<size_t>(q)] = int64_t{q} * El_;
        pair_displs_[static_cast<size_t>(q)]  = int64_t{2} * q * El_;
    }
    // more than one round is possible only when the budget is below every routed row of the
    // group arriving here; only then (or with chunks) are outgoing rows gathered per piece
    chunks_wanted_ = std::max(1, chunks);
    if (budget < static_cast<int64_t>(ep_size_) * max_rows || chunks_wanted_ > 1) {
        send_staging_ = Buffer<float>(static_cast<size_t>(max_rows) * static_cast<size_t>(C));
    }
}

void TokenDispatcher::dispatch_preprocess(const int32_t* tokens_per_expert) {
    std::copy(tokens_per_expert, tokens_per_expert + E_, mine_.begin());
    // peer q needs only the counts of its own El experts (mine_ is expert-major, so they are
    // consecutive): E int64 in and out per rank, where gathering every rank's E counts would
    // receive EP * E
    // (equal blocks: over many ranks Bruck's log2 EP steps instead of EP - 1,
    // dist/comm/alltoallv.h)
    const size_t block = static_cast<size_t>(El_) * sizeof(int64_t);
    if (dist::use_bruck(par_.coll_algo(), ep_size_, block)) {
        dist::alltoall_bruck(par_.ep(), mine_.data(), block, counts_.data());
    } else {
        par_.ep().alltoallv_bytes(mine_.data(), count_counts_, count_displs_, counts_.data(),
                                  count_counts_, count_displs_, sizeof(int64_t));
    }
    // One round when no rank of the group receives more than the budget: one all-reduce of the
    // largest receipt (cheaper than an all-to-all over a large group) decides it for all ranks.
    int64_t most = 0;
    for (int64_t c : counts_) most += c;
    par_.ep().allreduce_max(std::span<int64_t>(&most, 1));
    rounds_ = 1;
    if (most > budget_) {
        rounds_ = plan_peer_rounds(budget_);
        BGL_CHECK(rounds_ > 1 && send_staging_.size() > 0,
                  "{} rows over the budget of {} in {} rounds", most, budget_, rounds_);
    }
    plan_chunks(most);
    set_round(0);
}

// Tells each source where its rows start in each local expert's sequence and every expert's
// total (one all-to-all of 2 E int64 per rank), then cuts every peer's experts' sequences into
// pieces of at most `budget` rows (RowRounds). Returns the pieces the group needs.
int TokenDispatcher::plan_peer_rounds(int64_t budget) {
    // the rows of sources before s come first in each local expert's sequence
    for (int e = 0; e < El_; ++e) {
        int64_t start = 0, total = 0;
        for (int s = 0; s < ep_size_; ++s) total += counts_[static_cast<size_t>(s * El_ + e)];
        for (int s = 0; s < ep_size_; ++s) {
            const size_t i     = 2 * static_cast<size_t>(s * El_ + e);
            starts_out_[i]     = start;
            starts_out_[i + 1] = total;
            start += counts_[static_cast<size_t>(s * El_ + e)];
        }
    }
    par_.ep().alltoallv_bytes(starts_out_.data(), pair_counts_, pair_displs_, starts_in_.data(),
                              pair_counts_, pair_displs_, sizeof(int64_t));
    // every rank now knows every expert's total, so it plans every peer's pieces alike
    std::vector<int64_t>& totals = round_counts_;  // scratch until set_round fills it
    int pieces                   = 1;
    for (int q = 0; q < ep_size_; ++q) {
        for (int e = 0; e < El_; ++e) {
            const size_t g                 = static_cast<size_t>(q * El_ + e);
            totals[static_cast<size_t>(e)] = starts_in_[2 * g + 1];
        }
        RowRounds& rr = peer_rounds_[static_cast<size_t>(q)];
        rr.reset(totals.data(), El_, budget, block_);
        pieces = std::max(pieces, rr.rounds());
    }
    return pieces;
}

// With chunks_wanted_ > 1 and one round: cuts the round into pieces of about 1/chunks_wanted_
// of the largest receipt `most` (whole weight-gradient blocks, so the experts' sums are those of
// one piece), each with its own region of the staging and local buffers.
void TokenDispatcher::plan_chunks(int64_t most) {
    n_chunks_ = 1;
    if (chunks_wanted_ <= 1 || rounds_ > 1 || most <= block_) return;
    const int64_t want  = (most + chunks_wanted_ - 1) / chunks_wanted_;
    const int64_t piece = std::max<int64_t>(block_, (want + block_ - 1) / block_ * block_);
    if (piece >= most) return;
    const int n = plan_peer_rounds(piece);
    if (n <= 1) return;
    if (chunks_.size() < static_cast<size_t>(n)) chunks_.resize(static_cast<size_t>(n));
    int64_t send_base = 0, recv_base = 0;
    for (int c = 0; c < n; ++c) {
        plan_piece(c);
        Chunk& ch       = chunks_[static_cast<size_t>(c)];
        ch.send_counts  = send_counts_;
        ch.send_displs  = send_displs_;
        ch.recv_counts  = recv_counts_;
        ch.recv_displs  = recv_displs_;
        ch.send_rows    = send_rows_;
        ch.send_first   = send_first_;
        ch.round_counts = round_counts_;
        ch.offsets      = local_offsets_;
        ch.send_base    = send_base;
        ch.recv_base    = recv_base;
        for (int q = 0; q < ep_size_; ++q) send_base += send_counts_[static_cast<size_t>(q)] / C_;
        recv_base += local_offsets_.back();
    }
    int64_t mine_in = 0;  // every row this rank receives in the round
    for (int64_t v : counts_) mine_in += v;
    BGL_CHECK(recv_base == mine_in, "the chunks receive {} rows, the round {}", recv_base, mine_in);
    n_chunks_ = n;
}

void TokenDispatcher::set_round(int r) {
    BGL_CHECK(r >= 0 && r < rounds_, "round {} of {}", r, rounds_);
    if (rounds_ == 1) {  // everything: every row this rank sends, every row it receives
        round_counts_ = counts_;
        int64_t off   = 0;
        for (int q = 0; q < ep_size_; ++q) {
            int64_t rows = 0;
            for (int e = q * El_; e < (q + 1) * El_; ++e) {
                send_first_[static_cast<size_t>(e)] = off + rows;
                send_rows_[static_cast<size_t>(e)]  = mine_[static_cast<size_t>(e)];
                rows += mine_[static_cast<size_t>(e)];
            }
            send_counts_[static_cast<size_t>(q)] = rows * C_;
            send_displs_[static_cast<size_t>(q)] = off * C_;
            off += rows;
        }
        set_recv_counts();
        return;
    }
    plan_piece(r);
}

// Moves every peer's RowRounds to piece r and plans it: what this rank sends and receives.
void TokenDispatcher::plan_piece(int r) {
    // a peer with fewer pieces than the group has nothing more to receive after its last
    for (RowRounds& rr : peer_rounds_) {
        if (r < rr.rounds()) rr.set_round(r);
    }
    // what this rank sends: of its rows [start, start + mine) of each global expert's sequence,
    // those inside the expert's piece of this round
    int64_t perm_row = 0, off = 0;
    for (int q = 0; q < ep_size_; ++q) {
        const RowRounds& rr = peer_rounds_[static_cast<size_t>(q)];
        const bool live     = r < rr.rounds();
        int64_t rows        = 0;
        for (int e = 0; e < El_; ++e) {
            const size_t g      = static_cast<size_t>(q * El_ + e);
            const int64_t start = starts_in_[2 * g];
            const int64_t a     = live ? std::max(start, rr.lo(e)) : 0;
            const int64_t b     = live ? std::min(start + mine_[g], rr.hi(e)) : 0;
            send_rows_[g]       = std::max<int64_t>(0, b - a);
            send_first_[g]      = perm_row + (a - start);
            rows += send_rows_[g];
            perm_row += mine_[g];
        }
        send_counts_[static_cast<size_t>(q)] = rows * C_;
        send_displs_[static_cast<size_t>(q)] = off * C_;
        off += rows;
    }
    // what this rank receives: of source s's rows of local expert e, those inside e's piece
    const RowRounds& me = peer_rounds_[static_cast<size_t>(par_.ep_rank())];
    const bool live     = r < me.rounds();
    std::fill(round_counts_.begin(), round_counts_.end(), 0);
    for (int e = 0; e < El_; ++e) {
        int64_t start = 0;
        for (int s = 0; s < ep_size_; ++s) {
            const size_t i   = static_cast<size_t>(s * El_ + e);
            const int64_t a  = live ? std::max(start, me.lo(e)) : 0;
            const int64_t b  = live ? std::min(start + counts_[i], me.hi(e)) : 0;
            round_counts_[i] = std::max<int64_t>(0, b - a);
            start += counts_[i];
        }
    }
    set_recv_counts();
}

// recv_counts_, recv_displs_ and local_offsets_ from round_counts_.
void TokenDispatcher::set_recv_counts() {
    int64_t off = 0;
    for (int s = 0; s < ep_size_; ++s) {
        int64_t rows = 0;
        for (int e = 0; e < El_; ++e) rows += round_counts_[static_cast<size_t>(s * El_ + e)];
        recv_counts_[static_cast<size_t>(s)] = rows * C_;
        recv_displs_[static_cast<size_t>(s)] = off * C_;
        off += rows;
    }
    BGL_CHECK(off <= budget_, "{} rows exceed the budget of {}", off, budget_);
    local_offsets_[0] = 0;
    for (int e = 0; e < El_; ++e) {
        int64_t rows = 0;
        for (int s = 0; s < ep_size_; ++s) rows += round_counts_[static_cast<size_t>(s * El_ + e)];
        local_offsets_[static_cast<size_t>(e) + 1] =
            local_offsets_[static_cast<size_t>(e)] + static_cast<int32_t>(rows);
    }
}

// Outgoing rows of x_perm (rows[g] from first[g] of each global expert g), packed peer by peer
// into dst.
void TokenDispatcher::gather_send(float* dst, const float* x_perm, const std::vector<int64_t>& rows,
                                  const std::vector<int64_t>& first) const {
    for (size_t g = 0; g < static_cast<size_t>(E_); ++g) {
        const size_t n = static_cast<size_t>(rows[g]) * static_cast<size_t>(C_);
        if (n == 0) continue;
        std::memcpy(dst, x_perm + first[g] * C_, sizeof(float) * n);
        dst += n;
    }
}

// The reverse of gather_send: src rows back to their places in y_perm.
void TokenDispatcher::scatter_back(float* y_perm, const float* src,
                                   const std::vector<int64_t>& rows,
                                   const std::vector<int64_t>& first) const {
    for (size_t g = 0; g < static_cast<size_t>(E_); ++g) {
        const size_t n = static_cast<size_t>(rows[g]) * static_cast<size_t>(C_);
        if (n == 0) continue;
        std::memcpy(y_perm + first[g] * C_, src, sizeof(float) * n);
        src += n;
    }
}

// Copies between the [source][local expert] staging layout and [local expert][source]:
// kToLocal: staging -> local; otherwise local -> staging.
template <bool kToLocal>
// counts: [ep_size * El] rows from rank s to local expert e.
static void reorder(const float* from, float* to, const std::vector<int64_t>& counts,
                    const std::vector<int64_t>& recv_displs, int ep_size, int El, int C) {
    int64_t dst = 0;
    for (int e = 0; e < El; ++e) {
        for (int s = 0; s < ep_size; ++s) {
            int64_t src = recv_displs[static_cast<size_t>(s)] / C;
            for (int e2 = 0; e2 < e; ++e2) src += counts[static_cast<size_t>(s * El + e2)];
            const int64_t rows = counts[static_cast<size_t>(s * El + e)];
            const size_t bytes = sizeof(float) * static_cast<size_t>(rows * C);
            if (bytes == 0) continue;
            if constexpr (kToLocal) {
                std::memcpy(to + dst * C, from + src * C, bytes);
            } else {
                std::memcpy(to + src * C, from + dst * C, bytes);
            }
            dst += rows;
        }
    }
}

// The all-to-all of float rows in a half payload: converted into 16-bit buffers, exchanged,
// converted back. Counts and displacements are in elements, as for the float exchange.
void TokenDispatcher::exchange_half(const float* send, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& send_displs, float* recv,
                                    const std::vector<int64_t>& recv_counts,
                                    const std::vector<int64_t>& recv_displs, Dtype payload) {
    if (send16_.size() == 0) {
        const size_t n =
            std::max(staging_.size(), static_cast<size_t>(max_rows_) * static_cast<size_t>(C_));
        send16_ = Buffer<uint16_t>(n);
        recv16_ = Buffer<uint16_t>(n);
    }
    int64_t n_send = 0, n_recv = 0;
    for (int q = 0; q < ep_size_; ++q) {
        n_send = std::max(
            n_send, send_displs[static_cast<size_t>(q)] + send_counts[static_cast<size_t>(q)]);
        n_recv = std::max(
            n_recv, recv_displs[static_cast<size_t>(q)] + recv_counts[static_cast<size_t>(q)]);
    }
    to_half(payload, send, send16_.data(), static_cast<size_t>(n_send));
    par_.ep_alltoallv(send16_.data(), send_counts, send_displs, recv16_.data(), recv_counts,
                      recv_displs, sizeof(uint16_t));
    from_half(payload, recv16_.data(), recv, static_cast<size_t>(n_recv));
}

void TokenDispatcher::exchange(const float* send, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& send_displs, float* recv,
                               const std::vector<int64_t>& recv_counts,
                               const std::vector<int64_t>& recv_displs, Dtype payload) {
    const auto t0 = std::chrono::steady_clock::now();
    if (payload == Dtype::float32) {
        par_.ep_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                          sizeof(float));
    } else {
        exchange_half(send, send_counts, send_displs, recv, recv_counts, recv_displs, payload);
    }
    add_a2a_seconds(seconds_since(t0), 0.0);
}

void TokenDispatcher::dispatch(float* x_local, const float* x_perm, Dtype payload, bool exposed) {
    const auto t0 = std::chrono::steady_clock::now();
    // one round sends all of x_perm, whose rows are already in peer order
    const float* send = x_perm;
    if (rounds_ > 1) {
        gather_send(send_staging_.data(), x_perm, send_rows_, send_first_);
        send = send_staging_.data();
    }
    exchange(send, send_counts_, send_displs_, staging_.data(), recv_counts_, recv_displs_,
             payload);
    reorder<true>(staging_.data(), x_local, round_counts_, recv_displs_, ep_size_, El_, C_);
    if (exposed) add_a2a_seconds(0.0, seconds_since(t0));
}

void TokenDispatcher::combine(float* y_perm, const float* y_local, Dtype payload) {
    const auto t0 = std::chrono::steady_clock::now();
    reorder<false>(y_local, staging_.data(), round_counts_, recv_displs_, ep_size_, El_, C_);
    float* recv = rounds_ > 1 ? send_staging_.data() : y_perm;
    exchange(staging_.data(), recv_counts_, recv_displs_, recv, send_counts_, send_displs_,
             payload);
    if (rounds_ > 1) scatter_back(y_perm, send_staging_.data(), send_rows_, send_first_);
    add_a2a_seconds(0.0, seconds_since(t0));
}

void TokenDispatcher::dispatch_chunk(int c, float* x_local, const float* x_perm, Dtype payload) {
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    const size_t C  = static_cast<size_t>(C_);
    float* send     = send_staging_.data() + static_cast<size_t>(ch.send_base) * C;
    float* recv     = staging_.data() + static_cast<size_t>(ch.recv_base) * C;
    g_a2a_pieces.fetch_add(1, std::memory_order_relaxed);
    gather_send(send, x_perm, ch.send_rows, ch.send_first);
    exchange(send, ch.send_counts, ch.send_displs, recv, ch.recv_counts, ch.recv_displs, payload);
    reorder<true>(recv, x_local + static_cast<size_t>(ch.recv_base) * C, ch.round_counts,
                  ch.recv_displs, ep_size_, El_, C_);
}

void TokenDispatcher::combine_chunk(int c, float* y_perm, const float* y_local, Dtype payload) {
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    const size_t C  = static_cast<size_t>(C_);
    float* send     = staging_.data() + static_cast<size_t>(ch.recv_base) * C;
    float* recv     = send_staging_.data() + static_cast<size_t>(ch.send_base) * C;
    g_a2a_pieces.fetch_add(1, std::memory_order_relaxed);
    reorder<false>(y_local + static_cast<size_t>(ch.recv_base) * C, send, ch.round_counts,
                   ch.recv_displs, ep_size_, El_, C_);
    exchange(send, ch.recv_counts, ch.recv_displs, recv, ch.send_counts, ch.send_displs, payload);
    scatter_back(y_perm, recv, ch.send_rows, ch.send_first);
}

}  // namespace bagualu::moe

#include "moe/node_dispatcher.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/parallel_rows.h"
#include "moe/dispatch.h"
#include "moe/token_dispatcher.h"

namespace bagualu::moe {

namespace {

int64_t total(const std::vector<int64_t>& v) {
    return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// Element counts and displacements of blocks of rows of `width`, laid out in rank order.
void layout(const std::vector<int64_t>& rows, int64_t width, std::vector<int64_t>& counts,
            std::vector<int64_t>& displs) {
    counts.resize(rows.size());
    displs.resize(rows.size());
    int64_t off = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        counts[i] = rows[i] * width;
        displs[i] = off;
        off += counts[i];
    }
}

using kernels::grow;

dist::NodeGroups& ep_nodes_of(dist::ParallelContext& par) {
    BGL_CHECK(par.ep_size() > 1 && par.ep_nodes() != nullptr,
              "the node-deduplicated exchange needs expert parallelism");
    return *par.ep_nodes();
}

}  // namespace

NodeDispatcher::NodeDispatcher(dist::ParallelContext& par, int E, int K, int C)
    : par_(par),
      nodes_(ep_nodes_of(par)),
      El_(E / par.ep_size()),
      K_(K),
      C_(C),
      P_(par.ep_size()),
      my_node_(nodes_.node_of[static_cast<size_t>(par.ep_rank())]),
      L_(nodes_.node->size()) {
    BGL_CHECK(E % P_ == 0, "{} experts over {} ranks", E, P_);
    const int my_index = nodes_.node_rank_of[static_cast<size_t>(par.ep_rank())];
    for (const auto& m : nodes_.members) {
        relay_of_node_.push_back(m[static_cast<size_t>(my_index) % m.size()]);
    }
    send1_rows_.assign(static_cast<size_t>(P_), 0);
    recv1_rows_.assign(static_cast<size_t>(P_), 0);
    send2_rows_.assign(static_cast<size_t>(L_), 0);
    recv2_rows_.assign(static_cast<size_t>(L_), 0);
    local_offsets_.assign(static_cast<size_t>(El_) + 1, 0);
}

void NodeDispatcher::plan(const int32_t* expert_idx, const float* probs, int N) {
    n_             = N;
    const size_t K = static_cast<size_t>(K_), P = static_cast<size_t>(P_);
    const size_t El           = static_cast<size_t>(El_);
    const auto nodes          = relay_of_node_.size();
    const auto node_of_expert = [&](int32_t e) {
        return static_cast<size_t>(nodes_.node_of[static_cast<size_t>(e / El_)]);
    };

    // 1. Entries: one per (token, node holding one of its slots), blocks in relay-rank order,
    // tokens in order within a block.
    std::fill(send1_rows_.begin(), send1_rows_.end(), 0);
    std::vector<int32_t>& stamp    = stamp_;
    std::vector<int32_t>& entry_at = entry_at_;
    stamp.assign(nodes, -1);
    entry_at.assign(nodes, -1);
    for (int t = 0; t < N; ++t) {
        for (size_t k = 0; k < K; ++k) {
            const int32_t e = expert_idx[static_cast<size_t>(t) * K + k];
            if (e < 0) continue;
            const size_t b = node_of_expert(e);
            if (stamp[b] == t) continue;
            stamp[b] = t;
            ++send1_rows_[static_cast<size_t>(relay_of_node_[b])];
        }
    }
    const int64_t sent           = total(send1_rows_);
    std::vector<int64_t>& cursor = cursor_;
    cursor.assign(P, 0);
    for (size_t q = 1; q < P; ++q) cursor[q] = cursor[q - 1] + send1_rows_[q - 1];
    ent_tok_.resize(static_cast<size_t>(sent));
    meta_send_.resize(static_cast<size_t>(sent) * 2 * K);
    slot_ent_.resize(static_cast<size_t>(N) * K);
    tok_ent_start_.assign(static_cast<size_t>(N) + 1, 0);
    tok_ent_.resize(static_cast<size_t>(sent));
    std::fill(stamp.begin(), stamp.end(), -1);
    int32_t listed = 0;
    for (int t = 0; t < N; ++t) {
        const size_t first = static_cast<size_t>(listed);
        for (size_t k = 0; k < K; ++k) {
            const size_t slot = static_cast<size_t>(t) * K + k;
            const int32_t e   = expert_idx[slot];
            if (e < 0) {
                slot_ent_[slot] = -1;
                continue;
            }
            const size_t b = node_of_expert(e);
            if (stamp[b] != t) {  // a new entry: its slots start empty
                stamp[b]                         = t;
                const auto j                     = cursor[static_cast<size_t>(relay_of_node_[b])]++;
                entry_at[b]                      = static_cast<int32_t>(j);
                ent_tok_[static_cast<size_t>(j)] = t;
                int32_t* meta = meta_send_.data() + static_cast<size_t>(j) * 2 * K;
                std::fill(meta, meta + K, -1);
                std::fill(meta + K, meta + 2 * K, std::bit_cast<int32_t>(0.0f));
                tok_ent_[static_cast<size_t>(listed++)] = static_cast<int32_t>(j);
            }
            const auto j                  = static_cast<size_t>(entry_at[b]);
            slot_ent_[slot]               = static_cast<int32_t>(j);
            meta_send_[j * 2 * K + k]     = e;
            meta_send_[j * 2 * K + K + k] = std::bit_cast<int32_t>(probs[slot]);
        }
        // a token's entries in relay-rank order, which is entry order
        std::sort(tok_ent_.begin() + static_cast<std::ptrdiff_t>(first), tok_ent_.begin() + listed);
        tok_ent_start_[static_cast<size_t>(t) + 1] = listed;
    }

    // 2. The entries' slots to their relays.
    par_.ep().alltoall(send1_rows_, recv1_rows_);
    const int64_t got = total(recv1_rows_);
    meta_recv_.resize(static_cast<size_t>(got) * 2 * K);
    std::vector<int64_t>&sc = sc_, &sd = sd_, &rc = rc_, &rd = rd_;
    layout(send1_rows_, 1, sc, sd);
    layout(recv1_rows_, 1, rc, rd);
    par_.ep_alltoallv(meta_send_.data(), sc, sd, meta_recv_.data(), rc, rd,
                      2 * K * sizeof(int32_t));

    // 3. The relay's stage 2: rows per (node rank m, source s, local expert), in that order.
    const size_t L = static_cast<size_t>(L_);
    cnt2_.assign(L * P * El, 0);
    const auto cell = [&](int32_t e, size_t s) {
        const auto q = static_cast<size_t>(e / El_);
        BGL_CHECK(static_cast<int>(node_of_expert(e)) == my_node_,
                  "an entry for node {} reached a relay on node {}", node_of_expert(e), my_node_);
        const auto m = static_cast<size_t>(nodes_.node_rank_of[q]);
        return (m * P + s) * El + static_cast<size_t>(e % El_);
    };
    for (size_t s = 0, i = 0; s < P; ++s) {
        for (int64_t n = 0; n < recv1_rows_[s]; ++n, ++i) {
            for (size_t k = 0; k < K; ++k) {
                const int32_t e = meta_recv_[i * 2 * K + k];
                if (e >= 0) ++cnt2_[cell(e, s)];
            }
        }
    }
    std::vector<int64_t>& next = next_;
    next.assign(cnt2_.size(), 0);
    for (size_t c = 1; c < cnt2_.size(); ++c) next[c] = next[c - 1] + cnt2_[c - 1];
    pos2_.resize(static_cast<size_t>(got) * K);
    for (size_t s = 0, i = 0; s < P; ++s) {
        for (int64_t n = 0; n < recv1_rows_[s]; ++n, ++i) {
            for (size_t k = 0; k < K; ++k) {
                const int32_t e  = meta_recv_[i * 2 * K + k];
                pos2_[i * K + k] = e < 0 ? -1 : next[cell(e, s)]++;
            }
        }
    }
    for (size_t m = 0; m < L; ++m) {
        send2_rows_[m] = std::accumulate(
            cnt2_.begin() + static_cast<std::ptrdiff_t>(m * P * El),
            cnt2_.begin() + static_cast<std::ptrdiff_t>((m + 1) * P * El), int64_t{0});
    }
    dprobs_rel_.resize(static_cast<size_t>(got) * K);

    // 4. Each node rank learns the (source, local expert) counts of every relay of its node.
    rcnt2_.assign(L * P * El, 0);
    std::vector<int64_t>&pe = pe_, &ped = ped_;
    pe.assign(L, static_cast<int64_t>(P * El));
    ped.assign(L, 0);
    for (size_t m = 1; m < L; ++m) ped[m] = ped[m - 1] + pe[m - 1];
    nodes_.node->alltoallv_bytes(cnt2_.data(), pe, ped, rcnt2_.data(), pe, ped, sizeof(int64_t));
    for (size_t m = 0; m < L; ++m) {
        recv2_rows_[m] = std::accumulate(
            rcnt2_.begin() + static_cast<std::ptrdiff_t>(m * P * El),
            rcnt2_.begin() + static_cast<std::ptrdiff_t>((m + 1) * P * El), int64_t{0});
    }
    // where relay m's (s, e) rows sit in the stage-2 receive buffer
    std::vector<int64_t>& at = at_;
    at.assign(L * P * El, 0);
    for (size_t m = 0, off = 0; m < L; ++m) {
        for (size_t c = m * P * El; c < (m + 1) * P * El; ++c) {
            at[c] = static_cast<int64_t>(off);
            off += static_cast<size_t>(rcnt2_[c]);
        }
    }
    blocks_.clear();
    int64_t dst = 0;
    for (size_t e = 0; e < El; ++e) {
        local_offsets_[e] = static_cast<int32_t>(dst);
        for (size_t s = 0; s < P; ++s) {
            for (size_t m = 0; m < L; ++m) {
                const size_t c = (m * P + s) * El + e;
                if (rcnt2_[c] == 0) continue;
                blocks_.push_back({at[c], dst, rcnt2_[c]});
                dst += rcnt2_[c];
            }
        }
    }
    BGL_CHECK(dst <= INT32_MAX, "{} rows for the local experts", dst);
    local_offsets_[El] = static_cast<int32_t>(dst);
}

void NodeDispatcher::move(bool ep, const float* send, const std::vector<int64_t>& send_rows,
                          float* recv, const std::vector<int64_t>& recv_rows, int width,
                          Dtype payload) {
    const auto t0           = std::chrono::steady_clock::now();
    std::vector<int64_t>&sc = sc_, &sd = sd_, &rc = rc_, &rd = rd_;
    layout(send_rows, width, sc, sd);
    layout(recv_rows, width, rc, rd);
    const int64_t ns = total(sc), nr = total(rc);
    auto all_to_all = [&](const void* s, void* r, size_t bytes) {
        if (ep) {
            par_.ep_alltoallv(s, sc, sd, r, rc, rd, bytes);
        } else {
            nodes_.node->alltoallv_bytes(s, sc, sd, r, rc, rd, bytes);
        }
    };
    if (payload == Dtype::float32) {
        all_to_all(send, recv, sizeof(float));
    } else {
        uint16_t* hs = grow(h_send_, ns);
        uint16_t* hr = grow(h_recv_, nr);
        to_half(payload, send, hs, static_cast<size_t>(ns));
        all_to_all(hs, hr, sizeof(uint16_t));
        from_half(payload, hr, recv, static_cast<size_t>(nr));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    add_a2a_seconds(s, s);
}

void NodeDispatcher::deliver(float* dst_local, Dtype payload) {
    const auto C = static_cast<size_t>(C_);
    float* r2    = grow(r2_, total(recv2_rows_) * C_);
    move(false, s2_.data(), send2_rows_, r2, recv2_rows_, C_, payload);
    for (const Block& b : blocks_) {
        std::memcpy(dst_local + static_cast<size_t>(b.dst) * C, r2 + static_cast<size_t>(b.src) * C,
                    sizeof(float) * static_cast<size_t>(b.n) * C);
    }
}

float* NodeDispatcher::collect(std::vector<float>& dst, const float* src_local, Dtype payload) {
    const auto C = static_cast<size_t>(C_);
    float* r2    = grow(r2_, total(recv2_rows_) * C_);
    for (const Block& b : blocks_) {
        std::memcpy(r2 + static_cast<size_t>(b.src) * C, src_local + static_cast<size_t>(b.dst) * C,
                    sizeof(float) * static_cast<size_t>(b.n) * C);
    }
    float* d = grow(dst, total(send2_rows_) * C_);
    move(false, r2, recv2_rows_, d, send2_rows_, C_, payload);
    return d;
}

void NodeDispatcher::add_home(float* out, const float* back, size_t width) const {
    const auto C = static_cast<size_t>(C_);
    parallel_for(n_, [&](int64_t begin, int64_t end) {
        thread_local std::vector<const float*> row_buf;  // the token's entries' rows
        for (int64_t t = begin; t < end; ++t) {
            const int32_t a0   = tok_ent_start_[static_cast<size_t>(t)];
            const int n        = tok_ent_start_[static_cast<size_t>(t) + 1] - a0;
            const float** rows = kernels::grow(row_buf, static_cast<size_t>(n));
            for (int a = 0; a < n; ++a)
                rows[a] = back + static_cast<size_t>(tok_ent_[static_cast<size_t>(a0 + a)]) * width;
            float* o = out + static_cast<size_t>(t) * C;
            std::fill(o, o + C, 0.0f);
            kernels::add_row_sum(o, rows, n, C_);
        }
    });
}

const float* NodeDispatcher::send_tokens(const float* x, Dtype payload) {
    const auto C       = static_cast<size_t>(C_);
    const int64_t sent = total(send1_rows_);
    float* s1          = grow(s1_, sent * C_);
    parallel_for(sent, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
            std::memcpy(s1 + static_cast<size_t>(j) * C,
                        x + static_cast<size_t>(ent_tok_[static_cast<size_t>(j)]) * C,
                        sizeof(float) * C);
        }
    });
    float* r1 = grow(r1_, total(recv1_rows_) * C_);
    move(true, s1, send1_rows_, r1, recv1_rows_, C_, payload);
    return r1;
}

void NodeDispatcher::dispatch(float* x_local, const float* x, Dtype payload) {
    const auto C      = static_cast<size_t>(C_);
    const auto K      = static_cast<size_t>(K_);
    const int64_t got = total(recv1_rows_);
    const float* r1   = send_tokens(x, payload);
    float* s2         = grow(s2_, total(send2_rows_) * C_);
    parallel_for(got, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            for (size_t k = 0; k < K; ++k) {
                const int64_t p = pos2_[static_cast<size_t>(i) * K + k];
                if (p < 0) continue;
                std::memcpy(s2 + static_cast<size_t>(p) * C, r1 + static_cast<size_t>(i) * C,
                            sizeof(float) * C);
            }
        }
    });
    deliver(x_local, payload);  // exact: already payload values
}

void NodeDispatcher::combine(float* out, const float* y_local, Dtype payload) {
    const auto C       = static_cast<size_t>(C_);
    const auto K       = static_cast<size_t>(K_);
    const int64_t sent = total(send1_rows_), got = total(recv1_rows_);
    const float* y = collect(ykept_, y_local, payload);  // kept for dispatch_grad's dprobs
    float* part    = grow(r1_, got * C_);
    parallel_for(got, [&](int64_t begin, int64_t end) {
        // the entry's slot rows and weights, then one kernel call (as moe/dispatch.cpp's combine)
        thread_local std::vector<const float*> row_buf;
        thread_local std::vector<float> weight_buf;
        const float** rows = kernels::grow(row_buf, K);
        float* weights     = kernels::grow(weight_buf, K);
        for (int64_t i = begin; i < end; ++i) {
            const int32_t* mt = meta_recv_.data() + static_cast<size_t>(i) * 2 * K;
            int n             = 0;
            for (size_t k = 0; k < K; ++k) {
                const int64_t r = pos2_[static_cast<size_t>(i) * K + k];
                if (r < 0) continue;
                rows[n]      = y + static_cast<size_t>(r) * C;
                weights[n++] = std::bit_cast<float>(mt[K + k]);
            }
            kernels::weighted_row_sum(part + static_cast<size_t>(i) * C, weights, rows, n, C_);
        }
    });
    float* back = grow(s1_, sent * C_);
    move(true, part, recv1_rows_, back, send1_rows_, C_, Dtype::float32);
    add_home(out, back, C);
}

void NodeDispatcher::dispatch_grad(float* dy_local, const float* dout, Dtype payload) {
    const auto C      = static_cast<size_t>(C_);
    const auto K      = static_cast<size_t>(K_);
    const int64_t got = total(recv1_rows_);
    const float* r1   = send_tokens(dout, Dtype::float32);
    float* s2         = grow(s2_, total(send2_rows_) * C_);
    const float* y    = ykept_.data();
    parallel_for(got, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int32_t* mt = meta_recv_.data() + static_cast<size_t>(i) * 2 * K;
            SlotGradBatch<> batch(r1 + static_cast<size_t>(i) * C, C_);
            for (size_t k = 0; k < K; ++k) {
                const int64_t r = pos2_[static_cast<size_t>(i) * K + k];
                float& dp       = dprobs_rel_[static_cast<size_t>(i) * K + k];
                if (r < 0) {
                    dp = 0.0f;
                    continue;
                }
                batch.add(s2 + static_cast<size_t>(r) * C, y + static_cast<size_t>(r) * C,
                          std::bit_cast<float>(mt[K + k]), &dp);
            }
        }
    });
    deliver(dy_local, payload);
}

void NodeDispatcher::combine_grad(float* dx, float* dprobs, const float* dx_local, Dtype payload) {
    const auto C       = static_cast<size_t>(C_);
    const auto K       = static_cast<size_t>(K_);
    const auto W       = C + K;  // a row home: the summed input gradient, then the slots' dprobs
    const int64_t sent = total(send1_rows_), got = total(recv1_rows_);
    const float* s2 = collect(s2_, dx_local, payload);
    float* part     = grow(r1_, got * static_cast<int64_t>(W));
    parallel_for(got, [&](int64_t begin, int64_t end) {
        thread_local std::vector<const float*> row_buf;  // the entry's slot rows
        const float** rows = kernels::grow(row_buf, K);
        for (int64_t i = begin; i < end; ++i) {
            float* p = part + static_cast<size_t>(i) * W;
            int n    = 0;
            for (size_t k = 0; k < K; ++k) {
                const int64_t r = pos2_[static_cast<size_t>(i) * K + k];
                if (r >= 0) rows[n++] = s2 + static_cast<size_t>(r) * C;
                p[C + k] = dprobs_rel_[static_cast<size_t>(i) * K + k];
            }
            std::fill(p, p + C, 0.0f);
            kernels::add_row_sum(p, rows, n, C_);
        }
    });
    float* back = grow(s1_, sent * static_cast<int64_t>(W));
    move(true, part, recv1_rows_, back, send1_rows_, static_cast<int>(W), Dtype::float32);
    add_home(dx, back, W);
    parallel_for(n_, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            for (size_t k = 0; k < K; ++k) {
                const int32_t j = slot_ent_[static_cast<size_t>(t) * K + k];
                dprobs[static_cast<size_t>(t) * K + k] =
                    j < 0 ? 0.0f : back[static_cast<size_t>(j) * W + C + k];
            }
        }
    });
}

}  // namespace bagualu::moe

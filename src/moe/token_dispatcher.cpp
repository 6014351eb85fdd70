#include "moe/token_dispatcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace bagualu::moe {

TokenDispatcher::TokenDispatcher(dist::ParallelContext& par, int E, int C, int max_rows,
                                 int64_t max_recv)
    : par_(par),
      E_(E),
      El_(E / par.ep_size()),
      C_(C),
      max_rows_(max_rows),
      ep_size_(par.ep_size()),
      max_recv_(max_recv > 0 ? max_recv : static_cast<int64_t>(par.ep_size()) * max_rows),
      mine_(static_cast<size_t>(E)),
      counts_(static_cast<size_t>(E)),  // ep_size * El
      count_counts_(static_cast<size_t>(par.ep_size()), E / par.ep_size()),
      count_displs_(static_cast<size_t>(par.ep_size())),
      send_counts_(static_cast<size_t>(par.ep_size())),
      send_displs_(static_cast<size_t>(par.ep_size())),
      recv_counts_(static_cast<size_t>(par.ep_size())),
      recv_displs_(static_cast<size_t>(par.ep_size())),
      local_offsets_(static_cast<size_t>(E / par.ep_size() + 1)),
      staging_(static_cast<size_t>(std::max<int64_t>(max_recv_, max_rows)) * static_cast<size_t>(C)) {}

void TokenDispatcher::dispatch_preprocess(const int32_t* tokens_per_expert) {
    std::copy(tokens_per_expert, tokens_per_expert + E_, mine_.begin());
    // peer q needs only the counts of its own El experts (mine_ is expert-major, so they are
    // consecutive): E int64 in and out per rank, where gathering every rank's E counts would
    // receive EP * E
    for (int q = 0; q < ep_size_; ++q) count_displs_[static_cast<size_t>(q)] = int64_t{q} * El_;
    par_.ep().alltoallv_bytes(mine_.data(), count_counts_, count_displs_, counts_.data(),
                              count_counts_, count_displs_, sizeof(int64_t));
    int64_t off = 0;
    for (int q = 0; q < ep_size_; ++q) {
        int64_t rows = 0;
        for (int e = q * El_; e < (q + 1) * El_; ++e) rows += tokens_per_expert[e];
        send_counts_[static_cast<size_t>(q)] = rows * C_;
        send_displs_[static_cast<size_t>(q)] = off * C_;
        off += rows;
    }
    off = 0;
    for (int s = 0; s < ep_size_; ++s) {
        int64_t rows = 0;
        for (int e = 0; e < El_; ++e) rows += counts_[static_cast<size_t>(s * El_ + e)];
        recv_counts_[static_cast<size_t>(s)] = rows * C_;
        recv_displs_[static_cast<size_t>(s)] = off * C_;
        off += rows;
    }
    BGL_CHECK(off <= max_recv_, "{} rows exceed the planned {}", off, max_recv_);
    local_offsets_[0] = 0;
    for (int e = 0; e < El_; ++e) {
        int64_t rows = 0;
        for (int s = 0; s < ep_size_; ++s) rows += counts_[static_cast<size_t>(s * El_ + e)];
        local_offsets_[static_cast<size_t>(e) + 1] = local_offsets_[static_cast<size_t>(e)] + static_cast<int32_t>(rows);
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
            const int64_t rows  = counts[static_cast<size_t>(s * El + e)];
            const size_t  bytes = sizeof(float) * static_cast<size_t>(rows * C);
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
        send16_ = Buffer<uint16_t>(staging_.size());
        recv16_ = Buffer<uint16_t>(staging_.size());
    }
    const bool bf = payload == Dtype::bfloat16;
    int64_t    n_send = 0, n_recv = 0;
    for (int q = 0; q < ep_size_; ++q) {
        n_send = std::max(n_send, send_displs[static_cast<size_t>(q)] + send_counts[static_cast<size_t>(q)]);
        n_recv = std::max(n_recv, recv_displs[static_cast<size_t>(q)] + recv_counts[static_cast<size_t>(q)]);
    }
    uint16_t* s16 = send16_.data();
    for (int64_t i = 0; i < n_send; ++i) s16[i] = bf ? bf16_from_float(send[i]) : fp16_from_float(send[i]);
    par_.ep_alltoallv(s16, send_counts, send_displs, recv16_.data(), recv_counts, recv_displs,
                      sizeof(uint16_t));
    const uint16_t* r16 = recv16_.data();
    for (int64_t i = 0; i < n_recv; ++i) recv[i] = bf ? bf16_to_float(r16[i]) : fp16_to_float(r16[i]);
}

void TokenDispatcher::dispatch(float* x_local, const float* x_perm, Dtype payload) {
    if (payload == Dtype::float32) {
        par_.ep_alltoallv(x_perm, send_counts_, send_displs_, staging_.data(), recv_counts_,
                          recv_displs_, sizeof(float));
    } else {
        exchange_half(x_perm, send_counts_, send_displs_, staging_.data(), recv_counts_, recv_displs_,
                      payload);
    }
    reorder<true>(staging_.data(), x_local, counts_, recv_displs_, ep_size_, El_, C_);
}

void TokenDispatcher::combine(float* y_perm, const float* y_local, Dtype payload) {
    reorder<false>(y_local, staging_.data(), counts_, recv_displs_, ep_size_, El_, C_);
    if (payload == Dtype::float32) {
        par_.ep_alltoallv(staging_.data(), recv_counts_, recv_displs_, y_perm, send_counts_,
                          send_displs_, sizeof(float));
    } else {
        exchange_half(staging_.data(), recv_counts_, recv_displs_, y_perm, send_counts_, send_displs_,
                      payload);
    }
}

}  // namespace bagualu::moe

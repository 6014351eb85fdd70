// See comm_bench.h. Bus bandwidth follows the nccl-tests convention so numbers compare across P:
// all-to-all moves bytes * (P-1)/P per rank, reduce-scatter + all-gather 2 * bytes * (P-1)/P.
#include "bench/comm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "dist/comm/collectives.h"

namespace bagualu::bench {

namespace {

// Median over repeats of the slowest rank's time, in seconds.
template <typename Op>
double time_median(dist::Comm& comm, const CommBenchOptions& o, Op&& op) {
    for (int i = 0; i < o.warmup; ++i) op();
    std::vector<double> t;
    for (int i = 0; i < o.repeats; ++i) {
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        op();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        comm.allreduce_max(std::span<double>(&dt, 1));
        t.push_back(dt);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Row {
    size_t bytes;
    double a2a_s, mpi_s, ours_s;
    double one_s = 0, two_s = 0;  // over nodes: one level (direct) and two-level, same bits
};

double gbs(double bytes, double s) { return s > 0 ? bytes / s * 1e-9 : 0.0; }

double gib(uint64_t bytes) { return static_cast<double>(bytes) / (uint64_t{1} << 30); }

// The reduce-scatter's floats for a message of `bytes`: a multiple of P, at least P.
uint64_t rs_floats(size_t bytes, uint64_t P) {
    return std::max<uint64_t>(bytes / sizeof(float) / P, 1) * P;
}

}  // namespace

uint64_t comm_bench_rank_bytes(size_t bytes, int ranks) {
    // five buffers of about `bytes` each: beyond 2^61 their sum may not fit in 64 bits
    if (bytes > (uint64_t{1} << 61) || ranks < 1) return UINT64_MAX;
    const auto P       = static_cast<uint64_t>(ranks);
    const uint64_t n   = rs_floats(bytes, P);
    const uint64_t a2a = 2 * (bytes / P * P);  // send and receive
    return a2a + (2 * n + n / P) * sizeof(float);
}

void check_comm_bench_size(size_t max_bytes, int ranks, int ranks_here, const MemoryLeft& left) {
    const uint64_t rank = comm_bench_rank_bytes(max_bytes, ranks);
    if (rank == UINT64_MAX) {
        input_error(
            "{} bytes per rank: the benchmark's buffers would be too large for a 64-bit byte count",
            max_bytes);
    }
    // every rank on this machine holds its buffers at the same time; asked for more, the
    // ranks would each fail to allocate, or be killed once the pages are touched
    const auto here = static_cast<uint64_t>(std::max(ranks_here, 1));
    if (left.bytes != UINT64_MAX && rank > left.bytes / here) {
        input_error(
            "the largest size needs {:.1f} GiB per rank (all-to-all send and receive buffers, "
            "reduce-scatter input, output and shard), {:.1f} GiB for the {} rank(s) on this "
            "machine, which has {:.1f} GiB available ({}): expected a smaller largest size",
            gib(rank), gib(rank) * static_cast<double>(here), here, gib(left.bytes), left.what);
    }
    // the library's reduce-scatter and all-gather move a rank's block in one call, whose count
    // is an int (one process calls no MPI)
    const uint64_t block = rs_floats(max_bytes, static_cast<uint64_t>(ranks)) /
                           static_cast<uint64_t>(ranks) * sizeof(float);
    if (ranks > 1 && block > static_cast<uint64_t>(INT_MAX)) {
        input_error(
            "on {} ranks each rank's block of the reduce-scatter and all-gather would be {} "
            "bytes, beyond the {} bytes (INT_MAX) of one MPI call: expected a largest size below "
            "{}G",
            ranks, block, INT_MAX, 2 * ranks);
    }
}

int run_comm_bench(dist::Comm& comm, const CommBenchOptions& o) {
    if (o.min_bytes == 0 || o.max_bytes < o.min_bytes || o.repeats < 1 || o.warmup < 0) {
        input_error("comm bench: need 0 < min_bytes <= max_bytes, repeats >= 1, warmup >= 0");
    }
    const int P         = comm.size();
    const auto up       = static_cast<size_t>(P);
    const double factor = static_cast<double>(P - 1) / P;
    // the node layout (collectives.h, "over nodes"): a node is named by its first world rank
    int node_id =
        o.ranks_per_node > 0 ? comm.rank() / o.ranks_per_node * o.ranks_per_node : comm.rank();
    if (o.ranks_per_node == 0) comm.split_shared()->broadcast(&node_id, sizeof(int), 0);
    const dist::NodeLayout lay = dist::make_node_layout(comm, node_id);
    // min_bytes, x4, ... up to max_bytes; stops before `bytes * 4` could wrap past max_bytes
    std::vector<size_t> sizes;
    for (size_t bytes = o.min_bytes;; bytes *= 4) {
        sizes.push_back(bytes);
        if (bytes > o.max_bytes / 4) break;
    }
    std::vector<Row> rows;
    for (const size_t bytes : sizes) {
        // All-to-all: bytes/P to every peer (the own block is a local copy).
        const size_t per_peer = bytes / up;
        std::vector<std::byte> send(per_peer * up, std::byte{1}), recv(per_peer * up);
        std::vector<int64_t> counts(up, static_cast<int64_t>(per_peer)), displs(up);
        for (size_t q = 0; q < up; ++q) displs[q] = static_cast<int64_t>(q * per_peer);
        const double a2a = time_median(comm, o, [&] {
            comm.alltoallv_bytes(send.data(), counts, displs, recv.data(), counts, displs, 1);
        });

        // Reduce-scatter + all-gather of n floats (n a multiple of P for the MPI version).
        const size_t n     = rs_floats(bytes, up);
        const size_t block = n / up;
        std::vector<float> x(n, 1.0f + static_cast<float>(comm.rank())), full(n), shard(block);
        const double mpi  = time_median(comm, o, [&] {
            comm.reduce_scatter_sum_native(x, shard);
            comm.allgather(shard.data(), block * sizeof(float), full.data());
        });
        const double ours = time_median(comm, o, [&] {
            dist::reduce_scatter_mean(comm, x, shard);
            dist::all_gather(comm, shard, full);
        });
        Row row{bytes, a2a, mpi, ours};
        if (lay.nodes > 1) {
            row.one_s = time_median(comm, o, [&] {
                dist::reduce_scatter_mean(comm, lay, false, x, shard);
                dist::all_gather(comm, lay, false, std::span<const float>(shard), full);
            });
            row.two_s = time_median(comm, o, [&] {
                dist::reduce_scatter_mean(comm, lay, true, x, shard);
                dist::all_gather(comm, lay, true, std::span<const float>(shard), full);
            });
        }
        rows.push_back(row);
    }
    if (comm.rank() != 0) return 0;

    if (o.json) {
        nlohmann::json j;
        j["ranks"]          = P;
        j["repeats"]        = o.repeats;
        j["nodes"]          = lay.nodes;
        j["ranks_per_node"] = lay.per_node;
        j["rows"]           = nlohmann::json::array();
        for (const Row& r : rows) {
            const auto b = static_cast<double>(r.bytes);
            j["rows"].push_back({{"bytes", r.bytes},
                                 {"alltoall_ms", r.a2a_s * 1e3},
                                 {"alltoall_busbw_gbs", gbs(b * factor, r.a2a_s)},
                                 {"mpi_rs_ag_ms", r.mpi_s * 1e3},
                                 {"mpi_rs_ag_busbw_gbs", gbs(2 * b * factor, r.mpi_s)},
                                 {"ours_rs_ag_ms", r.ours_s * 1e3},
                                 {"ours_rs_ag_busbw_gbs", gbs(2 * b * factor, r.ours_s)},
                                 {"ours_over_mpi", r.mpi_s > 0 ? r.ours_s / r.mpi_s : 0.0},
                                 {"one_level_nodes_rs_ag_ms", r.one_s * 1e3},
                                 {"two_level_rs_ag_ms", r.two_s * 1e3}});
        }
        fmt::print("{}\n", j.dump());
        std::fflush(stdout);
        return 0;
    }
    fmt::print(
        "comm bench: {} ranks ({} node(s) of {}), median of {} (slowest rank), bus "
        "bandwidth in GB/s\n",
        P, lay.nodes, lay.per_node, o.repeats);
    fmt::print("{:>10}  {:>9} {:>7}  {:>12} {:>7}  {:>13} {:>7}  {:>8}", "bytes", "a2a ms", "GB/s",
               "mpi rs+ag ms", "GB/s", "ours rs+ag ms", "GB/s", "ours/mpi");
    if (lay.nodes > 1) fmt::print("  {:>12} {:>12} {:>7}", "1-level ms", "2-level ms", "2/1");
    fmt::print("\n");
    for (const Row& r : rows) {
        const auto b = static_cast<double>(r.bytes);
        fmt::print("{:>10}  {:>9.3f} {:>7.2f}  {:>12.3f} {:>7.2f}  {:>13.3f} {:>7.2f}  {:>8.2f}",
                   r.bytes, r.a2a_s * 1e3, gbs(b * factor, r.a2a_s), r.mpi_s * 1e3,
                   gbs(2 * b * factor, r.mpi_s), r.ours_s * 1e3, gbs(2 * b * factor, r.ours_s),
                   r.mpi_s > 0 ? r.ours_s / r.mpi_s : 0.0);
        if (lay.nodes > 1) {
            fmt::print("  {:>12.3f} {:>12.3f} {:>7.2f}", r.one_s * 1e3, r.two_s * 1e3,
                       r.one_s > 0 ? r.two_s / r.one_s : 0.0);
        }
        fmt::print("\n");
    }
    std::fflush(stdout);
    return 0;
}

}  // namespace bagualu::bench

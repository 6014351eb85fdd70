// LocalComm: the one-process Comm. No MPI at all: reductions are identities, gathers and
// all-to-alls are copies, point-to-point only talks to rank 0 (itself). Lets every algorithm built
// on Comm run, unchanged, in a plain single-process run and in single-process unit tests.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "dist/comm/comm.h"
#include "dist/comm/counters.h"

namespace bagualu::dist {

namespace {

class LocalComm final : public Comm {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    bool threads_serialized() const override { return true; }
    bool threads_multiple() const override { return true; }
    void set_background(bool) override {}

    void barrier() override {}
    void broadcast(void*, size_t bytes, int root) override {
        check_peer(root);
        count_comm(CommKind::broadcast, bytes);
    }

    void allreduce_sum(std::span<float> d) override {
        count_comm(CommKind::allreduce, d.size_bytes());
    }
    void allreduce_sum(std::span<double> d) override {
        count_comm(CommKind::allreduce, d.size_bytes());
    }
    void allreduce_sum(std::span<int64_t> d) override {
        count_comm(CommKind::allreduce, d.size_bytes());
    }
    void allreduce_max(std::span<double> d) override {
        count_comm(CommKind::allreduce, d.size_bytes());
    }
    void allreduce_max(std::span<int64_t> d) override {
        count_comm(CommKind::allreduce, d.size_bytes());
    }

    void allgather(const void* send, size_t bytes_per_rank, void* recv) override {
        count_comm(CommKind::allgather, bytes_per_rank);
        copy(recv, send, bytes_per_rank);
    }

    void scatter(const void* send, size_t bytes_per_rank, void* recv, int root) override {
        check_peer(root);
        count_comm(CommKind::scatter, bytes_per_rank);
        copy(recv, send, bytes_per_rank);
    }

    void scatter_start(const void* send, size_t bytes_per_rank, void* recv, int root) override {
        scatter(send, bytes_per_rank, recv, root);
    }
    void scatter_wait() override {}

    void alltoall(std::span<const int64_t> send_counts, std::span<int64_t> recv_counts) override {
        BGL_CHECK(send_counts.size() == 1 && recv_counts.size() == 1,
                  "alltoall needs one count per rank (1), got {} and {}", send_counts.size(),
                  recv_counts.size());
        count_comm(CommKind::alltoall, sizeof(int64_t));
        recv_counts[0] = send_counts[0];
    }

    void alltoallv_bytes(const void* send, std::span<const int64_t> send_counts,
                         std::span<const int64_t> send_displs, void* recv,
                         std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                         size_t elem_bytes) override {
        BGL_CHECK(send_counts.size() == 1 && send_displs.size() == 1 && recv_counts.size() == 1 &&
                      recv_displs.size() == 1,
                  "alltoallv needs counts and displacements for each of 1 ranks");
        BGL_CHECK(send_counts[0] == recv_counts[0], "alltoallv sends {} to itself, expects {}",
                  send_counts[0], recv_counts[0]);
        const auto eb = static_cast<int64_t>(elem_bytes);
        count_comm(CommKind::alltoallv, static_cast<uint64_t>(send_counts[0] * eb));
        copy(static_cast<char*>(recv) + recv_displs[0] * eb,
             static_cast<const char*>(send) + send_displs[0] * eb,
             static_cast<size_t>(send_counts[0] * eb));
    }

    void reduce_scatter_sum_native(std::span<const float> in, std::span<float> out) override {
        BGL_CHECK(in.size() == out.size(), "reduce_scatter_sum_native: {} elements in, {} out",
                  in.size(), out.size());
        count_comm(CommKind::reduce_scatter_native, in.size_bytes());
        copy(out.data(), in.data(), in.size() * sizeof(float));
    }

    void sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                  int src) override {
        check_peer(dest);
        check_peer(src);
        BGL_CHECK(send_bytes == recv_bytes, "sendrecv to itself: sends {} bytes, expects {}",
                  send_bytes, recv_bytes);
        count_comm(CommKind::sendrecv, send_bytes);
        copy(recv, send, send_bytes);
    }

    std::unique_ptr<Comm> split(int color, int) override {
        if (color < 0) return nullptr;
        return std::make_unique<LocalComm>();
    }
    std::unique_ptr<Comm> split_shared() override { return std::make_unique<LocalComm>(); }

    [[noreturn]] void abort(int code, const std::string& msg) override {
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", msg.c_str());
        std::fflush(stderr);
        std::exit(code);
    }

    [[noreturn]] void exit_all(int code) override {
        std::fflush(stdout);
        std::fflush(stderr);
        std::exit(code);
    }

   private:
    static void check_peer(int peer) {
        BGL_CHECK(peer == 0, "rank {} does not exist in a one-process comm", peer);
    }
    static void copy(void* dst, const void* src, size_t bytes) {
        if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    }
};

}  // namespace

std::unique_ptr<Comm> make_local_comm() { return std::make_unique<LocalComm>(); }

}  // namespace bagualu::dist

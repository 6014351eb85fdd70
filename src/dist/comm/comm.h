// The communication interface: every collective and point-to-point exchange the trainer uses.
// Two implementations: MpiComm (mpi_comm.cpp, the only code that includes <mpi.h>) and LocalComm
// (local_comm.cpp: one process, no MPI; collectives are copies or identities), so a plain
// single-process run needs no mpirun. Our own algorithms built on top of this interface (ring and
// halving/doubling reduce-scatter with online averaging, hierarchical all-to-all) live in
// collectives.h. Counts are int64 elements unless a name says bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace bagualu::dist {

class Comm {
   public:
    virtual ~Comm() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;
    // True when MPI may be called from any one thread at a time (MPI_THREAD_SERIALIZED or
    // better), as needed to run communication on a background thread. LocalComm: always true.
    virtual bool threads_serialized() const = 0;
    // True when MPI may be called from several threads at once (MPI_THREAD_MULTIPLE), as needed
    // to reduce gradients on a background thread, on a communicator of its own, while the main
    // thread runs the all-to-alls of backward. LocalComm: always true.
    virtual bool threads_multiple() const = 0;

    // For a communicator used by a background thread (the gradient reduction): its all-reduce
    // then runs as MPI_Iallreduce plus a wait, whichever thread calls it, so the result does not
    // depend on the thread (MPI_Allreduce may use another algorithm). Off by default.
    virtual void set_background(bool on) = 0;

    virtual void barrier()                                     = 0;
    virtual void broadcast(void* data, size_t bytes, int root) = 0;

    // In place, over all ranks.
    virtual void allreduce_sum(std::span<float> data)   = 0;
    virtual void allreduce_sum(std::span<double> data)  = 0;
    virtual void allreduce_sum(std::span<int64_t> data) = 0;
    virtual void allreduce_max(std::span<double> data)  = 0;
    virtual void allreduce_max(std::span<int64_t> data) = 0;

    // recv: size() * bytes_per_rank bytes, rank i's block at i * bytes_per_rank.
    virtual void allgather(const void* send, size_t bytes_per_rank, void* recv) = 0;
    // send (read on root only): size() * bytes_per_rank bytes; rank i receives the block at
    // i * bytes_per_rank into recv (bytes_per_rank bytes).
    virtual void scatter(const void* send, size_t bytes_per_rank, void* recv, int root) = 0;
    // The same without blocking: starts the scatter and returns; scatter_wait() completes it
    // (collective: every rank starts and waits). At most one per comm may be in flight; send
    // and recv must stay valid until scatter_wait returns. LocalComm: done at the start.
    virtual void scatter_start(const void* send, size_t bytes_per_rank, void* recv, int root) = 0;
    virtual void scatter_wait()                                                               = 0;
    // send_counts, recv_counts: [size()], one int64 to / from each peer.
    virtual void alltoall(std::span<const int64_t> send_counts, std::span<int64_t> recv_counts) = 0;
    // Counts and displacements: [size()], in elements of elem_bytes bytes. Counts or displacements
    // beyond INT_MAX fall back to pairwise point-to-point exchanges (alltoallv_pairwise) instead of
    // the MPI collective, whose counts are int.
    virtual void alltoallv_bytes(const void* send, std::span<const int64_t> send_counts,
                                 std::span<const int64_t> send_displs, void* recv,
                                 std::span<const int64_t> recv_counts,
                                 std::span<const int64_t> recv_displs, size_t elem_bytes) = 0;

    template <typename T>
    void alltoallv(std::span<const T> send, std::span<const int64_t> send_counts,
                   std::span<const int64_t> send_displs, std::span<T> recv,
                   std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs) {
        alltoallv_bytes(send.data(), send_counts, send_displs, recv.data(), recv_counts,
                        recv_displs, sizeof(T));
    }

    // The library's own reduce-scatter (equal blocks, sum): in has size() * out.size() elements,
    // rank r receives the sum of block r. For comparison with collectives.h and for the benchmark.
    virtual void reduce_scatter_sum_native(std::span<const float> in, std::span<float> out) = 0;

    // Point-to-point: sends send_bytes to dest while receiving recv_bytes from src. A zero-byte
    // side posts nothing (the peer must also expect zero bytes). Any size: large messages are
    // sent in chunks below INT_MAX.
    virtual void sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                          size_t recv_bytes, int src) = 0;

    // Collective over this comm. color < 0 means "in no group": the result is nullptr.
    virtual std::unique_ptr<Comm> split(int color, int key) = 0;
    // The ranks sharing this node's memory (MPI_COMM_TYPE_SHARED), ordered by rank.
    virtual std::unique_ptr<Comm> split_shared() = 0;

    // Prints msg (one line, to stderr, from the calling rank only) and ends the whole job with
    // `code`: MPI_Abort for MpiComm, exit for LocalComm.
    [[noreturn]] virtual void abort(int code, const std::string& msg) = 0;
    // Collective over this comm: every rank calls it, and every rank's process exits with `code`
    // (MPI finalized first when this is the world; otherwise the job is aborted with `code`).
    [[noreturn]] virtual void exit_all(int code) = 0;
};

// Single process, no MPI.
std::unique_ptr<Comm> make_local_comm();

// For the calling thread only: MPI waits (of sendrecv, and of background all-reduces) poll with
// MPI_Test and sleep a few microseconds between polls instead of spinning inside MPI, so a
// background thread that shares a core with compute leaves that core to the compute while it
// waits for the network. Off by default.
void set_gentle_waits(bool on);

// MPI when this process was started by a launcher (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK in
// the environment), else LocalComm without touching MPI. Thread level: gradient reduction runs on
// a background thread while the main thread's backward does its own all-to-alls, which needs
// MPI_THREAD_MULTIPLE. We request MULTIPLE and accept FUNNELED as the least (the trainer then
// reduces on the main thread); Comm::threads_multiple() and threads_serialized() say what we got.
// Sets log::g_rank when the world has more than one rank. Call once.
std::unique_ptr<Comm> init_world(int* argc, char*** argv);
// MPI_Finalize when init_world initialised MPI; a no-op otherwise. All comms must be destroyed.
void finalize_world();
// True when the environment says a launcher (mpirun, srun) started this process.
bool launched_by_mpi();
// True when a launcher that turns SIGINT and SIGTERM into the end of the whole job started this
// process: OpenMPI's mpirun (it sends SIGTERM, then SIGKILL, to every rank when it gets either,
// or when a rank aborts), as opposed to one process, or Slurm's srun, which delivers a
// scheduler's SIGTERM to the ranks themselves. Under mpirun only SIGUSR1, which it forwards to
// the ranks and nothing more, can ask them to stop gracefully (core/stop_signal.h).
bool launcher_owns_termination();
// Whether this process is rank 0 of the job as its launcher numbers it (the environment, before
// MPI is started), or runs alone: for a message every rank would print alike.
bool first_or_only_process();

}  // namespace bagualu::dist

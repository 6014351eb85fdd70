// MpiComm: Comm over an MPI communicator, plus world creation (init_world / finalize_world).
// The only file in the project that includes <mpi.h>. Communicators use MPI_ERRORS_RETURN, and
// every call goes through BGL_MPI_CHECK, which throws InternalError naming the expression, the
// world rank and MPI's error string. Element counts above INT_MAX are split into several calls
// (allreduce, broadcast, point-to-point) or routed to alltoallv_pairwise (alltoallv).
// The C API only: without these, OpenMPI/MPICH drag in the deprecated C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "dist/comm/alltoallv.h"
#include "dist/comm/comm.h"
#include "dist/comm/counters.h"

namespace bagualu::dist {

namespace {

bool g_mpi_started_here          = false;
thread_local bool t_gentle_waits = false;  // set_gentle_waits, per thread

// Completes reqs: MPI_Waitall, or with gentle waits MPI_Testall with a short sleep between polls.
void wait_all(int n, MPI_Request* reqs);

int world_rank_or_minus_one() {
    int initialized = 0;
    int finalized   = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return -1;
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

void mpi_check(int rc, const char* expr, const char* file, int line) {
    if (rc == MPI_SUCCESS) [[likely]] {
        return;
    }
    char text[MPI_MAX_ERROR_STRING] = {};
    int len                         = 0;
    MPI_Error_string(rc, text, &len);
    throw InternalError(fmt::format("{}:{}: MPI call failed on rank {}: {}: {}", file, line,
                                    world_rank_or_minus_one(), expr,
                                    std::string(text, static_cast<size_t>(len))));
}

#define BGL_MPI_CHECK(expr) mpi_check((expr), #expr, __FILE__, __LINE__)

// Largest element count passed to one MPI call; bigger requests are split.
constexpr int64_t kMaxCallCount = int64_t{1} << 30;
constexpr int kTagP2p           = 4711;

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

uint64_t alltoallv_payload(std::span<const int64_t> send_counts, size_t elem_bytes) {
    uint64_t n = 0;
    for (int64_t c : send_counts) n += static_cast<uint64_t>(c);
    return n * elem_bytes;
}

class MpiComm final : public Comm {
   public:
    MpiComm(MPI_Comm comm, bool owned, bool is_world, int thread_level)
        : comm_(comm), owned_(owned), is_world_(is_world), thread_level_(thread_level) {
        BGL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
        BGL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        BGL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    }
    ~MpiComm() override {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (owned_ && !finalized) MPI_Comm_free(&comm_);
    }
    MpiComm(const MpiComm&)            = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    bool threads_serialized() const override { return thread_level_ >= MPI_THREAD_SERIALIZED; }
    bool threads_multiple() const override { return thread_level_ >= MPI_THREAD_MULTIPLE; }
    void set_background(bool on) override { background_ = on; }

    void barrier() override { BGL_MPI_CHECK(MPI_Barrier(comm_)); }

    void broadcast(void* data, size_t bytes, int root) override {
        count_comm(CommKind::broadcast, bytes);
        auto* p = static_cast<char*>(data);
        for (size_t off = 0; off < bytes; off += kMaxCallCount) {
            const auto n = static_cast<int>(std::min<size_t>(kMaxCallCount, bytes - off));
            BGL_MPI_CHECK(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_));
        }
    }

    void allreduce_sum(std::span<float> d) override { allreduce(d, MPI_FLOAT, MPI_SUM); }
    void allreduce_sum(std::span<double> d) override { allreduce(d, MPI_DOUBLE, MPI_SUM); }
    void allreduce_sum(std::span<int64_t> d) override { allreduce(d, MPI_INT64_T, MPI_SUM); }
    void allreduce_max(std::span<double> d) override { allreduce(d, MPI_DOUBLE, MPI_MAX); }
    void allreduce_max(std::span<int64_t> d) override { allreduce(d, MPI_INT64_T, MPI_MAX); }

    void allgather(const void* send, size_t bytes_per_rank, void* recv) override {
        count_comm(CommKind::allgather, bytes_per_rank);
        BGL_CHECK(fits_int(static_cast<int64_t>(bytes_per_rank)),
                  "allgather of {} bytes per rank exceeds INT_MAX", bytes_per_rank);
        BGL_MPI_CHECK(MPI_Allgather(send, static_cast<int>(bytes_per_rank), MPI_BYTE, recv,
                                    static_cast<int>(bytes_per_rank), MPI_BYTE, comm_));
    }

    void scatter(const void* send, size_t bytes_per_rank, void* recv, int root) override {
        count_comm(CommKind::scatter, bytes_per_rank);
        BGL_CHECK(fits_int(static_cast<int64_t>(bytes_per_rank)),
                  "scatter of {} bytes per rank exceeds INT_MAX", bytes_per_rank);
        const auto n = static_cast<int>(bytes_per_rank);
        BGL_MPI_CHECK(MPI_Scatter(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_));
    }

    void scatter_start(const void* send, size_t bytes_per_rank, void* recv, int root) override {
        BGL_CHECK(scatter_req_ == MPI_REQUEST_NULL, "a scatter is already in flight on this comm");
        count_comm(CommKind::scatter, bytes_per_rank);
        BGL_CHECK(fits_int(static_cast<int64_t>(bytes_per_rank)),
                  "scatter of {} bytes per rank exceeds INT_MAX", bytes_per_rank);
        const auto n = static_cast<int>(bytes_per_rank);
        BGL_MPI_CHECK(
            MPI_Iscatter(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_, &scatter_req_));
    }

    void scatter_wait() override {
        if (scatter_req_ == MPI_REQUEST_NULL) return;
        BGL_MPI_CHECK(MPI_Wait(&scatter_req_, MPI_STATUS_IGNORE));  // sets it to MPI_REQUEST_NULL
    }

    void alltoall(std::span<const int64_t> send_counts, std::span<int64_t> recv_counts) override {
        BGL_CHECK(send_counts.size() == static_cast<size_t>(size_) &&
                      recv_counts.size() == static_cast<size_t>(size_),
                  "alltoall needs one count per rank ({}), got {} and {}", size_,
                  send_counts.size(), recv_counts.size());
        count_comm(CommKind::alltoall, sizeof(int64_t) * send_counts.size());
        BGL_MPI_CHECK(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, recv_counts.data(), 1,
                                   MPI_INT64_T, comm_));
    }

    void alltoallv_bytes(const void* send, std::span<const int64_t> send_counts,
                         std::span<const int64_t> send_displs, void* recv,
                         std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                         size_t elem_bytes) override {
        const auto p = static_cast<size_t>(size_);
        BGL_CHECK(send_counts.size() == p && send_displs.size() == p && recv_counts.size() == p &&
                      recv_displs.size() == p,
                  "alltoallv needs counts and displacements for each of {} ranks", size_);
        BGL_CHECK(elem_bytes > 0 && elem_bytes <= INT_MAX, "bad element size {}", elem_bytes);
        count_comm(CommKind::alltoallv, alltoallv_payload(send_counts, elem_bytes));
        const auto all_fit = [](std::span<const int64_t> v) {
            return std::all_of(v.begin(), v.end(), fits_int);
        };
        if (!all_fit(send_counts) || !all_fit(send_displs) || !all_fit(recv_counts) ||
            !all_fit(recv_displs)) {
            alltoallv_pairwise(*this, send, send_counts, send_displs, recv, recv_counts,
                               recv_displs, elem_bytes);
            return;
        }
        std::vector<int> sc(p), sd(p), rc(p), rd(p);
        for (size_t i = 0; i < p; ++i) {
            sc[i] = static_cast<int>(send_counts[i]);
            sd[i] = static_cast<int>(send_displs[i]);
            rc[i] = static_cast<int>(recv_counts[i]);
            rd[i] = static_cast<int>(recv_displs[i]);
        }
        MPI_Datatype elem = MPI_BYTE;
        if (elem_bytes > 1) {
            BGL_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(elem_bytes), MPI_BYTE, &elem));
            BGL_MPI_CHECK(MPI_Type_commit(&elem));
        }
        const int rc_call = MPI_Alltoallv(send, sc.data(), sd.data(), elem, recv, rc.data(),
                                          rd.data(), elem, comm_);
        if (elem_bytes > 1) MPI_Type_free(&elem);
        BGL_MPI_CHECK(rc_call);
    }

    void reduce_scatter_sum_native(std::span<const float> in, std::span<float> out) override {
        BGL_CHECK(in.size() == out.size() * static_cast<size_t>(size_),
                  "reduce_scatter_sum_native: in has {} elements, expected {} x {}", in.size(),
                  size_, out.size());
        BGL_CHECK(fits_int(static_cast<int64_t>(out.size())), "block of {} exceeds INT_MAX",
                  out.size());
        count_comm(CommKind::reduce_scatter_native, sizeof(float) * in.size());
        BGL_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size()),
                                               MPI_FLOAT, MPI_SUM, comm_));
    }

    void sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                  int src) override {
        count_comm(CommKind::sendrecv, send_bytes);
        std::vector<MPI_Request> reqs;
        reqs.reserve(2 + (send_bytes + recv_bytes) / kMaxCallCount);
        auto* r = static_cast<char*>(recv);
        for (size_t off = 0; off < recv_bytes; off += kMaxCallCount) {
            const auto n = static_cast<int>(std::min<size_t>(kMaxCallCount, recv_bytes - off));
            BGL_MPI_CHECK(
                MPI_Irecv(r + off, n, MPI_BYTE, src, kTagP2p, comm_, &reqs.emplace_back()));
        }
        const auto* s = static_cast<const char*>(send);
        for (size_t off = 0; off < send_bytes; off += kMaxCallCount) {
            const auto n = static_cast<int>(std::min<size_t>(kMaxCallCount, send_bytes - off));
            BGL_MPI_CHECK(
                MPI_Isend(s + off, n, MPI_BYTE, dest, kTagP2p, comm_, &reqs.emplace_back()));
        }
        wait_all(static_cast<int>(reqs.size()), reqs.data());
    }

    std::unique_ptr<Comm> split(int color, int key) override {
        MPI_Comm out = MPI_COMM_NULL;
        BGL_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
        if (out == MPI_COMM_NULL) return nullptr;
        return std::make_unique<MpiComm>(out, true, false, thread_level_);
    }

    std::unique_ptr<Comm> split_shared() override {
        MPI_Comm out = MPI_COMM_NULL;
        BGL_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
        return std::make_unique<MpiComm>(out, true, false, thread_level_);
    }

    [[noreturn]] void abort(int code, const std::string& msg) override {
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", msg.c_str());
        std::fflush(stderr);
        MPI_Abort(comm_, code);
        std::_Exit(code);
    }

    [[noreturn]] void exit_all(int code) override {
        std::fflush(stdout);
        std::fflush(stderr);
        if (!is_world_) {
            MPI_Abort(comm_, code);
            std::_Exit(code);
        }
        MPI_Finalize();
        std::exit(code);
    }

   private:
    template <typename T>
    void allreduce(std::span<T> d, MPI_Datatype type, MPI_Op op) {
        count_comm(CommKind::allreduce, sizeof(T) * d.size());
        for (size_t off = 0; off < d.size(); off += kMaxCallCount) {
            const auto n = static_cast<int>(std::min<size_t>(kMaxCallCount, d.size() - off));
            if (background_) {
                MPI_Request req = MPI_REQUEST_NULL;
                BGL_MPI_CHECK(
                    MPI_Iallreduce(MPI_IN_PLACE, d.data() + off, n, type, op, comm_, &req));
                wait_all(1, &req);
            } else {
                BGL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, d.data() + off, n, type, op, comm_));
            }
        }
    }

    MPI_Comm comm_;
    bool owned_;                       // MPI_Comm_free on destruction (false for MPI_COMM_WORLD)
    bool is_world_;                    // MPI_COMM_WORLD: exit_all may finalize
    int thread_level_;                 // the MPI_THREAD_* level MPI_Init_thread provided
    bool background_         = false;  // set_background: nonblocking all-reduce
    MPI_Request scatter_req_ = MPI_REQUEST_NULL;  // the scatter_start in flight
    int rank_                = 0;
    int size_                = 1;
};

void wait_all(int n, MPI_Request* reqs) {
    if (!t_gentle_waits) {
        BGL_MPI_CHECK(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE));
        return;
    }
    for (;;) {
        int done = 0;
        BGL_MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
        if (done) return;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

}  // namespace

void set_gentle_waits(bool on) { t_gentle_waits = on; }

bool launched_by_mpi() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
           std::getenv("PMI_RANK") != nullptr;
}

bool launcher_owns_termination() {
    // ORTE's environment for the processes mpirun starts (OpenMPI 4); srun's have none of it
    return std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr ||
           std::getenv("OMPI_MCA_orte_launch") != nullptr ||
           (launched_by_mpi() && std::getenv("SLURM_STEP_ID") == nullptr);
}

bool first_or_only_process() {
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
        if (const char* rank = std::getenv(var)) return std::string(rank) == "0";
    }
    return true;
}

std::unique_ptr<Comm> init_world(int* argc, char*** argv) {
    if (!launched_by_mpi()) return make_local_comm();
    int initialized = 0;
    BGL_MPI_CHECK(MPI_Initialized(&initialized));
    BGL_CHECK(!initialized, "init_world called with MPI already initialised");
    int provided = MPI_THREAD_SINGLE;
    BGL_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    g_mpi_started_here = true;
    BGL_CHECK(provided >= MPI_THREAD_FUNNELED,
              "MPI provides thread level {}, at least MPI_THREAD_FUNNELED ({}) is needed", provided,
              MPI_THREAD_FUNNELED);
    auto world = std::make_unique<MpiComm>(MPI_COMM_WORLD, false, true, provided);
    if (world->size() > 1) log::g_rank = world->rank();
    return world;
}

void finalize_world() {
    if (!g_mpi_started_here) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) BGL_MPI_CHECK(MPI_Finalize());
    g_mpi_started_here = false;
}

}  // namespace bagualu::dist

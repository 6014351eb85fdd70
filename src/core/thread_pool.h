// Persistent compute thread pool: one worker per core the process may use (its affinity mask),
// each optionally pinned to its core. The calling thread is worker 0. Work is split statically
// (worker i always gets the same chunk), so results do not depend on timing.
// Not for I/O or communication: those run on their own helper thread, never on a compute worker.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace bagualu {

// CPUs in this process's affinity mask as it was at the first call (process start-up), ascending;
// or the part of it set_allowed_cpus gave this process.
std::vector<int> allowed_cpus();
// The mask as the process started, whatever set_allowed_cpus says.
std::vector<int> launcher_cpus();
// The compute pool's CPUs from now on: `cpus` (ascending), this rank's share of a mask
// that other ranks on the machine were given too (dist/node_cpus.h). The pool is rebuilt on
// them at the next set_compute_threads. Call at start-up, before any parallel work. Empty: the
// launcher's mask again.
void set_allowed_cpus(std::vector<int> cpus);
// CPU numbers as ranges: "0-3,8".
std::string cpu_list_text(const std::vector<int>& cpus);

class ThreadPool {
   public:
    // n_threads <= 0: one per allowed CPU.
    explicit ThreadPool(int n_threads = 0, bool pin = true);
    ~ThreadPool();
    ThreadPool(const ThreadPool&)            = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    // The CPUs it was built on (allowed_cpus() then).
    const std::vector<int>& cpus() const { return cpus_; }
    // Runs fn(tid) for every tid in [0, size()), tid 0 on the calling thread; returns when all
    // are done and rethrows the first exception any of them threw. Not reentrant.
    void run(FunctionRef<void(int)> fn);

   private:
    void worker_loop(int tid);

    int n_threads_;
    std::vector<int> cpus_;
    std::vector<std::thread> workers_;
    FunctionRef<void(int)> job_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    std::atomic<bool> stop_{false};
    std::mutex error_mutex_;
    std::exception_ptr error_;
};

// The process-wide compute pool used by kernels. Created on first use with the default size,
// or explicitly (before first use) by set_compute_threads.
ThreadPool& compute_pool();
void set_compute_threads(int n_threads, bool pin = true);

// Splits [0, n) into size() contiguous chunks and calls f(begin, end) for each non-empty one.
template <typename F>
void parallel_for(int64_t n, F&& f) {
    ThreadPool& pool = compute_pool();
    const int nt     = pool.size();
    if (nt == 1 || n <= 1) {
        if (n > 0) f(int64_t{0}, n);
        return;
    }
    pool.run([&](int tid) {
        const int64_t begin = n * tid / nt;
        const int64_t end   = n * (tid + 1) / nt;
        if (begin < end) f(begin, end);
    });
}

}  // namespace bagualu

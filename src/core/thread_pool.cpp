#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <memory>

#include "core/numbers.h"

namespace bagualu {

// The mask as the process started (the launcher's binding). Read once: pinning the calling
// thread to its core later narrows what sched_getaffinity reports, and a pool rebuilt after
// that must still see every core the process was given.
static std::vector<int> read_allowed_cpus();

std::vector<int> launcher_cpus() {
    static const std::vector<int> cpus = read_allowed_cpus();
    return cpus;
}

static std::vector<int>& cpu_share() {
    static std::vector<int> share;  // empty: the launcher's mask
    return share;
}

std::vector<int> allowed_cpus() {
    const std::vector<int>& share = cpu_share();
    return share.empty() ? launcher_cpus() : share;
}

void set_allowed_cpus(std::vector<int> cpus) { cpu_share() = std::move(cpus); }

std::string cpu_list_text(const std::vector<int>& cpus) { return ranges_text(cpus, ","); }

static std::vector<int> read_allowed_cpus() {
    std::vector<int> cpus;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
        }
    }
    if (cpus.empty()) {
        const unsigned hc = std::thread::hardware_concurrency();
        for (unsigned c = 0; c < (hc ? hc : 1); ++c) cpus.push_back(static_cast<int>(c));
    }
    return cpus;
}

static void pin_to(std::thread::native_handle_type h, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(h, sizeof(set), &set);  // best effort: a failure only costs speed
}

ThreadPool::ThreadPool(int n_threads, bool pin) : cpus_(allowed_cpus()) {
    const std::vector<int>& cpus = cpus_;
    n_threads_                   = n_threads > 0 ? n_threads : static_cast<int>(cpus.size());
    // Pinning only makes sense when every worker has a core of its own.
    pin = pin && n_threads_ <= static_cast<int>(cpus.size()) && n_threads_ > 1;
    workers_.reserve(static_cast<size_t>(n_threads_ - 1));
    for (int tid = 1; tid < n_threads_; ++tid) {
        workers_.emplace_back([this, tid] { worker_loop(tid); });
        if (pin) pin_to(workers_.back().native_handle(), cpus[static_cast<size_t>(tid)]);
    }
    if (pin) pin_to(pthread_self(), cpus[0]);
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop(int tid) {
    uint64_t seen = 0;
    for (;;) {
        // Spin briefly (kernels come in quick succession), then sleep on the futex.
        for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen;
             ++spin) {
            __builtin_ia32_pause();
        }
        generation_.wait(seen, std::memory_order_acquire);
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        try {
            job_(tid);
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex_);
            if (!error_) error_ = std::current_exception();
        }
        if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_one();
    }
}

void ThreadPool::run(FunctionRef<void(int)> fn) {
    if (n_threads_ == 1) {
        fn(0);
        return;
    }
    job_ = fn;
    remaining_.store(n_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    std::exception_ptr own;
    try {
        fn(0);
    } catch (...) {
        own = std::current_exception();
    }
    for (int spin = 0; spin < 20000 && remaining_.load(std::memory_order_acquire) != 0; ++spin) {
        __builtin_ia32_pause();
    }
    for (int r = remaining_.load(std::memory_order_acquire); r != 0;
         r     = remaining_.load(std::memory_order_acquire)) {
        remaining_.wait(r, std::memory_order_acquire);
    }
    if (own) std::rethrow_exception(own);
    if (error_) {
        std::exception_ptr e = error_;
        error_               = nullptr;
        std::rethrow_exception(e);
    }
}

static std::unique_ptr<ThreadPool>& pool_slot() {
    static std::unique_ptr<ThreadPool> pool;
    return pool;
}

ThreadPool& compute_pool() {
    auto& p = pool_slot();
    if (!p) p = std::make_unique<ThreadPool>();
    return *p;
}

void set_compute_threads(int n_threads, bool pin) {
    auto& p                     = pool_slot();
    const std::vector<int> cpus = allowed_cpus();
    if (p && p->cpus() == cpus &&
        p->size() == (n_threads > 0 ? n_threads : static_cast<int>(cpus.size())))
        return;
    p.reset();
    p = std::make_unique<ThreadPool>(n_threads, pin);
}

}  // namespace bagualu

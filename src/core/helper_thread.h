// The communication / I/O helper: one background thread that runs submitted jobs in order,
// beside the compute pool (it never takes a compute worker's place; on a machine with spare
// cores it gets one of its own, otherwise the OS shares a core with it). Used for data
// prefetch, and meant for gradient-reduction overlap and asynchronous checkpoint writes.
// A job is a FunctionRef: the caller keeps the callable alive until wait() returns, so
// submitting allocates nothing.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "core/function_ref.h"

namespace bagualu {

class HelperThread {
   public:
    using Ticket = uint64_t;

    HelperThread();
    ~HelperThread();
    HelperThread(const HelperThread&)            = delete;
    HelperThread& operator=(const HelperThread&) = delete;

    // Queues fn; at most kCapacity jobs may be pending (submit blocks when the queue is full).
    Ticket submit(FunctionRef<void()> fn);
    // Blocks until job t (and every job before it) has finished; rethrows its exception.
    void wait(Ticket t);
    // True when job t has finished.
    bool done(Ticket t) const { return finished_.load(std::memory_order_acquire) >= t; }

    static constexpr int kCapacity = 64;

   private:
    void loop();

    std::mutex mutex_;
    std::condition_variable cv_;
    FunctionRef<void()> queue_[kCapacity];  // [ticket % kCapacity]
    Ticket submitted_ = 0;                  // tickets handed out; guarded by mutex_
    std::atomic<Ticket> finished_{0};
    std::exception_ptr error_;  // first failure, rethrown by wait(); guarded by mutex_
    bool stop_ = false;
    std::thread thread_;
};

// The process's helper thread, started on first use (the data loader's prefetch runs on it).
HelperThread& helper_thread();

}  // namespace bagualu

#include "core/helper_thread.h"

#include <pthread.h>
#include <sched.h>

#include "core/thread_pool.h"

namespace bagualu {

HelperThread& helper_thread() {
    static HelperThread h;
    return h;
}

HelperThread::HelperThread() : thread_([this] { loop(); }) {
    // A new thread inherits its creator's affinity, and the compute pool pins the main thread to
    // one core: give the helper back every core the process was started with.
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int c : allowed_cpus()) CPU_SET(c, &set);
    pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set);  // best effort
}

HelperThread::~HelperThread() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

HelperThread::Ticket HelperThread::submit(FunctionRef<void()> fn) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return submitted_ - finished_.load() < kCapacity; });
    queue_[submitted_ % kCapacity] = fn;
    const Ticket t                 = ++submitted_;
    lock.unlock();
    cv_.notify_all();
    return t;
}

void HelperThread::wait(Ticket t) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return finished_.load() >= t; });
    if (error_) {
        std::exception_ptr e = error_;
        error_               = nullptr;
        std::rethrow_exception(e);
    }
}

void HelperThread::loop() {
    for (;;) {
        FunctionRef<void()> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [&] { return stop_ || submitted_ > finished_.load(); });
            if (submitted_ == finished_.load()) return;  // stop requested and nothing queued
            job = queue_[finished_.load() % kCapacity];
        }
        try {
            job();
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            finished_.fetch_add(1, std::memory_order_release);
        }
        cv_.notify_all();
    }
}

}  // namespace bagualu

// Runs work on threads that have never run a GEMM, to see what it makes the GEMMs' packing
// buffers (kernels/gemm/driver.h, grow-only and per thread) grow to.
#pragma once
#include <cstddef>
#include <thread>

#include "core/thread_pool.h"
#include "kernels/gemm/driver.h"

namespace bagualu::testing {

// What f makes the packing buffers grow by, run on a new thread with a new compute pool of
// `threads` threads (their buffers start empty; the other threads' stay as they are meanwhile).
// The pool is left with `threads` threads.
template <typename F>
size_t packing_growth_on_fresh_threads(int threads, F&& f) {
    size_t grown = 0;
    std::thread t([&] {
        set_compute_threads(threads == 1 ? 2 : 1);  // a new pool: its workers start without buffers
        set_compute_threads(threads);
        const size_t before = kernels::gemm::pack_buffer_bytes();
        f();
        grown = kernels::gemm::pack_buffer_bytes() - before;
    });
    t.join();
    return grown;
}

}  // namespace bagualu::testing

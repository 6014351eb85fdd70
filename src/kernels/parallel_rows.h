// Threading helpers shared by the memory-bound kernels (ops.cpp, mixed.cpp): a row split that
// stays on the calling thread for small work, a column split whose sums do not depend on the
// thread count, and grow-only scratch buffers.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace bagualu::kernels {

// Below this many elements of work a kernel stays on the calling thread: waking the pool
// costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 14;
// Column-parallel reductions split the columns in blocks of this many (one cache line).
inline constexpr int64_t kColBlock = 16;

// f(begin, end) over [0, n), threaded when n * work_per_item is large enough.
template <typename F>
void parallel_rows(int64_t n, int64_t work_per_item, F&& f) {
    if (n <= 0) return;
    if (n * work_per_item < kMinParallelWork) {
        f(int64_t{0}, n);
        return;
    }
    parallel_for(n, f);
}

// f(c0, c1) over column ranges of [0, C) that are whole kColBlocks (the last one ragged); each
// call sweeps all `rows` rows in order, so column sums do not depend on the split.
template <typename F>
void parallel_cols(int64_t C, int64_t rows, F&& f) {
    const int64_t nblk = (C + kColBlock - 1) / kColBlock;
    parallel_rows(nblk, rows * kColBlock,
                  [&](int64_t b0, int64_t b1) { f(b0 * kColBlock, std::min(b1 * kColBlock, C)); });
}

// Grow-only scratch: returns buf.data() with at least n elements.
template <typename T, typename Alloc>
T* grow(std::vector<T, Alloc>& buf, size_t n) {
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

}  // namespace bagualu::kernels

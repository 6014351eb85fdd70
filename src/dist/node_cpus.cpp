#include "dist/node_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace bagualu::dist {

namespace {

// A mask as CPU_SETSIZE bits, the same size on every rank (one fixed-size all-gather).
constexpr size_t kMaskWords = CPU_SETSIZE / 64;
using Mask                  = std::vector<uint64_t>;

Mask mask_of(const std::vector<int>& cpus) {
    Mask m(kMaskWords, 0);
    for (const int c : cpus) {
        BGL_CHECK(c >= 0 && c < CPU_SETSIZE, "CPU {} beyond CPU_SETSIZE", c);
        m[static_cast<size_t>(c) / 64] |= uint64_t{1} << (c % 64);
    }
    return m;
}

}  // namespace

std::vector<int> cpu_part(const std::vector<int>& cpus, int j, int g) {
    BGL_CHECK(g >= 1 && j >= 0 && j < g && !cpus.empty(), "cpu_part j={} g={} of {} CPUs", j, g,
              cpus.size());
    const size_t n = cpus.size(), G = static_cast<size_t>(g), J = static_cast<size_t>(j);
    if (n < G) return {cpus[J % n]};
    return std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(J * n / G),
                            cpus.begin() + static_cast<std::ptrdiff_t>((J + 1) * n / G));
}

std::vector<int> node_cpu_share(Comm& node, const std::vector<int>& mine) {
    const int n = node.size();
    if (n == 1 || mine.empty()) return mine;
    const Mask m = mask_of(mine);
    Mask all(kMaskWords * static_cast<size_t>(n));
    node.allgather(m.data(), kMaskWords * sizeof(uint64_t), all.data());
    int j = 0, g = 0;  // my place among the ranks given my mask, and their count
    for (int r = 0; r < n; ++r) {
        const bool same = std::equal(
            m.begin(), m.end(), all.begin() + static_cast<std::ptrdiff_t>(size_t(r) * kMaskWords));
        if (same && r < node.rank()) ++j;
        g += same;
    }
    return g == 1 ? mine : cpu_part(mine, j, g);
}

}  // namespace bagualu::dist

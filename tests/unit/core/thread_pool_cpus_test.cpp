// The CPU parts ranks given one mask take (dist::cpu_part), the pool built on a narrowed set of
// CPUs (set_allowed_cpus), and CPU lists as ranges.
#include <gtest/gtest.h>

#include <vector>

#include "core/thread_pool.h"
#include "dist/node_cpus.h"

namespace bagualu {
namespace {

TEST(CpuPart, ContiguousNearlyEqualPartsCoverTheMask) {
    const std::vector<int> cpus{0, 1, 2, 3, 4, 5, 6};
    std::vector<int> joined;
    for (int j = 0; j < 3; ++j) {
        const std::vector<int> p = dist::cpu_part(cpus, j, 3);
        EXPECT_GE(p.size(), 2u);
        EXPECT_LE(p.size(), 3u);
        joined.insert(joined.end(), p.begin(), p.end());
    }
    EXPECT_EQ(joined, cpus);
    EXPECT_EQ(dist::cpu_part(cpus, 0, 1), cpus);
    // more ranks than CPUs: one each, in turn
    EXPECT_EQ(dist::cpu_part({4, 9}, 0, 3), std::vector<int>{4});
    EXPECT_EQ(dist::cpu_part({4, 9}, 1, 3), std::vector<int>{9});
    EXPECT_EQ(dist::cpu_part({4, 9}, 2, 3), std::vector<int>{4});
}

TEST(CpuPart, PoolIsBuiltOnTheNarrowedCpus) {
    const std::vector<int> all = launcher_cpus();
    ASSERT_FALSE(all.empty());
    set_allowed_cpus({all.front()});
    set_compute_threads(0);
    EXPECT_EQ(compute_pool().size(), 1);
    EXPECT_EQ(compute_pool().cpus(), std::vector<int>{all.front()});
    EXPECT_EQ(allowed_cpus(), std::vector<int>{all.front()});
    EXPECT_EQ(launcher_cpus(), all);
    set_allowed_cpus({});  // back to the launcher's mask
    set_compute_threads(0);
    EXPECT_EQ(compute_pool().size(), static_cast<int>(all.size()));
    EXPECT_EQ(compute_pool().cpus(), all);
}

TEST(CpuPart, ListsAsRanges) {
    EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8}), "0-3,8");
    EXPECT_EQ(cpu_list_text({5}), "5");
    EXPECT_EQ(cpu_list_text({1, 3, 4}), "1,3-4");
    EXPECT_EQ(cpu_list_text({}), "");
}

}  // namespace
}  // namespace bagualu

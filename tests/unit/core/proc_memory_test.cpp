// The control groups' memory room (core/proc_memory.h) read from fake cgroup trees: the least of
// limit - usage over a group and its ancestors, in v2 and in v1, "max" and v1's huge number as no
// limit, a path the mount does not show read from its nearest ancestor, and usage at or above the
// limit as no room. And the executable's pages made resident for calibrate's baseline.
#include "core/proc_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace bagualu {
namespace {

// A scratch directory named for the test, removed at the end.
class TempDir {
   public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        path_            = std::filesystem::temp_directory_path() /
                ("bgl_cgroup_" + std::string(info->name()) + "_" + std::to_string(getpid()));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::filesystem::path& path() const { return path_; }

   private:
    std::filesystem::path path_;
};

void put(const std::filesystem::path& file, const std::string& text) {
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
}

TEST(CgroupMemoryLeft, V2TakesTheLeastRoomOverTheGroupAndItsAncestors) {
    TempDir dir;
    const std::filesystem::path root = dir.path();
    put(root / "memory.max", "max");  // the root: no limit
    put(root / "memory.current", "123456789");
    put(root / "slurm/memory.max", "10000");  // an ancestor: 10000 - 4000
    put(root / "slurm/memory.current", "4000");
    put(root / "slurm/job_7/memory.max", "max");
    put(root / "slurm/job_7/memory.current", "3000");
    put(root / "slurm/job_7/step_0/memory.max", "9000");  // the group: 9000 - 2000
    put(root / "slurm/job_7/step_0/memory.current", "2000");
    int version = 0;
    EXPECT_EQ(cgroup_memory_left("0::/slurm/job_7/step_0\n", root.string(), &version), 6000u);
    EXPECT_EQ(version, 2);
    put(root / "slurm/job_7/step_0/memory.max", "5000");
    EXPECT_EQ(cgroup_memory_left("0::/slurm/job_7/step_0\n", root.string()), 3000u);
    // usage above its limit (memory charged before a limit was lowered): no room
    put(root / "slurm/job_7/step_0/memory.current", "7000");
    EXPECT_EQ(cgroup_memory_left("0::/slurm/job_7/step_0\n", root.string()), 0u);
    // no limit anywhere on the path
    EXPECT_EQ(cgroup_memory_left("0::/other\n", root.string()), UINT64_MAX);
    EXPECT_EQ(cgroup_memory_left("", root.string()), UINT64_MAX);
}

TEST(CgroupMemoryLeft, V1ReadsTheMemoryControllersGroupOrItsNearestAncestor) {
    TempDir dir;
    const std::filesystem::path root = dir.path();
    const std::filesystem::path mem  = root / "memory";
    put(mem / "memory.limit_in_bytes", "9223372036854771712");  // v1's "no limit"
    put(mem / "memory.usage_in_bytes", "3333054464");
    put(mem / "job/memory.limit_in_bytes", "1073741824");
    put(mem / "job/memory.usage_in_bytes", "73741824");
    const std::string proc = "9:name=systemd:/\n4:cpuacct,memory:/job/task_9\n1:cpu:/\n0::/\n";
    int version            = 0;
    // job/task_9 is not in the mount: job's limit applies
    EXPECT_EQ(cgroup_memory_left(proc, root.string(), &version), 1000000000u);
    EXPECT_EQ(version, 1);
    // only the root, without a limit
    EXPECT_EQ(cgroup_memory_left("4:memory:/elsewhere\n", root.string()), UINT64_MAX);
}

TEST(CgroupMemoryLeft, ThisProcessGetsAFigure) {
    // whatever the machine: a figure from /proc/meminfo or a cgroup, never more than the
    // machine's memory (MemAvailable itself moves with the other tests running beside this one)
    const MemoryLeft m = memory_left();
    ASSERT_GT(m.bytes, 0u);
    ASSERT_NE(m.bytes, UINT64_MAX) << "no /proc/meminfo";
    EXPECT_LE(m.bytes, total_memory_bytes());
    EXPECT_TRUE(m.what == "MemAvailable" || m.what.rfind("cgroup ", 0) == 0) << m.what;
}

// Resident and mapped kB of this executable's readable file mappings, from /proc/self/smaps.
std::pair<uint64_t, uint64_t> own_image_kb() {
    const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::ifstream smaps("/proc/self/smaps");
    uint64_t rss = 0, size = 0;
    bool mine = false;
    std::string line;
    while (std::getline(smaps, line)) {
        std::istringstream in(line);
        std::string first, second;
        in >> first >> second;
        if (first.find('-') != std::string::npos && first.back() != ':') {  // a mapping's line
            std::string offset, dev, inode, path;
            in >> offset >> dev >> inode;
            std::getline(in >> std::ws, path);
            mine = path == exe && second[0] == 'r';
        } else if (mine && first == "Rss:") {
            rss += std::stoull(second);
        } else if (mine && first == "Size:") {
            size += std::stoull(second);
        }
    }
    return {rss, size};
}

TEST(TouchOwnImage, MakesEveryPageOfTheBinaryResident) {
    const auto [rss0, size0] = own_image_kb();
    ASSERT_GT(size0, 0u) << "no readable mapping of /proc/self/exe in /proc/self/smaps";
    const uint64_t bytes = touch_own_image();
    EXPECT_EQ(bytes, size0 * 1024);
    const auto [rss, size] = own_image_kb();
    EXPECT_EQ(rss, size) << "before: " << rss0 << " of " << size0 << " kB resident";
}

}  // namespace
}  // namespace bagualu

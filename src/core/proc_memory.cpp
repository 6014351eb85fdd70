#include "core/proc_memory.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace bagualu {

namespace {

// Bytes of the "Field:   123 kB" line of a /proc file; 0 where there is none.
uint64_t kib_line_bytes(const char* path, const std::string& field) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        if (line.compare(0, field.size(), field) == 0 && line.size() > field.size() &&
            line[field.size()] == ':') {
            return std::stoull(line.substr(field.size() + 1)) * 1024;
        }
    }
    return 0;
}

// One byte of every `page` bytes in [lo, hi), summed. The reads cross the globals' redzones of an
// instrumented build on purpose: not checked by the sanitizers (and not inlined into a function
// that is).
[[gnu::noinline, gnu::no_sanitize_address, gnu::no_sanitize("thread")]] unsigned read_pages(
    uint64_t lo, uint64_t hi, uint64_t page) {
    unsigned sum = 0;
    for (uint64_t a = lo; a < hi; a += page)
        sum += *reinterpret_cast<const volatile unsigned char*>(a);
    return sum;
}

}  // namespace

uint64_t touch_own_image() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    std::ifstream maps("/proc/self/maps");
    if (ec || !maps) return 0;
    const uint64_t page = 4096;  // a read per 4 KiB touches every page of any larger size too
    uint64_t bytes      = 0;
    unsigned sum        = 0;
    std::string line;
    // "start-end perms offset dev inode path"
    while (std::getline(maps, line)) {
        std::istringstream in(line);
        std::string range, perms, offset, dev, inode, path;
        in >> range >> perms >> offset >> dev >> inode;
        std::getline(in >> std::ws, path);
        if (path != exe.string() || perms.empty() || perms[0] != 'r') continue;
        const size_t dash = range.find('-');
        if (dash == std::string::npos) continue;
        const uint64_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
        const uint64_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
        sum += read_pages(lo, hi, page);
        bytes += hi - lo;
    }
    static volatile unsigned sink = 0;
    sink                          = sink + sum;
    return bytes;
}

uint64_t proc_status_bytes(const std::string& field) {
    return kib_line_bytes("/proc/self/status", field);
}

uint64_t meminfo_bytes(const std::string& field) { return kib_line_bytes("/proc/meminfo", field); }

namespace {

// The first number of a cgroup file ("max", a missing file or no number: no limit, UINT64_MAX).
uint64_t cgroup_number(const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string word;
    if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos)
        return UINT64_MAX;
    try {
        return std::stoull(word);
    } catch (const std::exception&) {
        return UINT64_MAX;
    }
}

// The least limit - usage over dir and its ancestors up to (and with) top, for the given
// files; a limit at or above 2^62 (v1's "no limit", a page-rounded LONG_MAX) counts as none.
uint64_t least_room(std::filesystem::path dir, const std::filesystem::path& top, const char* limit,
                    const char* usage) {
    uint64_t room = UINT64_MAX;
    // the nearest existing group of the path (a container may show the host's path)
    while (!std::filesystem::is_directory(dir) && dir != top && dir.has_parent_path())
        dir = dir.parent_path();
    for (;;) {
        const uint64_t lim = cgroup_number(dir / limit);
        if (lim < (uint64_t{1} << 62)) {
            const uint64_t used = cgroup_number(dir / usage);
            room = std::min(room, used == UINT64_MAX ? lim : (used < lim ? lim - used : 0));
        }
        if (dir == top || !dir.has_parent_path() || dir.parent_path() == dir) break;
        dir = dir.parent_path();
    }
    return room;
}

}  // namespace

uint64_t cgroup_memory_left(const std::string& proc_cgroup, const std::string& root, int* version) {
    namespace fs  = std::filesystem;
    uint64_t room = UINT64_MAX;
    std::istringstream lines(proc_cgroup);
    for (std::string line; std::getline(lines, line);) {
        // "hierarchy-id:controllers:path"; v2's line is "0::path"
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const std::string path        = line.substr(b + 1);
        if (path.empty() || path[0] != '/') continue;
        if (line.compare(0, a, "0") == 0 && controllers.empty()) {
            const fs::path top = fs::path(root);
            const uint64_t r =
                least_room(top / path.substr(1), top, "memory.max", "memory.current");
            if (r < room && version) *version = 2;
            room = std::min(room, r);
        } else {
            std::istringstream names(controllers);
            for (std::string c; std::getline(names, c, ',');) {
                if (c != "memory") continue;
                const fs::path top = fs::path(root) / "memory";
                const uint64_t r   = least_room(top / path.substr(1), top, "memory.limit_in_bytes",
                                                "memory.usage_in_bytes");
                if (r < room && version) *version = 1;
                room = std::min(room, r);
            }
        }
    }
    return room;
}

MemoryLeft memory_left() {
    MemoryLeft m;
    if (const uint64_t avail = available_memory_bytes(); avail > 0) {
        m.bytes = avail;
        m.what  = "MemAvailable";
    }
    std::ifstream in("/proc/self/cgroup");
    std::stringstream text;
    text << in.rdbuf();
    int version         = 0;
    const uint64_t room = cgroup_memory_left(text.str(), "/sys/fs/cgroup", &version);
    if (room < m.bytes) {
        m.bytes = room;
        m.what  = version == 2 ? "cgroup memory.max" : "cgroup memory.limit_in_bytes";
    }
    return m;
}

}  // namespace bagualu

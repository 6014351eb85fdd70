// Resident memory of this process from /proc/self/status (Linux): the current resident set
// (VmRSS) and its high-water mark (VmHWM); the machine's memory from /proc/meminfo: all of it
// (MemTotal) and what can still be allocated without swapping (MemAvailable). 0 where the file
// or field is missing. And what this process's control groups still let it charge (Slurm and
// container limits: cgroup v2 memory.max, v1 memory.limit_in_bytes). The one place that reads
// them: the trainer, `train`'s memory check, `bench train`, `bench comm` and `calibrate` all
// call these.
#pragma once
#include <cstdint>
#include <string>

namespace bagualu {

// Bytes of a "Field:   123 kB" line of /proc/self/status.
uint64_t proc_status_bytes(const std::string& field);
inline uint64_t resident_bytes() { return proc_status_bytes("VmRSS"); }
inline uint64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }

// Reads a byte of every page of this executable's own file mappings (code, read-only data), so
// that they are resident, and returns their bytes (0 where /proc/self/maps cannot be read). A
// training process runs most of the binary (2.7-2.8 of its 3.4 MB were resident in training runs
// of the tiny and default models); `calibrate` measures the process baseline after this, not
// with only the kernels' pages of a warm-up.
uint64_t touch_own_image();

// Bytes of a "Field:   123 kB" line of /proc/meminfo.
uint64_t meminfo_bytes(const std::string& field);
inline uint64_t total_memory_bytes() { return meminfo_bytes("MemTotal"); }
inline uint64_t available_memory_bytes() { return meminfo_bytes("MemAvailable"); }

// Bytes the memory control groups of a process may still charge: the least over its group and
// the group's ancestors of limit - usage (v2: memory.max - memory.current; v1, the memory
// controller's: memory.limit_in_bytes - memory.usage_in_bytes), 0 where usage is at the limit.
// UINT64_MAX where no group sets a limit or none can be read. proc_cgroup: the text of
// /proc/<pid>/cgroup; root: where the hierarchies are mounted (v2 there, v1 under
// root/memory). A group's path that does not exist under root (a container whose namespace
// shows the host's path) is read from the nearest ancestor that does. version, when given, is
// set to the cgroup version (1 or 2) of the least room, where a limit is found.
uint64_t cgroup_memory_left(const std::string& proc_cgroup, const std::string& root,
                            int* version = nullptr);

// What this process may still allocate: the least of MemAvailable and its control groups'
// room (cgroup_memory_left of /proc/self/cgroup under /sys/fs/cgroup), with where that figure
// comes from ("MemAvailable", "cgroup memory.max", "cgroup memory.limit_in_bytes"). bytes is
// UINT64_MAX (and what "unknown") when neither can be read.
struct MemoryLeft {
    uint64_t bytes   = UINT64_MAX;
    std::string what = "unknown";
};
MemoryLeft memory_left();

}  // namespace bagualu

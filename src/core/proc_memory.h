// Resident memory of this process from /proc/self/status (Linux): the current resident set
// (VmRSS) and its high-water mark (VmHWM); the machine's memory from /proc/meminfo: all of it
// (MemTotal) and what can still be allocated without swapping (MemAvailable). 0 where the file
// or field is missing. The one place that reads them: the trainer, `bench train`, `bench comm`
// and `calibrate` all call these.
#pragma once
#include <cstdint>
#include <string>

namespace bagualu {

// Bytes of a "Field:   123 kB" line of /proc/self/status.
uint64_t proc_status_bytes(const std::string& field);
inline uint64_t resident_bytes() { return proc_status_bytes("VmRSS"); }
inline uint64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }

// Bytes of a "Field:   123 kB" line of /proc/meminfo.
uint64_t meminfo_bytes(const std::string& field);
inline uint64_t total_memory_bytes() { return meminfo_bytes("MemTotal"); }
inline uint64_t available_memory_bytes() { return meminfo_bytes("MemAvailable"); }

}  // namespace bagualu

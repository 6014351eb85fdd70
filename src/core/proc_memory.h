// Resident memory of this process from /proc/self/status (Linux): the current resident set
// (VmRSS) and its high-water mark (VmHWM). 0 where the file or field is missing. The one place
// that reads them: the trainer, `bench train` and `calibrate` all call these.
#pragma once
#include <cstdint>
#include <string>

namespace bagualu {

// Bytes of a "Field:   123 kB" line of /proc/self/status.
uint64_t proc_status_bytes(const std::string& field);
inline uint64_t resident_bytes() { return proc_status_bytes("VmRSS"); }
inline uint64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }

}  // namespace bagualu

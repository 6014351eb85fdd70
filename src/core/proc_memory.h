// Resident memory of this process from /proc/self/status (Linux): the current resident set
// (VmRSS) and its high-water mark (VmHWM). 0 where the file or field is missing.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace bagualu {

// Bytes of a "Field:   123 kB" line of /proc/self/status.
inline uint64_t proc_status_bytes(const std::string& field) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.compare(0, field.size(), field) == 0 && line.size() > field.size() &&
            line[field.size()] == ':') {
            return std::stoull(line.substr(field.size() + 1)) * 1024;
        }
    }
    return 0;
}
inline uint64_t resident_bytes() { return proc_status_bytes("VmRSS"); }
inline uint64_t peak_resident_bytes() { return proc_status_bytes("VmHWM"); }

}  // namespace bagualu

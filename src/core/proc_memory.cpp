#include "core/proc_memory.h"

#include <fstream>

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

}  // namespace

uint64_t proc_status_bytes(const std::string& field) {
    return kib_line_bytes("/proc/self/status", field);
}

uint64_t meminfo_bytes(const std::string& field) { return kib_line_bytes("/proc/meminfo", field); }

}  // namespace bagualu

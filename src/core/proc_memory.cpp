#include "core/proc_memory.h"

#include <fstream>

namespace bagualu {

uint64_t proc_status_bytes(const std::string& field) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.compare(0, field.size(), field) == 0 && line.size() > field.size() &&
            line[field.size()] == ':') {
            return std::stoull(line.substr(field.size() + 1)) * 1024;
        }
    }
    return 0;
}

}  // namespace bagualu

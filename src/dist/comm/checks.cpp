// check_same_everywhere / check_all_ok / fail_together; see checks.h. These are the only library
// functions that print and exit: their message is the whole point, and the exit is collective, so
// no rank hangs.
#include "dist/comm/checks.h"

#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/numbers.h"

namespace bagualu::dist {

namespace {

// "1", "1-3", "1-3, 5": compact list of sorted rank numbers.
std::string rank_list(const std::vector<int>& ranks) { return ranges_text(ranks, ", "); }

void print_line(const std::string& line) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
}

}  // namespace

void check_same_everywhere(Comm& comm, uint64_t hash, const std::string& what) {
    const int P = comm.size();
    std::vector<uint64_t> all(static_cast<size_t>(P));
    comm.allgather(&hash, sizeof(hash), all.data());
    std::map<uint64_t, std::vector<int>> by_hash;
    for (int q = 0; q < P; ++q) by_hash[all[static_cast<size_t>(q)]].push_back(q);
    if (by_hash.size() == 1) return;
    if (comm.rank() == 0) {
        std::string parts;
        for (const auto& [h, ranks] : by_hash) {
            if (h == all[0]) continue;
            const bool one = ranks.size() == 1;
            parts += fmt::format("{} {} {} {:016x}; ", one ? "rank" : "ranks", rank_list(ranks),
                                 one ? "has" : "have", h);
        }
        print_line(fmt::format("bagualu: error: {} differs across ranks: {}rank 0 has {:016x}",
                               what, parts, all[0]));
    }
    comm.exit_all(2);
}

void fail_together(Comm& comm, const std::string& error) {
    if (comm.size() == 1) {
        if (!error.empty()) throw InputError(error);
        return;
    }
    check_all_ok(comm, error.empty(), error);
}

void check_together(Comm& comm, FunctionRef<void()> check) {
    std::string error;
    try {
        check();
    } catch (const InputError& e) {
        error = e.what();
    }
    fail_together(comm, error);
}

void check_all_ok(Comm& comm, bool ok, const std::string& error) {
    const int P = comm.size();
    // The max of (P - 1 - rank) over failing ranks names the lowest failing rank; -1: none.
    int64_t flag = ok ? -1 : P - 1 - comm.rank();
    comm.allreduce_max(std::span<int64_t>(&flag, 1));
    if (flag < 0) return;
    const int lowest = P - 1 - static_cast<int>(flag);
    if (comm.rank() == lowest) {
        print_line(P > 1 ? fmt::format("bagualu: error: {} (rank {})", error, lowest)
                         : fmt::format("bagualu: error: {}", error));
    }
    comm.exit_all(2);
}

}  // namespace bagualu::dist

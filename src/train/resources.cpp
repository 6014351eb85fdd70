#include "train/resources.h"

#include <span>
#include <vector>

#include "core/proc_memory.h"

namespace bagualu::train {

nlohmann::json resource_report(const dist::CommTally& steps_comm, int64_t steps,
                               dist::ParallelContext& par) {
    const uint64_t hwm = peak_rss_bytes();
    std::vector<int64_t> counts;
    for (const dist::CommCount& c : steps_comm.by_kind) {
        counts.push_back(static_cast<int64_t>(c.calls));
        counts.push_back(static_cast<int64_t>(c.bytes));
    }
    std::vector<uint64_t> hwms(static_cast<size_t>(par.size()));
    if (par.size() > 1) {
        par.world().allreduce_sum(std::span<int64_t>(counts));
        par.world().allgather(&hwm, sizeof(hwm), hwms.data());
    } else {
        hwms[0] = hwm;
    }
    nlohmann::json comm = nlohmann::json::object();
    for (size_t k = 0; k < dist::kNumCommKinds; ++k) {
        if (counts[2 * k] == 0) continue;
        comm[dist::comm_kind_name(static_cast<dist::CommKind>(k))] = {{"calls", counts[2 * k]},
                                                                      {"bytes", counts[2 * k + 1]}};
    }
    return {{"resources",
             {{"steps", steps}, {"ranks", par.size()}, {"peak_rss_bytes", hwms}, {"comm", comm}}}};
}

}  // namespace bagualu::train

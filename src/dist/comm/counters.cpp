#include "dist/comm/counters.h"

#include <atomic>

namespace bagualu::dist {

namespace {

struct AtomicCount {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> bytes{0};
};
std::array<AtomicCount, kNumCommKinds> g_counts;
std::atomic<uint64_t> g_inter_node_a2a{0};

}  // namespace

const char* comm_kind_name(CommKind k) {
    switch (k) {
        case CommKind::allreduce:
            return "allreduce";
        case CommKind::allgather:
            return "allgather";
        case CommKind::alltoall:
            return "alltoall";
        case CommKind::alltoallv:
            return "alltoallv";
        case CommKind::broadcast:
            return "broadcast";
        case CommKind::reduce_scatter_native:
            return "reduce_scatter_native";
        case CommKind::sendrecv:
            return "sendrecv";
        case CommKind::reduce_scatter:
            return "reduce_scatter";
        case CommKind::all_gather:
            return "all_gather";
        case CommKind::scatter:
            return "scatter";
    }
    return "?";
}

CommTally CommTally::operator-(const CommTally& o) const {
    CommTally d;
    for (size_t i = 0; i < kNumCommKinds; ++i) {
        d.by_kind[i].calls = by_kind[i].calls - o.by_kind[i].calls;
        d.by_kind[i].bytes = by_kind[i].bytes - o.by_kind[i].bytes;
    }
    return d;
}

CommTally CommTally::operator+(const CommTally& o) const {
    CommTally d;
    for (size_t i = 0; i < kNumCommKinds; ++i) {
        d.by_kind[i].calls = by_kind[i].calls + o.by_kind[i].calls;
        d.by_kind[i].bytes = by_kind[i].bytes + o.by_kind[i].bytes;
    }
    return d;
}

void count_comm(CommKind k, uint64_t bytes) {
    AtomicCount& c = g_counts[static_cast<size_t>(k)];
    c.calls.fetch_add(1, std::memory_order_relaxed);
    c.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

CommTally comm_tally() {
    CommTally t;
    for (size_t i = 0; i < kNumCommKinds; ++i) {
        t.by_kind[i].calls = g_counts[i].calls.load(std::memory_order_relaxed);
        t.by_kind[i].bytes = g_counts[i].bytes.load(std::memory_order_relaxed);
    }
    return t;
}

void count_inter_node_a2a(uint64_t bytes) {
    g_inter_node_a2a.fetch_add(bytes, std::memory_order_relaxed);
}

uint64_t inter_node_a2a_bytes() { return g_inter_node_a2a.load(std::memory_order_relaxed); }

}  // namespace bagualu::dist

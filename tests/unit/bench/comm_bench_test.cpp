// The comm benchmark runs on one process (LocalComm) and prints one parseable JSON object with a
// row per size; bad options, and sizes whose buffers cannot be counted, allocated or sent, are
// input errors.
#include "bench/comm_bench.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace bagualu::bench {
namespace {

TEST(CommBench, JsonHasOneRowPerSize) {
    auto comm = dist::make_local_comm();
    CommBenchOptions o;
    o.min_bytes = 4 << 10;
    o.max_bytes = 64 << 10;
    o.repeats   = 2;
    o.warmup    = 0;
    o.json      = true;
    testing::internal::CaptureStdout();
    EXPECT_EQ(run_comm_bench(*comm, o), 0);
    const auto j = nlohmann::json::parse(testing::internal::GetCapturedStdout());
    EXPECT_EQ(j["ranks"], 1);
    ASSERT_EQ(j["rows"].size(), 3u);  // 4 KiB, 16 KiB, 64 KiB
    EXPECT_EQ(j["rows"][2]["bytes"], 64 << 10);
    EXPECT_GE(j["rows"][0]["ours_rs_ag_ms"].get<double>(), 0.0);
}

TEST(CommBench, RejectsBadOptions) {
    auto comm = dist::make_local_comm();
    CommBenchOptions o;
    o.max_bytes = 1;
    EXPECT_THROW(run_comm_bench(*comm, o), InputError);
}

// The reason check_comm_bench_size gives, "" when it accepts.
std::string size_problem(size_t max_bytes, int ranks, int ranks_here, uint64_t available) {
    try {
        check_comm_bench_size(max_bytes, ranks, ranks_here,
                              MemoryLeft{available ? available : UINT64_MAX, "MemAvailable"});
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(CommBench, SizeCheckRefusesWrappingCountsMemoryAndMpiBlocks) {
    constexpr uint64_t GiB = uint64_t{1} << 30;
    // 4 KiB on 2 ranks: send + receive, then 1,024 floats in, 1,024 gathered, a shard of 512
    EXPECT_EQ(comm_bench_rank_bytes(4096, 2), 2 * 4096 + (2 * 1024 + 512) * 4);
    EXPECT_EQ(comm_bench_rank_bytes(1 << 30, 2), 4 * GiB + GiB / 2);
    EXPECT_EQ(comm_bench_rank_bytes(SIZE_MAX, 2), UINT64_MAX);
    EXPECT_EQ(size_problem(64 << 20, 4, 4, 8 * GiB), "");
    EXPECT_NE(size_problem(SIZE_MAX, 2, 2, 0).find("64-bit byte count"), std::string::npos);
    // 4.5 GiB a rank: two ranks on a machine with 8 GiB available do not fit, one does
    const std::string memory = size_problem(GiB, 2, 2, 8 * GiB);
    EXPECT_NE(memory.find("4.5 GiB per rank"), std::string::npos) << memory;
    EXPECT_NE(memory.find("9.0 GiB for the 2 rank(s)"), std::string::npos) << memory;
    EXPECT_NE(memory.find("8.0 GiB available (MemAvailable)"), std::string::npos) << memory;
    EXPECT_EQ(size_problem(GiB, 2, 1, 8 * GiB), "");
    EXPECT_EQ(size_problem(GiB, 2, 2, 0), "") << "unknown memory is not checked";
    // a cgroup at its limit leaves no room: refused, not taken for unknown
    std::string at_limit;
    try {
        check_comm_bench_size(GiB, 2, 2, MemoryLeft{0, "cgroup memory.max"});
    } catch (const InputError& e) {
        at_limit = e.what();
    }
    EXPECT_NE(at_limit.find("0.0 GiB available (cgroup memory.max)"), std::string::npos)
        << at_limit;
    // a block of 2^31 bytes per rank is beyond one MPI call's int count; one rank calls no MPI
    EXPECT_EQ(size_problem((size_t{4} << 30) - 1, 2, 2, 0), "");
    const std::string block = size_problem(size_t{4} << 30, 2, 2, 0);
    EXPECT_NE(block.find("2147483648 bytes"), std::string::npos) << block;
    EXPECT_NE(block.find("below 4G"), std::string::npos) << block;
    EXPECT_EQ(size_problem(size_t{4} << 30, 1, 1, 0), "");
}

}  // namespace
}  // namespace bagualu::bench

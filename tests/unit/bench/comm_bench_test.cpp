// The comm benchmark runs on one process (LocalComm) and prints one parseable JSON object with a
// row per size; bad options are input errors.
#include "bench/comm_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace bagualu::bench

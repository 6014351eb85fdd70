// Reader groups end to end: `mpirun -np 4 bagualu train` on train data split into uneven shards
// (a directory) gives bitwise the same per-step losses and gradient norms with data.readers = 1
// and 2 (one or two ranks read and scatter) as with every rank reading its own slice
// (data.readers = 0): the same windows reach the same ranks, so nothing may differ at all; so
// does data.readers = auto, which reads on every rank on one node and with one reader a node on
// several.
// Bad reader settings and a reader that cannot open the data end the job with one message.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "data/token_file.h"
#include "moda_runs.h"

namespace bagualu::testing {
namespace {

TEST(DataReaders, ReaderGroupsTrainBitwiseLikeEveryRankReading) {
    TinyRuns runs;
    ASSERT_EQ(runs.prepare().status, 0) << runs.prepare().output;
    // Three uneven shards of the prepared train split.
    const std::vector<int32_t> all = data::read_token_file(runs.path("data/train.bin"), 512).tokens;
    const std::string dir          = runs.path("shards");
    std::filesystem::create_directories(dir);
    const size_t cut[] = {0, all.size() / 5, all.size() / 2, all.size()};
    for (int i = 0; i < 3; ++i) {
        data::write_token_file(fmt::format("{}/train_{}.bin", dir, i),
                               std::span<const int32_t>(all).subspan(cut[i], cut[i + 1] - cut[i]),
                               512);
    }
    std::vector<StepLog> logs;
    for (const int readers : {0, 1, 2}) {
        const std::string run = fmt::format("readers{}", readers);
        const CommandResult r = TinyRuns::run_mpi(
            4, runs.train_args(run, 4, 2, "off") +
                   fmt::format(" --set data.train={} --set data.readers={}", dir, readers));
        ASSERT_EQ(r.status, 0) << r.output;
        logs.push_back(read_steps(runs.path(run + "/metrics.jsonl")));
        ASSERT_EQ(logs.back().loss.size(), 20u) << run;
    }
    for (size_t k = 1; k < logs.size(); ++k) {
        EXPECT_EQ(logs[k].loss, logs[0].loss) << "data.readers = " << k;
        EXPECT_EQ(logs[k].grad_norm, logs[0].grad_norm) << "data.readers = " << k;
    }
    // data.readers = auto (the default): on one node every rank reads (no scatter); on two
    // "nodes" of two ranks (parallel.ranks_per_node = 2) one reader a node scatters, and the
    // losses are those of every rank reading on the same layout (whose reductions over two nodes
    // sum in another order than on one node).
    const auto scatters = [&](const std::string& run) -> int64_t {
        std::istringstream in(read_file(runs.path(run + "/metrics.jsonl")));
        int64_t calls = -1;
        for (std::string line; std::getline(in, line);) {
            if (line.empty()) continue;
            const auto j = nlohmann::json::parse(line);
            if (!j.contains("resources")) continue;
            const auto& comm = j["resources"]["comm"];
            calls = comm.contains("scatter") ? comm["scatter"]["calls"].get<int64_t>() : 0;
        }
        return calls;
    };
    for (const std::string rpn : {"0", "2"}) {
        std::vector<StepLog> pair;
        for (const std::string readers : {"auto", "0"}) {
            const std::string run = fmt::format("rpn{}_{}", rpn, readers);
            const CommandResult r = TinyRuns::run_mpi(
                4, runs.train_args(run, 4, 2, "off") +
                       fmt::format(" --set data.train={} --set parallel.ranks_per_node={}{}", dir,
                                   rpn, readers == "auto" ? "" : " --set data.readers=0"));
            ASSERT_EQ(r.status, 0) << r.output;
            pair.push_back(read_steps(runs.path(run + "/metrics.jsonl")));
            ASSERT_EQ(pair.back().loss.size(), 20u) << run;
            if (readers == "auto" && rpn == "2") {
                EXPECT_GT(scatters(run), 0) << run << ": one reader a node scatters";
            } else {
                EXPECT_EQ(scatters(run), 0) << run << ": every rank reads";
            }
        }
        EXPECT_EQ(pair[0].loss, pair[1].loss) << "ranks_per_node = " << rpn;
        EXPECT_EQ(pair[0].grad_norm, pair[1].grad_norm) << "ranks_per_node = " << rpn;
        if (rpn == "0") {
            EXPECT_EQ(pair[0].loss, logs[0].loss);
        }
    }
    // More readers than ranks: one message, status 2, on every rank.
    const CommandResult bad =
        TinyRuns::run_mpi(2, runs.train_args("bad", 2, 1, "off") + " --set data.readers=3");
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("data.readers = 3 exceeds the number of ranks 2"), std::string::npos)
        << bad.output;
    // A reader that cannot open the data ends the whole job with its own message.
    const CommandResult missing =
        TinyRuns::run_mpi(2, runs.train_args("missing", 2, 1, "off") + " --set data.readers=1 " +
                                 "--set data.train=" + runs.path("absent/train_*.bin"));
    EXPECT_EQ(missing.status, 2) << missing.output;
    EXPECT_NE(missing.output.find("train_*.bin\": the pattern matches no file"), std::string::npos)
        << missing.output;
}

}  // namespace
}  // namespace bagualu::testing

// `bagualu report RUN`: every chart of the run's metrics.jsonl, or none. A log that fails a later
// chart, a chart name taken by a directory, or a log with no step records is one line and exit
// status 2, and leaves the run directory as it was (loss.svg was written before a later chart
// failed; an empty log gave empty charts). The metrics logs are synthetic, as the trainer writes
// them.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../common/expect_error.h"
#include "../common/run_command.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
   protected:
    // A run of an MoE model: loss, val_loss, expert_tokens and a routing metric, then `extra`.
    void write_log(const std::string& extra) const {
        write_file(dir / "metrics.jsonl",
                   "{\"config\":\"synthetic\"}\n"
                   "{\"step\":0,\"loss\":5.0,\"expert_tokens\":[[3,1]],"
                   "\"choice_load_max_violation\":[0.5]}\n"
                   "{\"step\":10,\"loss\":4.0,\"expert_tokens\":[[2,2]],"
                   "\"choice_load_max_violation\":[0.1]}\n"
                   "{\"step\":10,\"val_loss\":4.2}\n" +
                       extra);
    }
    // Status 2, one line holding every needle, and the run directory as it was.
    void expect_error_writing_nothing(std::initializer_list<std::string> needles) const {
        const auto files = [&] {
            std::string list;
            for (const auto& e : fs::directory_iterator(dir.str()))
                list += e.path().filename().string() + " ";
            return list;
        };
        const std::string before = files();
        expect_one_line_error("report " + dir.str(), needles);
        EXPECT_EQ(files(), before);
    }
    TempDir dir;
};

TEST_F(ReportTest, WritesEveryChartAndNoTemporary) {
    write_log("");
    const CommandResult r = bagualu("report " + dir.str());
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* f : {"loss.svg", "expert_load.svg", "load_violation.svg"}) {
        EXPECT_TRUE(fs::exists(dir / f)) << f;
        EXPECT_NE(r.output.find("report: wrote " + (dir / f)), std::string::npos) << r.output;
    }
    for (const auto& e : fs::directory_iterator(dir.str()))
        EXPECT_NE(e.path().extension(), ".tmp") << e.path();
}

TEST_F(ReportTest, ALaterChartFailingWritesNone) {
    write_log("{\"step\":20,\"loss\":3.9,\"expert_tokens\":5}\n");
    expect_error_writing_nothing({dir / "metrics.jsonl:5", "\"expert_tokens\" must be an array"});
    EXPECT_FALSE(fs::exists(dir / "loss.svg"));
    write_log("{\"step\":20,\"choice_load_max_violation\":[\"high\"]}\n");
    expect_error_writing_nothing(
        {dir / "metrics.jsonl:5", "\"choice_load_max_violation\"[0] must be a number"});
    EXPECT_FALSE(fs::exists(dir / "expert_load.svg"));
}

// The earlier report's charts stay as they were when a chart's name is taken by a directory.
TEST_F(ReportTest, ChartNameTakenByADirectoryWritesNone) {
    write_log("");
    ASSERT_EQ(bagualu("report " + dir.str()).status, 0);
    const std::string loss = read_file(dir / "loss.svg");
    write_log("{\"step\":20,\"loss\":1.0}\n");
    fs::remove(dir / "load_violation.svg");
    fs::create_directories(dir / "load_violation.svg");
    expect_error_writing_nothing({dir / "load_violation.svg", "not a regular file"});
    EXPECT_EQ(read_file(dir / "loss.svg"), loss);
}

// A log with no step records: one line naming it, not empty charts.
TEST_F(ReportTest, LogWithoutStepRecordsIsAnError) {
    for (const std::string log : {"", "\n\n", "{\"config\":\"synthetic\"}\n",
                                  "{\"config\":\"x\"}\n{\"step\":0,\"peak_rss_bytes\":[1]}\n"}) {
        write_file(dir / "metrics.jsonl", log);
        expect_error_writing_nothing({dir / "metrics.jsonl: no step records"});
        EXPECT_FALSE(fs::exists(dir / "loss.svg")) << log;
    }
}

}  // namespace
}  // namespace bagualu::testing

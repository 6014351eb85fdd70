// `bagualu report --compare`: one chart and a table for several run directories, and a one-line
// error with exit status 2 for each kind of bad input. The run directories are synthetic: a few
// metrics.jsonl lines written here, as the trainer writes them.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "../common/expect_error.h"
#include "../common/run_command.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

class ReportCompareTest : public ::testing::Test {
   protected:
    void SetUp() override {
        // Run a: train loss every 10 steps to 40, val loss at 20 and 40 (best at 20).
        // Run b: the same steps, lower losses; its last train loss diverged (logged as null).
        make_run("a", {5.0, 4.5, 4.0, 3.8, 3.7}, {4.2, 4.3});
        make_run("b", {4.9, 4.2, 3.6, 3.4, -1}, {3.9, 3.5});
    }
    void make_run(const std::string& name, const std::vector<double>& loss,
                  const std::vector<double>& val) {
        fs::create_directories(dir / name);
        std::string log = "{\"config\":\"synthetic\"}\n";
        for (size_t i = 0; i < loss.size(); ++i) {
            const std::string v = loss[i] < 0 ? "null" : std::to_string(loss[i]);
            log += "{\"step\":" + std::to_string(10 * i) + ",\"loss\":" + v + ",\"lr\":0.001}\n";
            if (i == 2 || i == 4) {
                log += "{\"step\":" + std::to_string(10 * i) +
                       ",\"val_loss\":" + std::to_string(val[i / 2 - 1]) + "}\n";
            }
        }
        write_file(dir / (name + "/metrics.jsonl"), log);
    }
    // Runs and checks: status 2, a single line of output, containing every `needle`.
    void expect_error(const std::string& args, std::initializer_list<std::string> needles) {
        expect_one_line_error("report " + args, needles);
    }
    std::string runs() const { return "--compare " + (dir / "a") + " " + (dir / "b"); }

    TempDir dir;
};

TEST_F(ReportCompareTest, ValLossChartAndTableWithDefaultLabels) {
    const std::string out = dir / "cmp.svg";
    const CommandResult r = bagualu("report " + runs() + " --out " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string svg = read_file(out);
    EXPECT_NE(svg.find(">Validation loss of 2 runs<"), std::string::npos);
    EXPECT_NE(svg.find(">a<"), std::string::npos);  // legend: the directory names
    EXPECT_NE(svg.find(">b<"), std::string::npos);
    EXPECT_NE(r.output.find("wrote " + out), std::string::npos);
    // Rows: label, last step, final and min val loss.
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\na\s+40\s+4\.3000\s+4\.2000\n)")))
        << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nb\s+40\s+3\.5000\s+3\.5000\n)")))
        << r.output;
    EXPECT_NE(r.output.find("final val_loss"), std::string::npos);
    EXPECT_FALSE(fs::exists(dir / "a/loss.svg"));  // comparing writes only --out
}

TEST_F(ReportCompareTest, TrainLossWithLabels) {
    const std::string out = dir / "train.svg";
    const CommandResult r =
        bagualu("report " + runs() + " --labels \"FP32 run,BF16 run\" --metric loss --out " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string svg = read_file(out);
    EXPECT_NE(svg.find(">Train loss of 2 runs<"), std::string::npos);
    EXPECT_NE(svg.find(">FP32 run<"), std::string::npos);
    EXPECT_NE(svg.find(">BF16 run<"), std::string::npos);
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nFP32 run\s+40\s+3\.7000\s+3\.7000\n)")))
        << r.output;
    // b's last loss is null: the final value shows the divergence, the min ignores it.
    EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nBF16 run\s+40\s+nan\s+3\.4000\n)")))
        << r.output;
}

TEST_F(ReportCompareTest, SingleRunReportIsUnchanged) {
    const CommandResult r = bagualu("report " + (dir / "a"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir / "a/loss.svg"));
}

TEST_F(ReportCompareTest, MissingDirectory) {
    expect_error(runs() + " " + (dir / "c") + " --out " + (dir / "x.svg"),
                 {dir / "c", "no such directory"});
}

TEST_F(ReportCompareTest, MissingMetricsLog) {
    fs::create_directories(dir / "empty");
    expect_error(runs() + " " + (dir / "empty") + " --out " + (dir / "x.svg"),
                 {dir / "empty/metrics.jsonl", "no such file"});
}

TEST_F(ReportCompareTest, RunWithoutTheMetric) {
    fs::create_directories(dir / "noval");
    write_file(dir / "noval/metrics.jsonl", "{\"step\":0,\"loss\":5.0}\n");
    expect_error(runs() + " " + (dir / "noval") + " --out " + (dir / "x.svg"),
                 {dir / "noval/metrics.jsonl", "no line has \"val_loss\""});
    EXPECT_FALSE(fs::exists(dir / "x.svg"));
}

TEST_F(ReportCompareTest, LabelCountMismatch) {
    expect_error(runs() + " --labels one --out " + (dir / "x.svg"),
                 {"--labels", "1 label(s) for 2 run directories"});
    expect_error(runs() + " --labels one,two,three --out " + (dir / "x.svg"),
                 {"--labels", "3 label(s) for 2 run directories"});
}

TEST_F(ReportCompareTest, MissingOut) { expect_error(runs(), {"--out FILE.svg is required"}); }

// --out is replaced by the chart: only an .svg file (an input's metrics.jsonl was lost so)
TEST_F(ReportCompareTest, OutMustBeAnSvgFile) {
    const std::string metrics = dir / "a/metrics.jsonl";
    const std::string before  = read_file(metrics);
    expect_error(runs() + " --out " + metrics, {"--out", "metrics.jsonl", "ending in .svg"});
    EXPECT_EQ(read_file(metrics), before);
    fs::create_directories(dir / "d.svg");
    expect_error(runs() + " --out " + (dir / "d.svg"), {"is a directory"});
}

TEST_F(ReportCompareTest, UnknownMetricAndMixedUsage) {
    expect_error(runs() + " --metric lr --out " + (dir / "x.svg"), {"--metric lr", "val_loss"});
    expect_error((dir / "a") + " --out " + (dir / "x.svg"), {"--out go with --compare"});
    expect_error("", {"give a run directory"});
}

}  // namespace
}  // namespace bagualu::testing

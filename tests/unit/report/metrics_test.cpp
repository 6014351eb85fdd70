// Tests for the metrics log reader and the loss chart: parsing, blank lines, the errors a broken
// or missing log must produce, and a chart with both curves written into the run directory.
#include "report/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace bagualu::report {
namespace {

namespace fs = std::filesystem;

class MetricsTest : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ =
            fs::temp_directory_path() / fmt::format("bgl_metrics_{}_{}", ::getpid(), test->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string write(const std::string& name, const std::string& text) const {
        const std::string p = (dir_ / name).string();
        std::ofstream(p) << text;
        return p;
    }
    std::string read(const std::string& name) const {
        std::ifstream in(dir_ / name);
        return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }

    fs::path dir_;
};

std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const InputError& e) {
        return e.what();
    }
    return "no InputError";
}

TEST_F(MetricsTest, ReadsEveryNonBlankLine) {
    const std::string p = write("m.jsonl", "{\"a\":1}\n\n  \n[1,2]\r\n\"s\"");
    const auto records  = read_jsonl(p);
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(records[0]["a"], 1);
    EXPECT_EQ(records[1], (nlohmann::json{1, 2}));
    EXPECT_EQ(records[2], "s");
    EXPECT_TRUE(read_jsonl(write("empty.jsonl", "")).empty());
}

TEST_F(MetricsTest, InvalidLinesAndMissingFilesNameFileAndLine) {
    const std::string p = write("bad.jsonl", "{\"a\":1}\n\n{\"a\": }\n");
    EXPECT_NE(error_of([&] { read_jsonl(p); }).find(p + ":3: invalid JSON"), std::string::npos);
    const std::string missing = (dir_ / "nope.jsonl").string();
    EXPECT_NE(error_of([&] { read_jsonl(missing); }).find(missing + ": cannot open"),
              std::string::npos);
}

TEST_F(MetricsTest, LossChartHasTrainAndValidationCurves) {
    std::string log;
    for (int step = 0; step <= 200; step += 10) {
        log +=
            fmt::format("{{\"step\": {}, \"loss\": {}, \"lr\": 0.001}}\n", step, 5.0 - step / 50.0);
        if (step % 50 == 0)
            log += fmt::format("{{\"step\": {}, \"val_loss\": {}}}\n", step, 5.2 - step / 60.0);
    }
    log += "{\"step\": 210, \"loss\": null}\n{\"event\": \"checkpoint\"}\n";
    write("metrics.jsonl", log);
    write_loss_chart(dir_.string() + "/");
    const std::string svg = read("loss.svg");
    EXPECT_TRUE(svg.starts_with("<svg"));
    EXPECT_TRUE(svg.ends_with("</svg>\n"));
    EXPECT_NE(svg.find(">train loss<"), std::string::npos);
    EXPECT_NE(svg.find(">val loss<"), std::string::npos);
    EXPECT_NE(svg.find(">Loss: " + dir_.filename().string() + "<"), std::string::npos);
    EXPECT_NE(svg.find(">200<"), std::string::npos);  // an x tick
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(MetricsTest, LossChartErrorsNameTheLog) {
    const std::string log = (dir_ / "metrics.jsonl").string();
    EXPECT_NE(error_of([&] { write_loss_chart(dir_.string()); }).find(log + ": no such file"),
              std::string::npos);
    write("metrics.jsonl", "{\"step\": 1, \"loss\": 2}\n[1]\n");
    EXPECT_NE(
        error_of([&] { write_loss_chart(dir_.string()); }).find(log + ":2: expected a JSON object"),
        std::string::npos);
    write("metrics.jsonl", "{\"loss\": 2}\n");
    EXPECT_NE(
        error_of([&] { write_loss_chart(dir_.string()); }).find(log + ":1: has a loss but no"),
        std::string::npos);
    write("metrics.jsonl", "\n{\"step\": 1, \"val_loss\": \"high\"}\n");
    EXPECT_NE(error_of([&] {
                  write_loss_chart(dir_.string());
              }).find(log + ":2: \"val_loss\" must be a number"),
              std::string::npos);
    EXPECT_FALSE(fs::exists(dir_ / "loss.svg"));
}

TEST_F(MetricsTest, ExpertLoadChartHasOneRowPerLayerAndExpert) {
    write("metrics.jsonl",
          "{\"step\":1,\"loss\":3.0,\"expert_tokens\":[[4,0],[2,2]]}\n"
          "{\"step\":1,\"val_loss\":3.1}\n"
          "{\"step\":10,\"loss\":2.0,\"expert_tokens\":[[3,1],[1,3]]}\n");
    EXPECT_TRUE(write_expert_load_chart(dir_.string()));
    const std::string svg = read("expert_load.svg");
    EXPECT_NE(svg.find("Expert load"), std::string::npos);
    for (const char* label :
         {"moe 0 expert 0", "moe 0 expert 1", "moe 1 expert 0", "moe 1 expert 1"}) {
        EXPECT_NE(svg.find(label), std::string::npos) << label;
    }
    write("metrics.jsonl", "{\"step\":1,\"loss\":3.0}\n");
    fs::remove(dir_ / "expert_load.svg");
    EXPECT_FALSE(write_expert_load_chart(dir_.string()));  // a dense model: nothing to draw
    EXPECT_FALSE(fs::exists(dir_ / "expert_load.svg"));
    write("metrics.jsonl", "{\"step\":1,\"expert_tokens\":[3]}\n");
    EXPECT_THROW(write_expert_load_chart(dir_.string()), InputError);
}

TEST_F(MetricsTest, RoutingChartsDrawEveryPerLayerMetricTheLogHolds) {
    write("metrics.jsonl",
          "{\"step\":1,\"choice_load_max_violation\":[0.5,0.25],\"balance_bias_min\":[-0.1,0],"
          "\"balance_bias_max\":[0.2,0.1],\"router_z_loss\":[0.003,0.004]}\n"
          "{\"step\":1,\"val_loss\":3.1}\n"
          "{\"step\":10,\"choice_load_max_violation\":[0.4,0.2],\"balance_bias_min\":[-0.2,0],"
          "\"balance_bias_max\":[0.3,0.1],\"router_z_loss\":[0.002,0.003]}\n");
    EXPECT_EQ(
        write_routing_charts(dir_.string()),
        (std::vector<std::string>{"load_violation.svg", "balance_bias.svg", "router_z_loss.svg"}));
    const std::string bias = read("balance_bias.svg");
    for (const char* label : {"moe 0 min", "moe 0 max", "moe 1 min", "moe 1 max"})
        EXPECT_NE(bias.find(label), std::string::npos) << label;
    EXPECT_NE(read("router_z_loss.svg").find("Router z-loss"), std::string::npos);
    EXPECT_NE(read("load_violation.svg").find("moe 1"), std::string::npos);
    // a run without the bias and the z-loss: the violation alone
    for (const char* f : {"load_violation.svg", "balance_bias.svg", "router_z_loss.svg"})
        fs::remove(dir_ / f);
    write("metrics.jsonl", "{\"step\":1,\"choice_load_max_violation\":[0.5]}\n");
    EXPECT_EQ(write_routing_charts(dir_.string()), std::vector<std::string>{"load_violation.svg"});
    EXPECT_FALSE(fs::exists(dir_ / "balance_bias.svg"));
    write("metrics.jsonl", "{\"step\":1,\"loss\":3.0}\n");  // a dense model
    EXPECT_TRUE(write_routing_charts(dir_.string()).empty());
    write("metrics.jsonl", "{\"step\":1,\"router_z_loss\":[\"x\"]}\n");
    EXPECT_NE(error_of([&] { write_routing_charts(dir_.string()); }).find("\"router_z_loss\"[0]"),
              std::string::npos);
}

TEST_F(MetricsTest, MetricCurveOfOneRunAndItsSummary) {
    write("metrics.jsonl",
          "{\"step\":1,\"loss\":5.0}\n"
          "{\"step\":2,\"loss\":null}\n"
          "{\"step\":2,\"val_loss\":4.5}\n"
          "{\"step\":3,\"loss\":3.0}\n"
          "{\"step\":4,\"loss\":3.5}\n"
          "{\"event\":\"done\"}\n");
    const RunCurve loss = read_metric_curve(dir_.string(), "loss", "a");
    EXPECT_EQ(loss.label, "a");
    EXPECT_EQ(loss.steps, (std::vector<double>{1, 2, 3, 4}));
    ASSERT_EQ(loss.values.size(), 4u);
    EXPECT_TRUE(std::isnan(loss.values[1]));
    const CurveSummary s = summarize(loss);
    EXPECT_EQ(s.last_step, 4);
    EXPECT_EQ(s.final_value, 3.5);  // the last point, not the best
    EXPECT_EQ(s.min_value, 3.0);    // the NaN is not a minimum
    const RunCurve val = read_metric_curve(dir_.string(), "val_loss", "a");
    EXPECT_EQ(val.steps, (std::vector<double>{2}));

    const RunCurve nan_only{"n", {7}, {std::numeric_limits<double>::quiet_NaN()}};
    EXPECT_TRUE(std::isnan(summarize(nan_only).min_value));
}

TEST_F(MetricsTest, ComparisonChartHasOneSeriesPerRun) {
    const std::vector<RunCurve> curves = {
        {"FP32", {0, 100, 200}, {5, 4, 3.5}},
        {"BF16 & co", {0, 100, 200}, {5.1, 4.1, 3.6}},
        {"FP16", {0, 100}, {5.2, std::numeric_limits<double>::quiet_NaN()}}};
    const std::string out = (dir_ / "cmp.svg").string();
    write_comparison_chart(curves, "Validation loss", "val loss", out);
    const std::string svg = read("cmp.svg");
    EXPECT_TRUE(svg.ends_with("</svg>\n"));
    EXPECT_NE(svg.find(">Validation loss of 3 runs<"), std::string::npos);
    for (const char* label : {">FP32<", ">BF16 &amp; co<", ">FP16<"}) {
        EXPECT_NE(svg.find(label), std::string::npos) << label;
    }
    size_t paths = 0;
    for (size_t i = svg.find("<path "); i != std::string::npos; i = svg.find("<path ", i + 1))
        ++paths;
    EXPECT_EQ(paths, 2u);  // FP16 has one finite point: a dot, no line
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    const std::string bad = (dir_ / "no_such_dir" / "cmp.svg").string();
    EXPECT_NE(error_of([&] {
                  write_comparison_chart(curves, "Train loss", "train loss", bad);
              }).find(bad + ": cannot write"),
              std::string::npos);
}

TEST_F(MetricsTest, MetricCurveErrorsNameTheDirectoryOrLog) {
    const std::string missing = (dir_ / "nope").string();
    EXPECT_NE(error_of([&] {
                  read_metric_curve(missing, "loss", "x");
              }).find(missing + ": no such directory"),
              std::string::npos);
    const std::string log = (dir_ / "metrics.jsonl").string();
    EXPECT_NE(error_of([&] {
                  read_metric_curve(dir_.string(), "loss", "x");
              }).find(log + ": no such file"),
              std::string::npos);
    write("metrics.jsonl", "{\"step\":1,\"loss\":5.0}\n");
    EXPECT_NE(error_of([&] {
                  read_metric_curve(dir_.string(), "val_loss", "x");
              }).find(log + ": no line has \"val_loss\""),
              std::string::npos);
    write("metrics.jsonl", "{\"val_loss\":5.0}\n");
    EXPECT_NE(error_of([&] {
                  read_metric_curve(dir_.string(), "val_loss", "x");
              }).find(log + ":1: has \"val_loss\" but no numeric \"step\""),
              std::string::npos);
}

}  // namespace
}  // namespace bagualu::report

// JSON Lines reading, the charts of a run directory, and the chart comparing one metric over
// several runs. Chart files are written to a temp name and renamed, so a viewer refreshing
// loss.svg never sees half a file; a run's charts are all rendered before any is written, so a
// log that fails one of them leaves none.
#include "report/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "core/error.h"
#include "report/svg_plot.h"

namespace bagualu::report {

namespace fs = std::filesystem;

namespace {

struct Record {
    std::size_t line_no;
    nlohmann::json value;
};

std::vector<Record> read_jsonl_records(const std::string& path) {
    // a FIFO or device would block or never end
    std::error_code ec;
    if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
        input_error("{}: not a regular file (expected the run's metrics log)", path);
    std::ifstream in(path);
    if (!in) input_error("{}: cannot open: {}", path, std::strerror(errno));
    std::vector<Record> records;
    std::string line;
    for (std::size_t line_no = 1; std::getline(in, line); ++line_no) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        try {
            records.push_back({line_no, nlohmann::json::parse(line)});
        } catch (const nlohmann::json::exception& e) {
            input_error("{}:{}: invalid JSON: {}", path, line_no, json_error_text(e.what()));
        }
    }
    if (in.bad()) input_error("{}: read failed: {}", path, std::strerror(errno));
    return records;
}

// The number at `key` of a record, NaN for null; InputError for anything else.
double number_at(const nlohmann::json& record, const char* key, const std::string& path,
                 std::size_t line_no) {
    const nlohmann::json& v = record.at(key);
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!v.is_number()) {
        input_error("{}:{}: \"{}\" must be a number, got {}", path, line_no, key, v.dump());
    }
    return v.get<double>();
}

// Writes text to path + ".tmp" and returns that name; InputError naming path when it cannot.
fs::path write_temporary(const fs::path& path, const std::string& text) {
    const fs::path tmp = path.string() + ".tmp";
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
        std::error_code ec;
        fs::remove(tmp, ec);
        input_error("{}: cannot write: {}", path.string(), std::strerror(errno));
    }
    return tmp;
}

void rename_into_place(const fs::path& tmp, const fs::path& path) {
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        fs::remove(tmp, ec);
        input_error("{}: cannot write: {}", path.string(), ec.message());
    }
}

void write_text_file(const fs::path& path, const std::string& text) {
    rename_into_place(write_temporary(path, text), path);
}

std::string metrics_path(const fs::path& dir) {
    const std::string metrics = (dir / "metrics.jsonl").string();
    if (!fs::exists(metrics))
        input_error("{}: no such file (expected the run's metrics log)", metrics);
    return metrics;
}

std::string run_name(const fs::path& dir) {
    return (dir.filename().empty() ? dir.parent_path() : dir).filename().string();
}

// loss.svg of a run's records: the train and validation curves.
std::string loss_svg(const std::vector<Record>& records, const std::string& metrics,
                     const std::string& name) {
    Series train{"train loss", "#1f77b4", {}, {}};
    Series val{"val loss", "#d62728", {}, {}};
    for (const auto& [line_no, r] : records) {
        if (!r.is_object()) input_error("{}:{}: expected a JSON object", metrics, line_no);
        const bool has_loss = r.contains("loss"), has_val = r.contains("val_loss");
        if (!has_loss && !has_val) continue;
        if (!r.contains("step") || !r["step"].is_number()) {
            input_error("{}:{}: has a loss but no numeric \"step\"", metrics, line_no);
        }
        const double step = r["step"].get<double>();
        if (has_loss) {
            train.x.push_back(step);
            train.y.push_back(number_at(r, "loss", metrics, line_no));
        }
        if (has_val) {
            val.x.push_back(step);
            val.y.push_back(number_at(r, "val_loss", metrics, line_no));
        }
    }
    // an empty log, or one a run left before its first step: an empty chart would pass for a
    // report
    if (train.x.empty() && val.x.empty()) {
        input_error(
            "{}: no step records (no line has a \"step\" with a \"loss\" or \"val_loss\"): "
            "expected the metrics log of a run that trained at least one step",
            metrics);
    }
    std::vector<Series> series = {train};
    if (!val.x.empty()) series.push_back(val);
    return line_chart_svg(fmt::format("Loss: {}", name), "step", "loss", series);
}

}  // namespace

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::vector<nlohmann::json> values;
    for (Record& r : read_jsonl_records(path)) values.push_back(std::move(r.value));
    return values;
}

void write_loss_chart(const std::string& run_dir) {
    const std::string metrics = metrics_path(run_dir);
    write_text_file(fs::path(run_dir) / "loss.svg",
                    loss_svg(read_jsonl_records(metrics), metrics, run_name(run_dir)));
}

RunCurve read_metric_curve(const std::string& run_dir, const std::string& metric,
                           const std::string& label) {
    const fs::path dir = run_dir;
    if (!fs::is_directory(dir)) {
        input_error("{}: no such directory (expected a run directory with metrics.jsonl)", run_dir);
    }
    const std::string metrics = (dir / "metrics.jsonl").string();
    if (!fs::exists(metrics))
        input_error("{}: no such file (expected the run's metrics log)", metrics);
    RunCurve curve{label, {}, {}};
    for (const auto& [line_no, r] : read_jsonl_records(metrics)) {
        if (!r.is_object()) input_error("{}:{}: expected a JSON object", metrics, line_no);
        if (!r.contains(metric)) continue;
        if (!r.contains("step") || !r["step"].is_number()) {
            input_error("{}:{}: has \"{}\" but no numeric \"step\"", metrics, line_no, metric);
        }
        curve.steps.push_back(r["step"].get<double>());
        curve.values.push_back(number_at(r, metric.c_str(), metrics, line_no));
    }
    if (curve.steps.empty()) {
        input_error("{}: no line has \"{}\" (expected a metrics log that records it)", metrics,
                    metric);
    }
    return curve;
}

CurveSummary summarize(const RunCurve& curve) {
    BGL_CHECK(!curve.steps.empty() && curve.steps.size() == curve.values.size(),
              "curve {} has {} steps and {} values", curve.label, curve.steps.size(),
              curve.values.size());
    double min_value = std::numeric_limits<double>::quiet_NaN();
    for (double v : curve.values) {
        if (std::isfinite(v) && (std::isnan(min_value) || v < min_value)) min_value = v;
    }
    return {curve.steps.back(), curve.values.back(), min_value};
}

void write_comparison_chart(std::span<const RunCurve> curves, const std::string& title,
                            const std::string& axis, const std::string& out_path) {
    std::vector<Series> series;
    for (const RunCurve& c : curves) series.push_back({c.label, "", c.steps, c.values});
    write_text_file(out_path, line_chart_svg(fmt::format("{} of {} runs", title, curves.size()),
                                             "step", axis, series));
}

namespace {

// expert_load.svg of a run's records, or none when no line has expert_tokens (a dense model).
std::optional<std::string> expert_load_svg(const std::vector<Record>& records,
                                           const std::string& metrics, const std::string& name) {
    std::vector<std::vector<double>> rows;  // [layer * E + expert][logged step]
    std::vector<std::string> labels;
    std::vector<double> steps;
    for (const auto& [line_no, r] : records) {
        if (!r.is_object()) input_error("{}:{}: expected a JSON object", metrics, line_no);
        if (!r.contains("expert_tokens")) continue;
        const nlohmann::json& layers = r["expert_tokens"];
        auto bad                     = [&] {
            input_error("{}:{}: \"expert_tokens\" must be an array (layers) of arrays of numbers",
                                            metrics, line_no);
        };
        if (!layers.is_array()) bad();
        const size_t col = steps.size();
        steps.push_back(r.contains("step") && r["step"].is_number() ? r["step"].get<double>()
                                                                    : 0.0);
        size_t row = 0;
        for (size_t l = 0; l < layers.size(); ++l) {
            if (!layers[l].is_array()) bad();
            double sum = 0;
            for (const auto& v : layers[l]) {
                if (!v.is_number()) bad();
                sum += v.get<double>();
            }
            const double mean =
                layers[l].empty() ? 0.0 : sum / static_cast<double>(layers[l].size());
            for (size_t e = 0; e < layers[l].size(); ++e, ++row) {
                if (row == rows.size()) {
                    rows.emplace_back();
                    labels.push_back(fmt::format("moe {} expert {}", l, e));
                }
                rows[row].resize(col + 1, std::numeric_limits<double>::quiet_NaN());
                rows[row][col] = mean > 0 ? layers[l][e].get<double>() / mean : 0.0;
            }
        }
    }
    if (steps.empty()) return std::nullopt;
    const std::string xlabel =
        fmt::format("logged step (columns {} .. {})", format_tick(steps.front(), 1),
                    format_tick(steps.back(), 1));
    return heatmap_svg(fmt::format("Expert load: {}", name), xlabel, "MoE layer, expert", rows,
                       labels, "tokens / layer mean");
}

// One curve per MoE layer and key of `keys` from metrics.jsonl's per-layer arrays; the curve of
// key k, layer l is labelled "moe l" plus the key's suffix.
std::vector<Series> per_layer_series(const std::vector<Record>& records, const std::string& metrics,
                                     const std::vector<std::pair<const char*, const char*>>& keys) {
    std::vector<Series> series;
    std::vector<std::vector<size_t>> index(keys.size());  // [key][layer] -> series
    for (const auto& [line_no, r] : records) {
        if (!r.is_object()) input_error("{}:{}: expected a JSON object", metrics, line_no);
        for (size_t k = 0; k < keys.size(); ++k) {
            const char* key = keys[k].first;
            if (!r.contains(key)) continue;
            const nlohmann::json& layers = r[key];
            if (!layers.is_array() || !r.contains("step") || !r["step"].is_number()) {
                input_error(
                    "{}:{}: \"{}\" must be an array of numbers (one per MoE layer) beside a "
                    "numeric \"step\"",
                    metrics, line_no, key);
            }
            for (size_t l = 0; l < layers.size(); ++l) {
                if (!layers[l].is_number()) {
                    input_error("{}:{}: \"{}\"[{}] must be a number", metrics, line_no, key, l);
                }
                if (l == index[k].size()) {
                    index[k].push_back(series.size());
                    series.push_back({fmt::format("moe {}{}", l, keys[k].second), "", {}, {}});
                }
                Series& s = series[index[k][l]];
                s.x.push_back(r["step"].get<double>());
                s.y.push_back(layers[l].get<double>());
            }
        }
    }
    return series;
}

// The routing charts of a run's records that it holds metrics for.
std::vector<ChartFile> routing_svgs(const std::vector<Record>& records, const std::string& metrics,
                                    const std::string& name) {
    struct Chart {
        const char* file;
        const char* title;
        const char* ylabel;
        std::vector<std::pair<const char*, const char*>> keys;
    };
    const Chart charts[] = {
        {"load_violation.svg",
         "Expert load max violation",
         "max load / mean load - 1",
         {{"choice_load_max_violation", ""}}},
        {"balance_bias.svg",
         "Routing bias range",
         "bias",
         {{"balance_bias_min", " min"}, {"balance_bias_max", " max"}}},
        {"router_z_loss.svg", "Router z-loss", "z-loss term", {{"router_z_loss", ""}}},
    };
    std::vector<ChartFile> out;
    for (const Chart& c : charts) {
        const std::vector<Series> series = per_layer_series(records, metrics, c.keys);
        if (series.empty()) continue;
        out.push_back({c.file, line_chart_svg(fmt::format("{}: {}", c.title, name), "step",
                                              c.ylabel, series)});
    }
    return out;
}

}  // namespace

bool write_expert_load_chart(const std::string& run_dir) {
    const std::string metrics = metrics_path(run_dir);
    const std::optional<std::string> svg =
        expert_load_svg(read_jsonl_records(metrics), metrics, run_name(run_dir));
    if (!svg) return false;
    write_text_file(fs::path(run_dir) / "expert_load.svg", *svg);
    return true;
}

std::vector<std::string> write_routing_charts(const std::string& run_dir) {
    const std::string metrics = metrics_path(run_dir);
    const std::vector<ChartFile> charts =
        routing_svgs(read_jsonl_records(metrics), metrics, run_name(run_dir));
    write_charts(run_dir, charts);
    std::vector<std::string> written;
    for (const ChartFile& c : charts) written.push_back(c.name);
    return written;
}

std::vector<ChartFile> render_run_charts(const std::string& run_dir) {
    const std::string metrics         = metrics_path(run_dir);
    const std::vector<Record> records = read_jsonl_records(metrics);
    const std::string name            = run_name(run_dir);
    std::vector<ChartFile> charts     = {{"loss.svg", loss_svg(records, metrics, name)}};
    if (auto svg = expert_load_svg(records, metrics, name))
        charts.push_back({"expert_load.svg", std::move(*svg)});
    for (ChartFile& c : routing_svgs(records, metrics, name)) charts.push_back(std::move(c));
    return charts;
}

void write_charts(const std::string& run_dir, std::span<const ChartFile> charts) {
    const fs::path dir = run_dir;
    // A chart's name taken by a directory (or a FIFO) would fail its rename after the others
    // were in place: refused first.
    for (const ChartFile& c : charts) {
        std::error_code ec;
        const fs::file_status st = fs::symlink_status(dir / c.name, ec);
        if (fs::exists(st) && !fs::is_regular_file(st)) {
            input_error("{}: exists and is not a regular file (expected a chart to replace)",
                        (dir / c.name).string());
        }
    }
    // Every chart to its temporary, then the renames: a write that fails (a full disk) removes
    // the temporaries and leaves the charts as they were.
    std::vector<fs::path> tmps;
    try {
        for (const ChartFile& c : charts) tmps.push_back(write_temporary(dir / c.name, c.svg));
    } catch (const InputError&) {
        std::error_code ec;
        for (const fs::path& t : tmps) fs::remove(t, ec);
        throw;
    }
    for (size_t i = 0; i < charts.size(); ++i) {
        try {
            rename_into_place(tmps[i], dir / charts[i].name);
        } catch (const InputError&) {
            std::error_code ec;
            for (size_t k = i + 1; k < tmps.size(); ++k) fs::remove(tmps[k], ec);
            throw;
        }
    }
}

}  // namespace bagualu::report

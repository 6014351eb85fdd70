// Reading a run's metrics log (JSON Lines: one object per line, appended by the trainer) and
// turning it into charts next to it. Only reads and plots; the trainer owns the log format.
#pragma once
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace bagualu::report {

// Every non-blank line of `path` parsed as JSON. Throws InputError naming the file, and the
// line number for a line that is not valid JSON.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// Reads run_dir/metrics.jsonl and writes run_dir/loss.svg: the "loss" of each line that has one
// (train curve) and its "val_loss" (validation curve), both against "step". A null loss (NaN or
// inf when logged) leaves a gap. Throws InputError naming metrics.jsonl if it is missing or no
// line has a loss or val_loss (an empty log: no chart to draw), or the line that is not an
// object, has a loss without a numeric step, or a loss that is not a number.
void write_loss_chart(const std::string& run_dir);

// Reads run_dir/metrics.jsonl and writes run_dir/expert_load.svg: a heat map of the
// "expert_tokens" ([MoE layer][expert] rows per expert) of each logged step, one row per
// (layer, expert), one column per logged step, each cell the expert's rows over the mean of its
// layer (1 = perfectly balanced). Returns false, writing nothing, when no line has
// expert_tokens (a dense model). Throws InputError as write_loss_chart does, or naming a line
// whose expert_tokens is not an array of arrays of numbers.
bool write_expert_load_chart(const std::string& run_dir);

// Reads run_dir/metrics.jsonl and writes the per-MoE-layer routing curves over the logged
// steps, one chart per metric the log holds (train/routing_metrics.h):
//   load_violation.svg  "choice_load_max_violation" (max load / mean load - 1 of the step's
//                       top-k choices over all ranks, moe/balance_bias.h)
//   balance_bias.svg    "balance_bias_min" and "balance_bias_max" (the routing bias's range)
//   router_z_loss.svg   "router_z_loss" (the z-loss term added to the loss)
// Returns the file names written (none for a dense model or a log without them). Throws
// InputError as write_expert_load_chart does, naming a line whose metric is not an array of
// numbers (one per MoE layer) beside a numeric "step".
std::vector<std::string> write_routing_charts(const std::string& run_dir);

// One chart of a run directory: its file name there and its SVG text.
struct ChartFile {
    std::string name;
    std::string svg;
};

// Every chart of run_dir/metrics.jsonl, rendered and not written, the log read once: loss.svg,
// then expert_load.svg and the routing charts where the log holds their metrics. Throws
// InputError as the write_*_chart functions above do, before anything is written.
std::vector<ChartFile> render_run_charts(const std::string& run_dir);

// Writes the charts into run_dir, all or none: each to a temporary first, renamed into place
// once every one is written. Throws InputError naming the chart when one cannot be written, or
// its name is taken by something other than a file (a directory), leaving the charts that were
// there before as they were.
void write_charts(const std::string& run_dir, std::span<const ChartFile> charts);

// One run's curve of one metric, for drawing several runs on one chart (`report --compare`).
struct RunCurve {
    std::string label;
    std::vector<double> steps, values;  // in log order; a null value (NaN or inf logged) is NaN
};

// The curve of `metric` ("val_loss", "loss", ...) against "step" in run_dir/metrics.jsonl,
// labelled `label`. Throws InputError naming run_dir when it is not a directory, metrics.jsonl
// when it is missing or no line has `metric`, or a line as write_loss_chart does.
RunCurve read_metric_curve(const std::string& run_dir, const std::string& metric,
                           const std::string& label);

// What the comparison table shows of a curve: the step and value of its last point (the value
// may be NaN: a run that ended diverged), and its smallest finite value (NaN when none is).
struct CurveSummary {
    double last_step, final_value, min_value;
};
CurveSummary summarize(const RunCurve& curve);

// Writes out_path: one line chart of every curve against step, titled "<title> of N runs", the
// y axis `axis`, the labels as legend. Throws InputError naming out_path when it cannot be
// written.
void write_comparison_chart(std::span<const RunCurve> curves, const std::string& title,
                            const std::string& axis, const std::string& out_path);

}  // namespace bagualu::report

// Reading a run's metrics log (JSON Lines: one object per line, appended by the trainer) and
// turning it into charts next to it. Only reads and plots; the trainer owns the log format.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bagualu::report {

// Every non-blank line of `path` parsed as JSON. Throws InputError naming the file, and the
// line number for a line that is not valid JSON.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// Reads run_dir/metrics.jsonl and writes run_dir/loss.svg: the "loss" of each line that has one
// (train curve) and its "val_loss" (validation curve), both against "step". A null loss (NaN or
// inf when logged) leaves a gap. Throws InputError naming metrics.jsonl if it is missing, or the
// line that is not an object, has a loss without a numeric step, or a loss that is not a number.
void write_loss_chart(const std::string& run_dir);

// Reads run_dir/metrics.jsonl and writes run_dir/expert_load.svg: a heat map of the
// "expert_tokens" ([MoE layer][expert] rows per expert) of each logged step, one row per
// (layer, expert), one column per logged step, each cell the expert's rows over the mean of its
// layer (1 = perfectly balanced). Returns false, writing nothing, when no line has
// expert_tokens (a dense model). Throws InputError as write_loss_chart does, or naming a line
// whose expert_tokens is not an array of arrays of numbers.
bool write_expert_load_chart(const std::string& run_dir);

}  // namespace bagualu::report

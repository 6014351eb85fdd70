// The subcommands of `bagualu`, one function each, called by main.cpp after parsing.
// Each returns the process exit status; errors are thrown (InputError -> 2).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/comm/comm.h"

namespace bagualu::cli {

struct CommonArgs {
    std::string config;                  // --config FILE ("" = defaults)
    std::vector<std::string> overrides;  // --set section.key=value
};

int cmd_prepare(const CommonArgs& a, bool force, const std::string& tokenizer_from = "");
// Collective over world: every rank of an mpirun job calls it.
int cmd_train(const CommonArgs& a, const std::string& run_dir, bool force, bool resume,
              dist::Comm& world);
int cmd_eval(const CommonArgs& a, const std::string& model_dir, const std::string& val_path);
struct SampleArgs {
    std::string model_dir;
    std::vector<std::string> prompts;
    int n = -1, max_new_tokens = -1, top_k = -1;
    double temperature = -1;
    std::optional<uint64_t> seed;  // --seed, any uint64; none: the default
};
int cmd_sample(const SampleArgs& a);
int cmd_export(const std::string& from, const std::string& out, const std::string& dtype);
// The consolidated model of a checkpoint (any layout) as safetensors + config.json.
int cmd_export_checkpoint(const std::string& dir, const std::string& out, const std::string& dtype);
// Prints a checkpoint's manifest summary, its files with sizes and checksum status; exit 1 when
// some file fails its checks.
int cmd_inspect(const std::string& dir);
int cmd_report(const std::string& run_dir);
// `bagualu report --compare DIR...`: one chart of a metric over several runs, and a table of
// each run's last step, final and smallest value on stdout.
struct ReportCompareArgs {
    std::vector<std::string> run_dirs;  // --compare
    std::vector<std::string> labels;    // --labels (default: the directory names)
    std::string metric = "val_loss";    // --metric: val_loss or loss
    std::string out;                    // --out FILE.svg
};
int cmd_report_compare(const ReportCompareArgs& a);

// `bagualu bench ...`. kernels: model shapes from --config (else configs/default.toml when
// present, else the built-in defaults). comm and train are collective over world.
struct BenchArgs {
    bool json   = false;
    int repeats = 0;                   // kernels, comm, train comparisons; 0: the default
    std::string filter;                // kernels: only GEMMs whose name contains it
    bool standalone_check = false;     // kernels: oneDNN also in a child process
    std::vector<std::string> sizes;    // comm: MIN MAX message sizes, e.g. 4K 64M
    int ranks_per_node   = 0;          // comm: a node every R ranks; 0: detect
    int64_t steps        = 10;         // train: timed steps
    int64_t warmup       = 2;          // train: untimed steps first
    bool compare_overlap = false;      // train: overlap off vs on
    std::vector<std::string> compare;  // train: settings side by side, "KEY=VALUE[;KEY=VALUE]"
    bool isolate = false;              // train --compare: each run a process of its own
};
int cmd_bench_kernels(const CommonArgs& a, const BenchArgs& b);
int cmd_bench_comm(const BenchArgs& b, dist::Comm& world);
int cmd_bench_train(const CommonArgs& a, const BenchArgs& b, dist::Comm& world);

}  // namespace bagualu::cli

// Helpers for the planner checks: run `bagualu train` (under mpirun for P > 1) and
// `bagualu plan --json` on the same config, and read what the run reported (metrics.jsonl:
// per-step tokens/s and the "resources" line with counted bytes and peak memory).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

namespace bagualu::testing {

struct RunReport {
    std::vector<double> tokens_per_s;  // per logged step
    nlohmann::json resources;          // {"steps", "ranks", "peak_rss_bytes", "comm"}
    double gemm_packing = 0;           // the most any rank's GEMM packing buffers held
};

inline RunReport read_run(const std::string& metrics_path) {
    RunReport r;
    std::istringstream in(read_file(metrics_path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) r.tokens_per_s.push_back(j["tokens_per_s"]);
        if (j.contains("resources")) r.resources = j["resources"];
        if (j.contains("gemm_packing_bytes")) {
            for (const auto& b : j["gemm_packing_bytes"])
                r.gemm_packing = std::max(r.gemm_packing, b.get<double>());
        }
    }
    return r;
}

inline CommandResult run_train(int P, const std::string& args) {
    if (P == 1) return bagualu(args);
    return run_command(
        fmt::format("cd {} && timeout 600 {} --allow-run-as-root --oversubscribe -np {} {} {}",
                    BGL_SOURCE_DIR, BGL_MPIEXEC, P, BGL_BINARY, args));
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace bagualu::testing

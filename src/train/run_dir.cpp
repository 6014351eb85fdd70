// The run directory of `bagualu train`: created, or refused when it already holds another run;
// a resumed run's metrics.jsonl cut back to its checkpoint.
#include "train/run_dir.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint/checkpoint.h"

namespace bagualu::train {

namespace fs = std::filesystem;

// Refuses to mix a new run into a directory that holds an earlier one (its metrics or its
// checkpoints), unless resuming it or forced to replace it.
void prepare_run_dir(const TrainConfig& cfg, bool force, bool resume) {
    const std::string& dir = cfg.train.run_dir;
    std::error_code    ec;
    if (!resume) {
        if (fs::exists(dir + "/metrics.jsonl") && !force) {
            input_error("{}: already holds a run (metrics.jsonl); pass --resume to continue it, "
                        "--force to replace it, or choose another --run-dir",
                        dir);
        }
        const std::vector<std::string> old = io::ckpt::list_complete(cfg.checkpoint_dir());
        if (!old.empty() && !force) {
            input_error("{}: holds {} checkpoint(s) of an earlier run; pass --resume to continue "
                        "it, --force to replace it, or set checkpoint.dir elsewhere",
                        cfg.checkpoint_dir(), old.size());
        }
        for (const std::string& c : old) fs::remove_all(c, ec);
        if (!old.empty()) log::info("--force: removed {} checkpoint(s) of the replaced run", old.size());
    }
    fs::create_directories(dir, ec);
    if (ec) input_error("{}: cannot create run directory: {}", dir, ec.message());
}

// Keeps the lines of a resumed run's metrics.jsonl up to its checkpoint's step (the steps after
// it are trained again), through a temporary file and a rename.
void trim_metrics(const std::string& path, int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        for (std::string line; std::getline(in, line);) {
            if (line.empty()) continue;
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_discarded()) break;  // a line cut by the crash: everything after it goes too
            if (j.contains("step") && j["step"].is_number() && j["step"].get<int64_t>() > step) continue;
            out << line << "\n";
        }
        if (!out) input_error("{}: cannot write", tmp);
    }
    fs::rename(tmp, path);
}

}  // namespace bagualu::train

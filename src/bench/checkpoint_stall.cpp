#include "bench/checkpoint_stall.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/stats.h"
#include "train/trainer.h"

namespace bagualu::bench {

namespace fs = std::filesystem;
using Clock  = std::chrono::steady_clock;

namespace {

// Seconds between consecutive steps: [i] ends at step i + 2 (1-based), starts after step i + 1.
std::vector<double> step_intervals(const TrainConfig& cfg, dist::ParallelContext& par) {
    std::vector<Clock::time_point> at;
    train::TrainOptions opt;
    opt.force   = true;
    opt.quiet   = true;
    opt.on_step = [&](int64_t, double, double) { at.push_back(Clock::now()); };
    train::run_training(cfg, opt, &par);
    std::vector<double> out;
    for (size_t i = 1; i < at.size(); ++i)
        out.push_back(std::chrono::duration<double>(at[i] - at[i - 1]).count());
    return out;
}

}  // namespace

CheckpointStall measure_checkpoint_stall(TrainConfig cfg, int64_t steps, int64_t every,
                                         const std::string& dir, dist::ParallelContext& par) {
    BGL_CHECK(steps > every && every > 0, "steps {} every {}", steps, every);
    // one temporary directory, named by rank 0
    char name[512] = {};
    if (par.rank() == 0) {
        const std::string tmpl = (fs::path(dir) / "bagualu-ckpt-bench-XXXXXX").string();
        BGL_CHECK(tmpl.size() < sizeof(name), "path too long");
        std::strcpy(name, tmpl.c_str());
        if (!::mkdtemp(name)) input_error("{}: cannot create a temporary directory here", dir);
    }
    par.world().broadcast(name, sizeof(name), 0);
    const std::string tmp = name;

    cfg.train.steps        = steps;
    cfg.train.eval_every   = 0;
    cfg.train.eval_batches = 1;
    cfg.train.log_every    = steps;
    cfg.sample.n_samples   = 0;
    cfg.checkpoint.resume  = Resume::never;
    cfg.checkpoint.keep    = 2;

    cfg.train.run_dir               = tmp + "/plain";
    cfg.checkpoint.every            = 0;
    const std::vector<double> plain = step_intervals(cfg, par);

    cfg.train.run_dir              = tmp + "/ckpt";
    cfg.checkpoint.every           = every;
    const std::vector<double> with = step_intervals(cfg, par);

    CheckpointStall r;
    std::vector<double> after;
    for (size_t i = 0; i < with.size(); ++i) {
        if ((i + 1) % static_cast<size_t>(every) == 0)
            after.push_back(with[i]);  // follows step i+1
    }
    r.checkpoints  = steps / every + (steps % every ? 1 : 0);
    r.step_s       = median(plain);
    r.after_ckpt_s = median(after);
    r.stall_s      = r.after_ckpt_s - r.step_s;
    if (par.rank() == 0) {
        std::ifstream in(cfg.train.run_dir + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.contains("checkpoint_stall_s")) continue;
            const double n   = static_cast<double>(r.checkpoints);
            r.snapshot_s     = j["checkpoint_stall_s"].get<double>() / n;
            r.write_s        = j["checkpoint_write_s"].get<double>() / n;
            r.bytes_per_rank = j["checkpoint_bytes"].get<double>() / n;
        }
    }
    double v[7] = {static_cast<double>(r.checkpoints),
                   r.step_s,
                   r.after_ckpt_s,
                   r.stall_s,
                   r.snapshot_s,
                   r.write_s,
                   r.bytes_per_rank};
    par.world().broadcast(v, sizeof(v), 0);
    r = CheckpointStall{static_cast<int64_t>(v[0]), v[1], v[2], v[3], v[4], v[5], v[6]};
    par.world().barrier();
    if (par.rank() == 0) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
    }
    return r;
}

}  // namespace bagualu::bench

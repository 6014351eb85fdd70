// See train_bench.h. MFU = model FLOP/s / peak: model FLOPs as the trainer counts them (3x the
// forward's matrix products per token, GPT::flops_per_token), the peak summed over ranks, each
// rank's measured after the steps while every rank measures (sharing the cores as in training).
// Phase seconds are means over the timed steps; "other" is the step time no scope covered.
// The data wait is the time the data loader blocked for data, as a share of the mean step.
#include "bench/train_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench/kernels_bench.h"
#include "bench/scratch_dir.h"
#include "core/error.h"
#include "core/phase_timer.h"
#include "core/proc_memory.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/gemm/choice.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/mixed.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "moe/token_dispatcher.h"
#include "train/trainer.h"

namespace bagualu::bench {

namespace {

// The backend each GEMM of a training step ran on, per phase (after the steps): under
// BGL_GEMM=auto the choice recorded for its shape and dtype (absent: that dtype was not called
// at that shape), otherwise the active path; the experts' grouped GEMM is always ours (all six
// of its products in bf16 where the products have 16-bit arithmetic, moe/experts.cpp). The
// amx path's float products run the avx512 kernel, and are named so. Where gemm_bf16 only
// widens (kernels::gemm_bf16_widens(), reported as "bf16_gemm_as_f32"), the bf16 products run
// gemm_bf16 on 16-bit copies all the same, through the path's widening kernel (the float
// kernel's blocking), and the grouped ones are not marked "(bf16 grouped)".
nlohmann::json gemm_backends(const TrainConfig& cfg) {
    namespace g           = kernels::gemm;
    const g::Path active  = g::active_path();
    const bool automatic  = active == g::Path::automatic;
    const bool widens     = kernels::gemm_bf16_widens();
    const g::Path grouped = active == g::Path::onednn || automatic ? g::best_path() : active;
    nlohmann::json out    = nlohmann::json::array();
    // the kernel that runs a product on path p: the amx path's float products are avx512's
    const auto kernel = [](g::Path p, bool bf16_products) -> const char* {
        return p == g::Path::amx && !bf16_products ? g::path_name(g::Path::avx512)
                                                   : g::path_name(p);
    };
    for (const GemmShape& s :
         training_gemm_shapes(cfg.model, static_cast<int>(cfg.micro_batch()))) {
        const bool expert = s.name.rfind("expert", 0) == 0;
        const char* phase = expert                            ? "experts"
                            : s.name.rfind("mlp", 0) == 0     ? "mlp"
                            : s.name.rfind("lm head", 0) == 0 ? "lm_head"
                                                              : "attention";
        nlohmann::json e = {{"phase", phase}, {"gemm", s.name}, {"m", s.m}, {"n", s.n}, {"k", s.k}};
        for (bool bf16 : {false, true}) {
            const char* dtype = bf16 ? "bf16" : "f32";
            const bool half   = bf16 && !widens;  // the products have 16-bit arithmetic
            if (expert) {
                e[dtype] =
                    fmt::format("{}{}", kernel(grouped, half), half ? " (bf16 grouped)" : "");
            } else if (!automatic) {
                e[dtype] = kernel(active, half);
            } else if (const auto p = g::choice_table().find({bf16, s.ta, s.tb, s.m, s.n, s.k})) {
                e[dtype] = kernel(*p, half);  // bf16 products are gemm_bf16 calls either way
            }
        }
        out.push_back(e);
    }
    return out;
}

// What the attention core (scores, softmax, weighted values) runs on in this config's
// precision: "bf16 on amx tiles", "bf16 on avx512_bf16 dots", "fp64", or "float32 (<isa>)"
// (model/gpt.cpp's choice).
std::string attention_core(const TrainConfig& cfg) {
    const auto prec = model::PrecisionPolicy::from_config(cfg.precision);
    if (prec.fp64_sensitive) return "fp64";
    const kernels::HalfAttention h = kernels::half_attention(
        prec.gemm_dtype(model::LayerClass::attention), cfg.model.head_size());
    if (h != kernels::HalfAttention::none) {
        return fmt::format("bf16 on {}", kernels::half_attention_name(h));
    }
    return fmt::format("float32 ({})", kernels::isa_name(kernels::dispatch().attention_isa));
}

// How the LM head runs in this config's precision on this machine (model/gpt.h's choice): its
// output gradient formed in forward in 16 bits, fused with the cross-entropy, or from its (N, V)
// float logits.
std::string lm_head_kind(const TrainConfig& cfg) {
    const auto prec = model::PrecisionPolicy::from_config(cfg.precision);
    if (cfg.train.fused_head) {
        return fmt::format("fused, blocks of {} rows", model::fused_head_rows(cfg.model));
    }
    if (model::head_gradient_in_16_bits(prec, 0)) {
        return fmt::format("16-bit gradient formed in forward, blocks of {} rows",
                           model::head_block_rows(cfg.model));
    }
    return "float logits";
}

// One JSON object on stdout, flushed; returns 0 (the benchmark's exit status).
int print_json(const nlohmann::json& j) {
    fmt::print("{}\n", j.dump(2));
    std::fflush(stdout);
    return 0;
}

double mean(const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
}

// cfg as the benchmark runs it: warmup + steps steps, no evaluation, one log line.
TrainConfig timed_config(TrainConfig cfg, const TrainBenchOptions& o) {
    if (o.steps < 1 || o.warmup < 0) input_error("bench train: need steps >= 1 and warmup >= 0");
    cfg.train.steps      = o.warmup + o.steps;
    cfg.train.eval_every = 0;
    cfg.train.log_every  = cfg.train.steps;
    return cfg;
}

double tokens_per_step(const TrainConfig& cfg) {  // all ranks
    return static_cast<double>(cfg.train.batch_size) * static_cast<double>(cfg.model.seq_len);
}

// Seconds per step of each timer phase (kPhaseNames, since the timer's last reset), then of
// "other": the mean step's time no phase covered.
std::vector<double> phases_per_step(const std::vector<double>& step_s) {
    const auto& totals = phase_seconds();
    std::vector<double> out;
    double covered = 0;
    for (size_t i = 0; i < kNumPhases; ++i) {
        out.push_back(totals[i] / static_cast<double>(step_s.size()));
        covered += out.back();
    }
    out.push_back(std::max(0.0, mean(step_s) - covered));
    return out;
}

// Steps of cfg with overlap off and on, `repeats` runs of each, alternating which goes first.
int compare_overlap(TrainConfig cfg, const TrainBenchOptions& o, dist::ParallelContext& par) {
    std::vector<double> step_s[2], wait_s[2];  // [overlap off, on]
    for (int r = 0; r < o.repeats; ++r) {
        for (int i = 0; i < 2; ++i) {
            const int on                     = (i + r) % 2;
            cfg.parallel.overlap_grad_reduce = on == 1;
            train::TrainOptions opt;
            opt.dry_run = true;
            opt.on_step = [&](int64_t step, double seconds, double wait) {
                if (step < o.warmup) return;
                step_s[on].push_back(seconds);
                wait_s[on].push_back(wait);
            };
            train::run_training(cfg, opt, &par);
        }
    }
    if (par.rank() != 0) return 0;
    const double off_s = median(step_s[0]), on_s = median(step_s[1]);
    const double off_w = median(wait_s[0]), on_w = median(wait_s[1]);
    const bool multiple = par.world().threads_multiple();
    if (o.json) {
        nlohmann::json j;
        j["config"]              = cfg.name;
        j["ranks"]               = par.size();
        j["expert_parallel"]     = par.ep_size();
        j["threads_per_rank"]    = compute_pool().size();
        j["optimizer"]           = cfg.partition_optimizer(par.size()) ? "paro" : "replicated";
        j["steps"]               = o.steps;
        j["warmup"]              = o.warmup;
        j["repeats"]             = o.repeats;
        j["mpi_thread_multiple"] = multiple;
        j["overlap_off"]         = {{"step_s_median", off_s}, {"grad_reduce_wait_s_median", off_w}};
        j["overlap_on"]          = {{"step_s_median", on_s}, {"grad_reduce_wait_s_median", on_w}};
        j["step_ratio_on_over_off"] = off_s > 0 ? on_s / off_s : 0.0;
        return print_json(j);
    }
    fmt::print(
        "bench train {} --compare-overlap: {} rank(s), expert parallel {}, {} threads per "
        "rank, {} optimizer, {} x ({} + {} warm-up) steps per setting{}\n",
        cfg.name, par.size(), par.ep_size(), compute_pool().size(),
        cfg.partition_optimizer(par.size()) ? "ParO" : "replicated", o.repeats, o.steps, o.warmup,
        multiple ? "" : " (no MPI_THREAD_MULTIPLE: on runs without overlap)");
    fmt::print("{:<12} {:>14} {:>24}\n", "overlap", "step ms (med)", "grad reduce wait ms (med)");
    fmt::print("{:<12} {:>14.2f} {:>24.2f}\n", "off", off_s * 1e3, off_w * 1e3);
    fmt::print("{:<12} {:>14.2f} {:>24.2f}\n", "on", on_s * 1e3, on_w * 1e3);
    fmt::print("step time on / off = {:.3f}\n", off_s > 0 ? on_s / off_s : 0.0);
    std::fflush(stdout);
    return 0;
}

// What one run of `--compare` measured: its steps' median, the phases per step (the timer's
// phases, then "other"), the final loss; with --isolate also its process's peak RSS.
struct SettingRun {
    double step_s = 0;
    std::vector<double> phase_s;
    double final_loss  = 0;
    double peak_rss_mb = 0;
};

SettingRun time_setting(const TrainConfig& cfg, const TrainBenchOptions& o,
                        dist::ParallelContext& par) {
    std::vector<double> step_s;
    train::TrainOptions opt;
    opt.dry_run = true;
    opt.on_step = [&](int64_t step, double seconds, double) {
        if (step + 1 == o.warmup) reset_phase_timer();
        if (step >= o.warmup) step_s.push_back(seconds);
    };
    reset_phase_timer();
    enable_phase_timer(true);
    const train::TrainSummary sum = train::run_training(cfg, opt, &par);
    enable_phase_timer(false);
    return {median(step_s), phases_per_step(step_s), sum.final_loss};
}

// The text of a file, or "" when it cannot be read.
std::string text_of(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The last line of text that is not blank.
std::string last_line(const std::string& text) {
    const size_t end = text.find_last_not_of(" \n\r\t");
    if (end == std::string::npos) return "";
    const size_t newline = text.rfind('\n', end);
    const size_t begin   = newline == std::string::npos ? 0 : newline + 1;
    return text.substr(begin, end + 1 - begin);
}

// One run of `config` in a fresh process of this binary (`bench train --config FILE --json`),
// read from the JSON it prints. Its stderr goes to err_file: passed on to ours after a run that
// succeeded, its last line (the error) named in ours after one that failed.
SettingRun time_setting_isolated(const std::string& config, const std::string& err_file,
                                 const std::string& label, const TrainBenchOptions& o) {
    const std::string steps = std::to_string(o.steps), warmup = std::to_string(o.warmup);
    std::vector<std::string> args{"/proc/self/exe", "bench", "train",    "--config", config,
                                  "--steps",        steps,   "--warmup", warmup,     "--json"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) input_error("bench train --isolate: pipe: {}", std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    pid_t pid       = 0;
    const int error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (error != 0) {
        close(fds[0]);
        input_error("bench train --isolate: cannot start {}: {}", argv[0], std::strerror(error));
    }
    std::string out;
    char buf[4096];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        out.append(buf, static_cast<size_t>(got));
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const std::string err = text_of(err_file);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::string why                    = last_line(err);
        constexpr std::string_view kPrefix = "bagualu: error: ";  // ours says it once
        if (why.starts_with(kPrefix)) why.erase(0, kPrefix.size());
        input_error("bench train --isolate: setting \"{}\" failed in its process ({}){}{}", label,
                    WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                                      : fmt::format("signal {}", WTERMSIG(status)),
                    why.empty() ? "" : ": ", why);
    }
    if (!err.empty()) fmt::print(stderr, "{}", err);
    SettingRun run;
    try {
        const nlohmann::json j = nlohmann::json::parse(out);
        run.step_s             = j.at("step_s_median").get<double>();
        run.final_loss         = j.at("final_loss").get<double>();
        run.peak_rss_mb        = j.at("peak_rss_mb").get<double>();
        for (size_t i = 0; i <= kNumPhases; ++i) {
            const char* name = i < kNumPhases ? kPhaseNames[i] : "other";
            run.phase_s.push_back(j.at("phases").at(name).at("s_per_step").get<double>());
        }
    } catch (const nlohmann::json::exception& e) {
        input_error("bench train --isolate: setting \"{}\": its process printed no result ({})",
                    label, e.what());
    }
    return run;
}

// A ratio's 95% interval as the table prints it: "-" for the first setting or under 6 rounds.
std::string interval_text(const nlohmann::json& ci, bool first) {
    if (first || ci.is_null()) return "-";
    return fmt::format("{:.3f}-{:.3f}", ci[0].get<double>(), ci[1].get<double>());
}

}  // namespace

// The settings take turns: round r runs setting r mod n first, so that neither a setting's place
// in the round nor a slow stretch of the machine favours one of them; each setting's figures
// are medians over the rounds, and its speed against the first setting is the median of the
// rounds' ratios (a round's runs lie close in time).
int compare_settings(std::vector<BenchSetting> settings, const TrainBenchOptions& o) {
    if (settings.size() < 2) input_error("bench train --compare: give at least two settings");
    if (o.repeats < 1) input_error("bench train: need --repeats >= 1");
    for (BenchSetting& s : settings) s.cfg = timed_config(s.cfg, o);
    const size_t n = settings.size();
    std::optional<ScratchDir> dir;
    std::vector<std::string> files;  // --isolate: the settings' configs, as the processes read them
    std::string err_file;            // and where a process's stderr goes
    if (o.isolate) {
        // the command refuses --isolate under mpirun, once, before any run
        BGL_CHECK(settings.front().par->size() == 1, "--isolate on {} ranks",
                  settings.front().par->size());
        dir.emplace(std::string(), "bagualu-compare-",
                    "bench train --isolate: temporary directory");
        const std::filesystem::path at = dir->str();
        err_file                       = (at / "stderr.txt").string();
        for (size_t v = 0; v < n; ++v) {
            files.push_back((at / fmt::format("setting-{}.toml", v + 1)).string());
            std::ofstream file(files.back());
            file << to_toml(settings[v].cfg);
            file.close();
            if (!file)
                input_error("bench train --isolate: cannot write {}: {}", files.back(),
                            std::strerror(errno));
        }
    }
    std::vector<std::vector<SettingRun>> runs(n);  // [setting][round]
    for (int r = 0; r < o.repeats; ++r) {
        for (size_t i = 0; i < n; ++i) {
            const size_t v = (i + static_cast<size_t>(r)) % n;
            runs[v].push_back(o.isolate
                                  ? time_setting_isolated(files[v], err_file, settings[v].label, o)
                                  : time_setting(settings[v].cfg, o, *settings[v].par));
        }
    }
    if (settings.front().par->rank() != 0) return 0;

    const double first_tokens = tokens_per_step(settings.front().cfg);
    nlohmann::json out        = nlohmann::json::array();
    // how far each ratio's median can be trusted: an order-statistic 95% interval (null with
    // fewer than 6 rounds, where none reaches 95%)
    const auto interval = [](const std::vector<double>& x) {
        const auto r = median_interval(x, 0.95);
        return r ? nlohmann::json::array({r->lo, r->hi}) : nlohmann::json(nullptr);
    };
    for (size_t v = 0; v < n; ++v) {
        const TrainConfig& c = settings[v].cfg;
        std::vector<double> step_s, speedup, step_ratio, losses, rss, rss_ratio;
        for (int r = 0; r < o.repeats; ++r) {
            const SettingRun& run   = runs[v][static_cast<size_t>(r)];
            const SettingRun& first = runs[0][static_cast<size_t>(r)];
            step_s.push_back(run.step_s);
            step_ratio.push_back(run.step_s / first.step_s);
            speedup.push_back((tokens_per_step(c) / run.step_s) / (first_tokens / first.step_s));
            losses.push_back(run.final_loss);
            rss.push_back(run.peak_rss_mb);
            rss_ratio.push_back(first.peak_rss_mb > 0 ? run.peak_rss_mb / first.peak_rss_mb : 0);
        }
        nlohmann::json phases = nlohmann::json::object();
        for (size_t i = 0; i <= kNumPhases; ++i) {
            std::vector<double> ph;
            for (const SettingRun& run : runs[v]) ph.push_back(run.phase_s[i]);
            phases[i < kNumPhases ? kPhaseNames[i] : "other"] = median(ph);
        }
        const double med = median(step_s);
        out.push_back({{"setting", settings[v].label},
                       {"ranks", settings[v].par->size()},
                       {"tokens_per_step", tokens_per_step(c)},
                       {"step_s_median", med},
                       {"tokens_per_s", tokens_per_step(c) / med},
                       {"step_s_rounds", step_s},
                       {"speedup_vs_first_rounds", speedup},
                       {"speedup_vs_first_median", median(speedup)},
                       {"speedup_vs_first_ci95", interval(speedup)},
                       {"step_ratio_vs_first_median", median(step_ratio)},
                       {"step_ratio_vs_first_ci95", interval(step_ratio)},
                       {"final_loss_rounds", losses},
                       {"phases_s_per_step", phases}});
        if (o.isolate) {
            out.back()["peak_rss_mb_rounds"]        = rss;
            out.back()["peak_rss_mb_median"]        = median(rss);
            out.back()["rss_ratio_vs_first_median"] = median(rss_ratio);
            out.back()["rss_ratio_vs_first_ci95"]   = interval(rss_ratio);
        }
    }
    const TrainConfig& base = settings.front().cfg;
    if (o.json) {
        nlohmann::json j;
        j["config"]           = base.name;
        j["cpu_model"]        = kernels::cpu_features().model;
        j["half_features"]    = kernels::half_precision_features();
        j["threads_per_rank"] = compute_pool().size();
        j["steps"]            = o.steps;
        j["warmup"]           = o.warmup;
        j["rounds"]           = o.repeats;
        j["isolated"]         = o.isolate;
        j["settings"]         = out;
        return print_json(j);
    }
    fmt::print(
        "bench train {} --compare: {} settings in turn, {} round(s) of {} + {} warm-up steps "
        "each{}; cpu {}; 16-bit features: {}\n",
        base.name, n, o.repeats, o.steps, o.warmup, o.isolate ? ", each run a process" : "",
        kernels::cpu_features().model, kernels::half_precision_features());
    size_t width = 8;
    for (const BenchSetting& s : settings) width = std::max(width, s.label.size() + 4);
    fmt::print("{:<{}} {:>9} {:>10} {:>9} {:>10} {:>13}  {}\n", "setting", width, "step ms",
               "tokens/s", "speed", "step", "step 95% CI", "speed vs the first, per round");
    fmt::print("{:<{}} {:>9} {:>10} {:>9} {:>10} {:>13}\n", "", width, "(median)", "", "vs first",
               "vs first", "vs first");
    for (size_t v = 0; v < n; ++v) {
        const nlohmann::json& e = out[v];
        std::vector<std::string> rounds;
        for (const auto& x : e["speedup_vs_first_rounds"])
            rounds.push_back(fmt::format("{:.3f}", x.get<double>()));
        const std::string ci_text = interval_text(e["step_ratio_vs_first_ci95"], v == 0);
        fmt::print("{:<{}} {:>9.1f} {:>10.0f} {:>9.3f} {:>10.3f} {:>13}  {}\n",
                   fmt::format("#{} {}", v + 1, settings[v].label), width,
                   e["step_s_median"].get<double>() * 1e3, e["tokens_per_s"].get<double>(),
                   e["speedup_vs_first_median"].get<double>(),
                   e["step_ratio_vs_first_median"].get<double>(), ci_text, fmt::join(rounds, " "));
    }
    if (o.repeats < 6)
        fmt::print("(the 95% intervals of the medians need at least 6 rounds: --repeats 6)\n");
    if (o.isolate) {
        fmt::print("\npeak resident memory of each run's process, MB\n");
        fmt::print("{:<{}} {:>9} {:>10} {:>13}\n", "setting", width, "(median)", "vs first",
                   "95% CI");
        for (size_t v = 0; v < n; ++v) {
            const nlohmann::json& e   = out[v];
            const std::string ci_text = interval_text(e["rss_ratio_vs_first_ci95"], v == 0);
            fmt::print("{:<{}} {:>9.1f} {:>10.3f} {:>13}\n",
                       fmt::format("#{} {}", v + 1, settings[v].label), width,
                       e["peak_rss_mb_median"].get<double>(),
                       e["rss_ratio_vs_first_median"].get<double>(), ci_text);
        }
    }
    fmt::print("\nms per step (median over rounds)\n{:<14}", "phase");
    for (size_t v = 0; v < n; ++v) fmt::print(" {:>10}", fmt::format("#{}", v + 1));
    fmt::print("\n");
    for (size_t i = 0; i <= kNumPhases; ++i) {
        const char* name = i < kNumPhases ? kPhaseNames[i] : "other";
        fmt::print("{:<14}", name);
        for (const auto& e : out)
            fmt::print(" {:>10.2f}", e["phases_s_per_step"][name].get<double>() * 1e3);
        fmt::print("\n");
    }
    std::fflush(stdout);
    return 0;
}

int run_train_bench(const TrainConfig& cfg_in, const TrainBenchOptions& o,
                    dist::ParallelContext& par) {
    const TrainConfig cfg = timed_config(cfg_in, o);
    const int P           = par.size();
    if (o.compare_overlap) {
        if (o.repeats < 1) input_error("bench train: need --repeats >= 1");
        return compare_overlap(cfg, o, par);
    }

    std::vector<double> step_s, wait_s;
    train::TrainOptions opt;
    double data_wait = 0, wait_at_warmup = 0;
    opt.dry_run     = true;
    opt.data_wait_s = &data_wait;
    opt.on_step     = [&](int64_t step, double seconds, double wait) {
        if (step + 1 == o.warmup) {
            reset_phase_timer();
            moe::reset_a2a_seconds();
            wait_at_warmup = data_wait;
        }
        if (step >= o.warmup) {
            step_s.push_back(seconds);
            wait_s.push_back(wait);
        }
    };
    reset_phase_timer();
    enable_phase_timer(true);
    const train::TrainSummary sum = train::run_training(cfg, opt, &par);
    enable_phase_timer(false);

    // After training, on the pool it set up (a second set_compute_threads could resize it).
    // MFU is taken against the peak of the path the products ran on (kernels/peak.h); the
    // FP32-peak MFU is reported beside it.
    const kernels::ProductPeak pp = kernels::measure_product_peak(cfg.precision.dtype, 1.0);
    const bool f32_path           = pp.path == kernels::PeakPath::fp32_fma;
    double peaks[2] = {f32_path ? pp.gflops : kernels::measure_peak_gflops_f32(1.0), pp.gflops};
    par.world().allreduce_sum(std::span<double>(peaks, 2));
    const double peak_f32       = peaks[0];
    const double peak           = peaks[1];
    const std::string peak_path = kernels::peak_path_name(pp.path);

    // The slowest rank's data wait (a non-reader waits for its scatter, not the prefetch).
    double waited = data_wait - wait_at_warmup;
    par.world().allreduce_max(std::span<double>(&waited, 1));

    // The expert all-to-alls' time per step, the most of any rank: in the exchanges (raw) and
    // what the computing thread waited for (exposed; below raw when parallel.a2a_chunks
    // overlaps them with the experts).
    const moe::A2aSeconds a2a = moe::a2a_seconds();
    double a2a_s[2]           = {a2a.raw, a2a.exposed};
    par.world().allreduce_max(std::span<double>(a2a_s, 2));
    for (double& s : a2a_s) s /= static_cast<double>(std::max<size_t>(step_s.size(), 1));

    std::vector<double> rss(static_cast<size_t>(P));
    const double own_rss = static_cast<double>(peak_rss_bytes()) / 1048576.0;
    par.world().allgather(&own_rss, sizeof(double), rss.data());
    if (par.rank() != 0) return 0;

    const double tokens       = tokens_per_step(cfg);
    const double mean_s       = mean(step_s);
    const double med_s        = median(step_s);
    const double tokens_per_s = tokens / med_s;
    const double model_gflops = tokens_per_s * sum.flops_per_token * 1e-9;
    const double mfu          = peak > 0 ? model_gflops / peak : 0.0;
    const double mfu_f32      = peak_f32 > 0 ? model_gflops / peak_f32 : 0.0;
    const double max_rss      = *std::max_element(rss.begin(), rss.end());

    const std::vector<double> phase_s = phases_per_step(step_s);
    std::vector<std::pair<std::string, double>> phases;  // seconds per step
    for (size_t i = 0; i <= kNumPhases; ++i)
        phases.emplace_back(i < kNumPhases ? kPhaseNames[i] : "other", phase_s[i]);
    // train.recompute: the forward backward runs again, inside the phases (rank 0's)
    const double recompute_s = recompute_seconds() / static_cast<double>(step_s.size());
    double phase_sum         = 0;
    for (const auto& p : phases) phase_sum += p.second;
    // Data wait: the time the loader's next() blocked for data (the prefetch, the readers'
    // scatter), the most of any rank; the goal is well under 1% of the step. Phase "data" is
    // all of next() (rank 0's).
    const double data_wait_s   = waited / static_cast<double>(step_s.size());
    const double data_fraction = mean_s > 0 ? data_wait_s / mean_s : 0.0;

    if (o.json) {
        nlohmann::json j;
        j["config"]                    = cfg.name;
        j["ranks"]                     = P;
        j["expert_parallel"]           = par.ep_size();
        j["threads_per_rank"]          = compute_pool().size();
        j["gemm_backend"]              = kernels::gemm_backend_name();
        j["kernels"]                   = kernels::dispatch().describe();
        j["cpu_model"]                 = kernels::cpu_features().model;
        j["half_features"]             = kernels::half_precision_features();
        j["gemm_backends"]             = gemm_backends(cfg);
        j["bf16_gemm_as_f32"]          = kernels::gemm_bf16_widens();
        j["attention_core"]            = attention_core(cfg);
        j["lm_head"]                   = lm_head_kind(cfg);
        j["head_recomputes"]           = sum.head_recomputes;
        j["steps"]                     = o.steps;
        j["warmup"]                    = o.warmup;
        j["tokens_per_step"]           = tokens;
        j["step_s_median"]             = med_s;
        j["step_s_mean"]               = mean_s;
        j["tokens_per_s"]              = tokens_per_s;
        j["model_gflops"]              = model_gflops;
        j["peak_gflops"]               = peak;
        j["peak_path"]                 = peak_path;
        j["mfu"]                       = mfu;
        j["peak_gflops_f32"]           = peak_f32;
        j["mfu_f32"]                   = mfu_f32;
        j["peak_rss_mb"]               = max_rss;
        j["peak_rss_mb_per_rank"]      = rss;
        j["recompute"]                 = name_of(cfg.train.recompute);
        j["recompute_s_per_step"]      = recompute_s;
        j["final_loss"]                = sum.final_loss;
        j["grad_reduce_wait_s_median"] = median(wait_s);
        j["data_wait_s_per_step"]      = data_wait_s;
        j["data_wait_fraction"]        = data_fraction;
        j["a2a_chunks"]                = cfg.parallel.a2a_chunks;
        j["a2a_raw_s_per_step"]        = a2a_s[0];
        j["a2a_exposed_s_per_step"]    = a2a_s[1];
        j["phases"]                    = nlohmann::json::object();
        for (const auto& [name, s] : phases) {
            j["phases"][name] = {{"s_per_step", s},
                                 {"fraction", phase_sum > 0 ? s / phase_sum : 0.0}};
        }
        return print_json(j);
    }
    fmt::print(
        "bench train {}: {} rank(s), expert parallel {}, {} threads per rank\nkernels {}\n"
        "attention core {}\n",
        cfg.name, P, par.ep_size(), compute_pool().size(), kernels::dispatch().describe(),
        attention_core(cfg));
    fmt::print("{} timed steps after {} warm-up, {:.0f} tokens per step\n", o.steps, o.warmup,
               tokens);
    fmt::print(
        "step {:.1f} ms median ({:.1f} ms mean): {:.0f} tokens/s, {:.1f} model GFLOP/s, "
        "peak {:.1f} GFLOP/s ({}), MFU {:.3f}\n",
        med_s * 1e3, mean_s * 1e3, tokens_per_s, model_gflops, peak, peak_path, mfu);
    if (P > 1) {
        fmt::print("gradient reduction after backward (exposed): {:.2f} ms median\n",
                   median(wait_s) * 1e3);
    }
    fmt::print("data wait {:.3f} ms per step (most of any rank): {:.3f}% of the step\n",
               data_wait_s * 1e3, 100.0 * data_fraction);
    if (par.ep_size() > 1) {
        fmt::print(
            "expert all-to-all {:.2f} ms per step in the exchanges, {:.2f} ms exposed (most of "
            "any rank; parallel.a2a_chunks = {})\n",
            a2a_s[0] * 1e3, a2a_s[1] * 1e3, cfg.parallel.a2a_chunks);
    }
    fmt::print("peak RSS {:.1f} MiB", max_rss);
    if (P > 1) fmt::print(" (per rank: {:.1f})", fmt::join(rss, ", "));
    fmt::print(
        "\nrecompute {}: {:.2f} ms per step of forward run again in backward ({:.1f}% of "
        "the step, inside the phases below)",
        name_of(cfg.train.recompute), recompute_s * 1e3,
        mean_s > 0 ? 100.0 * recompute_s / mean_s : 0.0);
    fmt::print("\n{:<14} {:>10} {:>8}\n", "phase", "ms/step", "share");
    for (const auto& [name, s] : phases) {
        fmt::print("{:<14} {:>10.2f} {:>7.1f}%\n", name, s * 1e3,
                   phase_sum > 0 ? 100.0 * s / phase_sum : 0.0);
    }
    std::fflush(stdout);
    return 0;
}

}  // namespace bagualu::bench

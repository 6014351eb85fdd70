#include "train/trainer.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "dist/comm/checks.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "model/model_io.h"
#include "report/metrics.h"
#include "train/evaluate.h"
#include "train/full_params.h"
#include "train/optimizer.h"
#include "train/loss_scale.h"
#include "train/lr_schedule.h"
#include "core/phase_timer.h"
#include "train/progress.h"
#include "train/resources.h"
#include "train/samples.h"

namespace bagualu::train {

namespace fs = std::filesystem;
using Clock  = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Refuses to mix a new run into a directory that holds an earlier one, unless forced.
static void prepare_run_dir(const std::string& dir, bool force) {
    std::error_code ec;
    if (fs::exists(dir + "/metrics.jsonl") && !force) {
        input_error("{}: already holds a run (metrics.jsonl); choose another --run-dir or pass "
                    "--force to replace it",
                    dir);
    }
    fs::create_directories(dir, ec);
    if (ec) input_error("{}: cannot create run directory: {}", dir, ec.message());
}

// A hash of this executable, so ranks can check they run the same build.
static uint64_t binary_hash() {
    std::ifstream     f("/proc/self/exe", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    return XXH64(bytes.data(), bytes.size(), 0);
}

// Per-expert load of one MoE layer: max over mean of the rows each expert received (all ranks).
static double load_max_over_mean(const int64_t* tpe, int E) {
    double mx = 0, total = 0;
    for (int e = 0; e < E; ++e) {
        mx = std::max(mx, static_cast<double>(tpe[e]));
        total += static_cast<double>(tpe[e]);
    }
    return total > 0 ? mx / (total / E) : 0.0;
}

// Per MoE layer, after capacity and SWIPE, over all ranks (last micro-step of the step).
static void add_routing_metrics(nlohmann::json& j, const model::GPT& gpt, int E) {
    nlohmann::json loads = nlohmann::json::array(), dropped = loads, reassigned = loads,
                   entropy = loads, tokens = loads;
    for (const auto& layer : gpt.moe_layers()) {
        const moe::RoutingStats& s = layer->routing_stats();
        const double             slots = static_cast<double>(std::max<int64_t>(s.slots, 1));
        loads.push_back(load_max_over_mean(s.tokens_per_expert.data(), E));
        dropped.push_back(static_cast<double>(s.dropped) / slots);
        reassigned.push_back(static_cast<double>(s.reassigned) / slots);
        entropy.push_back(s.entropy);
        tokens.push_back(s.tokens_per_expert);
    }
    j["expert_load_max_over_mean"] = loads;
    j["dropped_fraction"]          = dropped;
    j["reassigned_fraction"]       = reassigned;
    j["routing_entropy"]           = entropy;
    j["expert_tokens"]             = tokens;
}

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opt,
                          dist::ParallelContext* par_in) {
    const auto t_start = Clock::now();
    std::unique_ptr<dist::ParallelContext> single;
    dist::ParallelContext* par = par_in;
    if (!par) {
        single = dist::ParallelContext::single();
        par    = single.get();
    }
    const int  P      = par->size();
    const bool root   = par->rank() == 0;
    const bool writer = root && !opt.dry_run;  // logs, run directory, metrics, model
    set_compute_threads(cfg.train.threads);
    const ModelConfig& m = cfg.model;
    const int          T = m.seq_len;

    // ---- set-up: every input check before the first collective of the model ----
    data::Dataset ds;
    {
        std::string error;
        try {
            validate_layout(cfg, P);
            ds = data::load_dataset(cfg);
            if (writer) prepare_run_dir(cfg.train.run_dir, opt.force);
        } catch (const InputError& e) {
            error = e.what();
        }
        if (P > 1) {
            dist::check_all_ok(par->world(), error.empty(), error);
            const std::string toml = to_toml(cfg);
            dist::check_same_everywhere(par->world(), XXH64(toml.data(), toml.size(), 0),
                                        "the resolved config");
            dist::check_same_everywhere(par->world(), binary_hash(), "the bagualu binary");
        } else if (!error.empty()) {
            throw InputError(error);
        }
    }
    const int     MB    = static_cast<int>(cfg.micro_batch(P));
    const int64_t accum = cfg.grad_accum_steps(P);
    if (writer) {
        std::ofstream f(cfg.train.run_dir + "/config.toml");
        f << to_toml(cfg);
    }

    const model::PrecisionPolicy prec = model::PrecisionPolicy::from_config(cfg.precision);
    LossScaler                   scaler(cfg.precision, prec.loss_scaling());
    model::GPT gpt(m, MB, par, cfg.parallel.virtual_workers, prec);
    model::init_params(gpt.params(), gpt.layout(), m, cfg.train.seed);
    const std::unique_ptr<Optimizer> optimizer = make_optimizer(cfg, gpt.layout(), *par);
    const MemoryFootprint            mem       = optimizer->footprint();

    // Every rank walks the same global order; rank r trains on its slice of each micro-step.
    data::SequenceSampler sampler(ds.train, T, cfg.train.seed);
    const size_t          slice = static_cast<size_t>(MB) * T;
    std::vector<int32_t>  g_inputs(slice * static_cast<size_t>(P)), g_targets(g_inputs.size());
    const int32_t*        inputs  = g_inputs.data() + slice * static_cast<size_t>(par->rank());
    const int32_t*        targets = g_targets.data() + slice * static_cast<size_t>(par->rank());

    const double  peak_gflops     = kernels::measure_peak_gflops_f32(0.2);
    const double  flops_per_token = 3.0 * gpt.flops_per_token(T);  // forward + backward
    const int64_t tokens_per_step = cfg.train.batch_size * T;       // all ranks

    if (writer) {
        log::info("model: {} parameters ({} layers, {} MoE, {} experts top-{}), vocab {}",
                  model::make_layout(m).num_params(), m.n_layer,
                  m.moe_every > 0 ? m.n_layer / m.moe_every : 0, m.n_experts, m.top_k, m.vocab_size);
        log::info("layout: {} rank(s), expert parallel {} x data parallel {}; {} local experts "
                  "per MoE layer",
                  P, par->ep_size(), par->edp_size(), m.n_experts / par->ep_size());
        log::info("data: {} train tokens ({} windows of {}), {} val tokens; batch {} x {} "
                  "tokens = {} micro-batch(es) of {} per rank",
                  ds.train.size(), sampler.num_windows(), T + 1, ds.val.size(),
                  cfg.train.batch_size, T, accum, MB);
        constexpr double kMiB = 1 << 20;
        log::info("memory per rank: parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer "
                  "state {:.1f} MiB ({}), bucket buffers {:.1f} MiB",
                  mem.param_bytes / kMiB, mem.grad_bytes / kMiB, mem.optim_bytes / kMiB,
                  optimizer->partitioned() ? fmt::format("ParO over {} rank(s)", P) : "replicated",
                  mem.comm_bytes / kMiB);
        log::info("precision: {}{}", prec.describe(),
                  scaler.enabled() ? fmt::format(", dynamic loss scale from {}", scaler.scale()) : "");
        log::info("compute: {} threads per rank, gemm {}, measured peak {:.1f} GFLOP/s fp32",
                  compute_pool().size(), kernels::gemm_backend_name(), peak_gflops);
    }

    std::ofstream metrics;
    if (writer) {
        metrics.open(cfg.train.run_dir + "/metrics.jsonl", std::ios::trunc);
        if (!metrics) throw InputError(cfg.train.run_dir + "/metrics.jsonl: cannot write");
    }
    auto emit = [&](const nlohmann::json& j) {
        if (writer) metrics << j.dump() << "\n" << std::flush;
    };

    Progress     progress(opt.quiet || !writer ? Progress::Mode::Quiet : Progress::Mode::Auto);
    TrainSummary sum;
    sum.peak_gflops         = peak_gflops;
    sum.flops_per_token     = flops_per_token;
    sum.run_dir             = cfg.train.run_dir;
    sum.val_unigram_entropy = ds.val_unigram_entropy;

    dist::CommTally eval_comm;  // evaluation's collectives, left out of the step counts
    auto run_eval = [&](int64_t step) {
        gpt.set_routing_context(moe::RoutingContext{});  // inference routing: plain top-k
        const dist::CommTally c0 = dist::comm_tally();
        const EvalResult r = evaluate(gpt, ds.val, MB, cfg.train.eval_batches, par);
        emit({{"step", step}, {"val_loss", r.loss}, {"val_ppl", std::exp(r.loss)},
              {"val_tokens", r.tokens}, {"elapsed_s", seconds_since(t_start)}});
        progress.message(fmt::format("step {:>6} | val loss {:.4f} | val ppl {:.2f}", step, r.loss,
                                     std::exp(r.loss)));
        eval_comm = eval_comm + (dist::comm_tally() - c0);
        return r.loss;
    };

    const dist::CommTally comm_start = dist::comm_tally();
    const auto t_train      = Clock::now();
    double     window_time  = 0;
    int64_t    window_steps = 0;
    for (int64_t step = 0; step < cfg.train.steps; ++step) {
        const auto t0 = Clock::now();
        gpt.zero_grad();
        double loss = 0, aux = 0;
        for (int64_t micro = 0; micro < accum; ++micro) {
            sampler.next_batch(g_inputs.data(), g_targets.data(), MB * P);
            gpt.set_routing_context({cfg.train.seed, step * accum + micro, true});
            loss += gpt.forward(inputs, targets, MB, T) / static_cast<double>(accum);
            aux += gpt.aux_loss() / static_cast<double>(accum);
            gpt.backward(static_cast<float>(scaler.scale()) / static_cast<float>(accum));
        }
        if (P > 1) {
            par->world().allreduce_sum(std::span<double>(&loss, 1));
            loss /= P;
        }
        if (!std::isfinite(loss)) {
            throw InternalError(fmt::format(
                "training diverged at step {}: loss = {} (lower train.lr or raise warmup_steps)",
                step + 1, loss));
        }
        PhaseScope   optimizer_phase(Phase::optimizer);
        const double lr = lr_at(step, cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr,
                                cfg.train.min_lr);
        const double loss_scale = scaler.scale();
        optimizer->set_loss_scale(loss_scale);
        const double norm    = optimizer->step(gpt.params(), gpt.grads(), lr, step + 1);
        const bool   skipped = optimizer->skipped();
        scaler.update(skipped);
        sum.skipped_steps += skipped ? 1 : 0;
        optimizer_phase.stop();
        const double dt = seconds_since(t0);
        window_time += dt;
        ++window_steps;
        sum.final_loss = loss;
        if (opt.on_step) opt.on_step(step, dt);

        const bool last = step + 1 == cfg.train.steps;
        if ((step + 1) % cfg.train.log_every == 0 || last || step == 0 || skipped) {
            const double   tps = static_cast<double>(tokens_per_step * window_steps) / window_time;
            const double   mfu = peak_gflops > 0 ? tps * flops_per_token / (P * peak_gflops * 1e9) : 0;
            nlohmann::json j   = {{"step", step + 1},    {"loss", loss}, {"lr", lr},
                                  {"grad_norm", norm},   {"tokens_per_s", tps}, {"mfu", mfu},
                                  {"elapsed_s", seconds_since(t_start)}};
            if (scaler.enabled()) j["loss_scale"] = loss_scale;  // the scale this step ran with
            if (scaler.enabled() || skipped) j["skipped"] = skipped;
            if (step == 0) {
                j["param_bytes"] = mem.param_bytes;
                j["grad_bytes"]  = mem.grad_bytes;
                j["optim_bytes"] = mem.optim_bytes;
            }
            if (!gpt.moe_layers().empty()) {
                j["aux_loss"] = aux;
                add_routing_metrics(j, gpt, m.n_experts);
            }
            emit(j);
            sum.tokens_per_s = tps;
            const double eta = (seconds_since(t_train) / static_cast<double>(step + 1)) *
                               static_cast<double>(cfg.train.steps - step - 1);
            progress.update(step + 1, cfg.train.steps, loss, tps, mfu, eta);
            window_time  = 0;
            window_steps = 0;
        }
        if (cfg.train.eval_every > 0 && (step + 1) % cfg.train.eval_every == 0 && !last &&
            !opt.dry_run) {
            run_eval(step + 1);
        }
    }
    emit(resource_report(dist::comm_tally() - comm_start - eval_comm, cfg.train.steps, *par));
    sum.steps            = cfg.train.steps;
    sum.final_loss_scale = scaler.scale();
    if (opt.dry_run) return sum;
    sum.final_val_loss = run_eval(cfg.train.steps);
    {
        std::vector<int64_t> rss(static_cast<size_t>(P));
        const auto           mine = static_cast<int64_t>(peak_rss_bytes());
        par->world().allgather(&mine, sizeof(mine), rss.data());
        emit({{"step", cfg.train.steps}, {"peak_rss_bytes", rss}});
        if (root) {
            std::string mib;
            for (const int64_t b : rss) mib += fmt::format("{}{}", mib.empty() ? "" : ", ", b >> 20);
            log::info("peak resident memory per rank (VmHWM): {} MiB", mib);
        }
    }

    const Buffer<float> full = gather_full_params(gpt, par);
    sum.model_dir            = cfg.train.run_dir + "/model";
    if (root) {
        model::save_model(sum.model_dir, m, full.data(), false,
                          ds.has_tokenizer ? cfg.data.tokenizer : std::string(),
                          {{"step", std::to_string(cfg.train.steps)},
                           {"val_loss", fmt::format("{:.9g}", sum.final_val_loss)}});
        metrics.close();
        report::write_loss_chart(cfg.train.run_dir);
        if (!gpt.moe_layers().empty()) report::write_expert_load_chart(cfg.train.run_dir);
        progress.finish();
        log::info("final val loss {:.4f} nats/token (ppl {:.2f}) after {} steps, {:.1f} s",
                  sum.final_val_loss, std::exp(sum.final_val_loss), sum.steps,
                  seconds_since(t_start));
        if (sum.val_unigram_entropy >= 0) {
            log::info("val unigram entropy {:.4f} nats/token: the model is {:.3f} nats below it",
                      sum.val_unigram_entropy, sum.val_unigram_entropy - sum.final_val_loss);
        }
        log::info("run directory {}: config.toml metrics.jsonl loss.svg{} model/", cfg.train.run_dir,
                  gpt.moe_layers().empty() ? "" : " expert_load.svg");
        if (!opt.quiet && ds.has_tokenizer && cfg.sample.n_samples > 0) {
            print_samples(m, full.data(), cfg.data.tokenizer, cfg.sample);
        }
    }
    return sum;
}

}  // namespace bagualu::train

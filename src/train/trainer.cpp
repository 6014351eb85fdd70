#include "train/trainer.h"

#include <xxhash.h>

#include <chrono>
#include <optional>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/helper_thread.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "dist/comm/checks.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "model/model_io.h"
#include "report/metrics.h"
#include "io/checkpoint/checkpoint.h"
#include "train/checkpointing.h"
#include "train/evaluate.h"
#include "train/full_params.h"
#include "train/optimizer.h"
#include "train/loss_scale.h"
#include "train/lr_schedule.h"
#include "core/phase_timer.h"
#include "train/progress.h"
#include "train/resources.h"
#include "train/run_dir.h"
#include "train/samples.h"

namespace bagualu::train {

namespace fs = std::filesystem;
using Clock  = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Test hook for crash recovery: BAGUALU_FAULT_KILL_AT_STEP=N sends SIGKILL to rank
// BAGUALU_FAULT_KILL_RANK (default 0) after the backward pass of step N (1-based), i.e. in the
// middle of that step, exactly like `kill -9`.
static void maybe_inject_kill(int64_t step, int rank) {
    static const char* at = std::getenv("BAGUALU_FAULT_KILL_AT_STEP");
    if (!at || std::atoll(at) != step) return;
    const char* r = std::getenv("BAGUALU_FAULT_KILL_RANK");
    if ((r ? std::atoi(r) : 0) == rank) ::raise(SIGKILL);
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
    const bool resume = cfg.checkpoint.resume == "auto" && !opt.dry_run;

    // ---- set-up: every input check before the first collective of the model ----
    data::Dataset                     ds;
    std::unique_ptr<data::DataLoader> loader;
    RunDirLock                        run_dir_lock;  // held until the run ends
    {
        std::string error;
        try {
            validate_layout(cfg, P);
            loader = std::make_unique<data::DataLoader>(cfg, *par);
            ds     = data::load_dataset(cfg);
            if (writer) run_dir_lock = prepare_run_dir(cfg, opt.force, resume);
        } catch (const InputError& e) {
            error = e.what();
        }
        dist::fail_together(par->world(), error);
        if (P > 1) {
            const std::string toml = to_toml(cfg);
            dist::check_same_everywhere(par->world(), XXH64(toml.data(), toml.size(), 0),
                                        "the resolved config");
            dist::check_same_everywhere(par->world(), binary_hash(), "the bagualu binary");
        }
    }
    const int     MB    = static_cast<int>(cfg.micro_batch(P));
    const int64_t accum = cfg.grad_accum_steps(P);
    if (writer) write_run_file(cfg.train.run_dir + "/config.toml", to_toml(cfg));

    const model::PrecisionPolicy prec = model::PrecisionPolicy::from_config(cfg.precision);
    LossScaler                   scaler(cfg.precision, prec.loss_scaling());
    model::GPT gpt(m, MB, par, cfg.parallel.virtual_workers, prec);
    model::init_params(gpt.params(), gpt.layout(), m, cfg.train.seed);
    // Gradient reduction overlaps the last backward of each step on the helper thread, which
    // needs MPI_THREAD_MULTIPLE (the main thread's all-to-alls run at the same time).
    const bool overlap_wanted = cfg.parallel.overlap_grad_reduce && P > 1;
    const bool overlap        = overlap_wanted && par->world().threads_multiple();
    if (overlap_wanted && !overlap && root) {
        log::warn("MPI does not provide MPI_THREAD_MULTIPLE: gradients are reduced after backward, "
                  "not overlapped with it (parallel.overlap_grad_reduce)");
    }
    std::unique_ptr<HelperThread> helper = overlap ? std::make_unique<HelperThread>() : nullptr;
    const std::unique_ptr<Optimizer> optimizer =
        make_optimizer(cfg, gpt.layout(), *par, helper.get());
    const MemoryFootprint            mem       = optimizer->footprint();

    // This rank's slice of each micro-step of the global order (data/loader.h).
    std::vector<int32_t> inputs(static_cast<size_t>(MB) * T), targets(inputs.size());

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
                  loader->num_tokens(), loader->num_windows(), T + 1, ds.val.num_tokens(),
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
        if (P > 1) {
            log::info("gradient reduction: {}", optimizer->overlapped()
                                                    ? "overlapped with backward (helper thread)"
                                                    : "after backward");
        }
    }

    // ---- checkpoints: resume from the newest usable one ----
    std::optional<Checkpointer> ckpt;
    int64_t                     start_step = 0;
    if (!opt.dry_run && (cfg.checkpoint.every > 0 || resume)) {
        ckpt.emplace(cfg, gpt.layout(), *optimizer, *par);
        if (resume) {
            if (const std::optional<ResumePoint> rp = ckpt->load_latest(gpt.params())) {
                start_step = rp->step;
                const TrainerState& ts = rp->trainer;
                loader->set_cursor({ts.epoch, ts.position});
                if (ts.has_loss_scale) {
                    scaler.restore(ts.loss_scale, ts.clean_steps);
                    optimizer->set_steps_skipped(ts.steps_skipped);
                }
                if (writer) log::info("resumed from {} (step {})", rp->dir, start_step);
            } else if (writer) {
                log::info("no checkpoint in {}: training from the start", ckpt->root());
            }
        }
    }
    const std::string metrics_path = cfg.train.run_dir + "/metrics.jsonl";
    if (writer && start_step > 0) trim_metrics(metrics_path, start_step);

    MetricsWriter metrics;
    if (writer) metrics.open(metrics_path, start_step > 0);
    auto emit = [&](const nlohmann::json& j) { metrics.write(j); };

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
    double     window_time  = 0, window_wait = 0;
    int64_t    window_steps = 0;
    const auto grads_ready  = [&](size_t from) { optimizer->grads_ready(from); };
    for (int64_t step = start_step; step < cfg.train.steps; ++step) {
        const auto t0 = Clock::now();
        gpt.zero_grad();
        // Set before backward: with overlap, buckets are unscaled on the helper thread meanwhile.
        const double loss_scale = scaler.scale();
        optimizer->set_loss_scale(loss_scale);
        double loss = 0, aux = 0;
        for (int64_t micro = 0; micro < accum; ++micro) {
            {
                PhaseScope data_phase(Phase::data);
                loader->next(inputs.data(), targets.data());
            }
            gpt.set_routing_context({cfg.train.seed, step * accum + micro, true});
            loss += gpt.forward(inputs.data(), targets.data(), MB, T) / static_cast<double>(accum);
            aux += gpt.aux_loss() / static_cast<double>(accum);
            if (micro + 1 < accum) {
                gpt.backward(static_cast<float>(scaler.scale()) / static_cast<float>(accum));
            } else {  // the last backward of the step: reduce what it has finished meanwhile
                optimizer->begin_reduction(gpt.grads());
                gpt.backward(static_cast<float>(scaler.scale()) / static_cast<float>(accum), grads_ready);
            }
        }
        maybe_inject_kill(step + 1, par->rank());
        // the step's one small collective also tells whether every rank's checkpoint write is done
        double sums[2] = {loss, ckpt ? ckpt->busy() : 0.0};
        if (P > 1) par->world().allreduce_sum(std::span<double>(sums, 2));
        loss = sums[0] / P;
        if (ckpt && ckpt->pending() && sums[1] == 0) ckpt->finalize();
        if (!std::isfinite(loss)) {
            throw InternalError(fmt::format(
                "training diverged at step {}: loss = {} (lower train.lr or raise warmup_steps)",
                step + 1, loss));
        }
        PhaseScope   optimizer_phase(Phase::optimizer);
        const double lr = lr_at(step, cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr,
                                cfg.train.min_lr);
        const double norm    = optimizer->step(gpt.params(), gpt.grads(), lr, step + 1);
        const bool   skipped = optimizer->skipped();
        scaler.update(skipped);
        sum.skipped_steps += skipped ? 1 : 0;
        optimizer_phase.stop();
        const double dt = seconds_since(t0);
        window_time += dt;
        window_wait += optimizer->reduce_wait_s();
        ++window_steps;
        sum.final_loss = loss;
        if (opt.data_wait_s) *opt.data_wait_s = loader->wait_seconds();
        if (opt.on_step) opt.on_step(step, dt, optimizer->reduce_wait_s());

        const bool last = step + 1 == cfg.train.steps;
        if (ckpt && cfg.checkpoint.every > 0 && ((step + 1) % cfg.checkpoint.every == 0 || last)) {
            const data::SamplerCursor c = loader->cursor();
            // All randomness of a step (gate noise and jitter) is drawn from Rng(seed, micro-step
            // index), so the RNG state is the seed and the count of micro-steps taken.
            ckpt->save(step + 1,
                       {{"sampler", {{"epoch", c.epoch}, {"position", c.position}}},
                        {"rng", {{"seed", cfg.train.seed}, {"micro_steps", (step + 1) * accum}}},
                        {"loss_scale", {{"scale", scaler.scale()}, {"clean_steps", scaler.clean_steps()}}},
                        {"steps_skipped", optimizer->steps_skipped()}},
                       gpt.params());
        }
        if ((step + 1) % cfg.train.log_every == 0 || last || step == 0 || skipped) {
            const double   tps = static_cast<double>(tokens_per_step * window_steps) / window_time;
            const double   mfu = peak_gflops > 0 ? tps * flops_per_token / (P * peak_gflops * 1e9) : 0;
            nlohmann::json j   = {{"step", step + 1},    {"loss", loss}, {"lr", lr},
                                  {"grad_norm", norm},   {"tokens_per_s", tps}, {"mfu", mfu},
                                  {"elapsed_s", seconds_since(t_start)}};
            if (P > 1) j["grad_reduce_wait_s"] = window_wait / static_cast<double>(window_steps);
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
            window_wait  = 0;
            window_steps = 0;
        }
        if (cfg.train.eval_every > 0 && (step + 1) % cfg.train.eval_every == 0 && !last &&
            !opt.dry_run) {
            run_eval(step + 1);
        }
    }
    if (ckpt) ckpt->close();
    emit(resource_report(dist::comm_tally() - comm_start - eval_comm,
                         std::max<int64_t>(cfg.train.steps - start_step, 1), *par));
    if (ckpt && cfg.checkpoint.every > 0) {
        emit({{"step", cfg.train.steps},
              {"checkpoint_stall_s", ckpt->stall_seconds()},
              {"checkpoint_write_s", ckpt->write_seconds()},
              {"checkpoint_bytes", ckpt->bytes_written()}});
        if (writer) {
            log::info("checkpoints: {} (the step loop waited {:.3f} s for them)",
                      ckpt->last_committed().empty() ? "none written" : ckpt->last_committed(),
                      ckpt->stall_seconds());
        }
    }
    sum.steps          = cfg.train.steps;
    sum.data_wait_s    = loader->wait_seconds();
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

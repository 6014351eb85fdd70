#include "train/trainer.h"

#include <unistd.h>

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
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "model/model_io.h"
#include "report/metrics.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/progress.h"
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

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opt) {
    const auto t_start = Clock::now();
    set_compute_threads(cfg.train.threads);
    const ModelConfig& m  = cfg.model;
    const int          T  = m.seq_len;
    const int          MB = static_cast<int>(cfg.micro_batch());
    const int64_t      accum = cfg.grad_accum_steps();

    data::Dataset ds = data::load_dataset(cfg);
    prepare_run_dir(cfg.train.run_dir, opt.force);
    {
        std::ofstream f(cfg.train.run_dir + "/config.toml");
        f << to_toml(cfg);
    }

    model::GPT gpt(m, MB);
    model::init_params(gpt.params(), gpt.layout(), m, cfg.train.seed);
    const size_t  n_floats = gpt.n_floats();
    Buffer<float> adam_m(n_floats), adam_v(n_floats);

    data::SequenceSampler sampler(ds.train, T, cfg.train.seed);
    std::vector<int32_t>  inputs(static_cast<size_t>(MB) * T), targets(inputs.size());

    const double peak_gflops     = kernels::measure_peak_gflops_f32(0.2);
    const double flops_per_token = 3.0 * gpt.flops_per_token(T);  // forward + backward
    const int64_t tokens_per_step = cfg.train.batch_size * T;

    log::info0("model: {} parameters ({} layers, {} MoE, {} experts top-{}), vocab {}",
               gpt.layout().num_params(), m.n_layer,
               m.moe_every > 0 ? m.n_layer / m.moe_every : 0, m.n_experts, m.top_k, m.vocab_size);
    log::info0("data: {} train tokens ({} windows of {}), {} val tokens; batch {} x {} tokens, "
               "{} micro-batch(es) of {}",
               ds.train.size(), sampler.num_windows(), T + 1, ds.val.size(), cfg.train.batch_size,
               T, accum, MB);
    log::info0("compute: {} threads, gemm {}, measured peak {:.1f} GFLOP/s fp32",
               compute_pool().size(), kernels::gemm_backend_name(), peak_gflops);

    std::ofstream metrics(cfg.train.run_dir + "/metrics.jsonl", std::ios::trunc);
    if (!metrics) input_error("{}/metrics.jsonl: cannot write", cfg.train.run_dir);
    auto emit = [&](const nlohmann::json& j) { metrics << j.dump() << "\n" << std::flush; };

    Progress     progress(opt.quiet ? Progress::Mode::Quiet : Progress::Mode::Auto);
    TrainSummary sum;
    sum.run_dir             = cfg.train.run_dir;
    sum.val_unigram_entropy = ds.val_unigram_entropy;

    auto run_eval = [&](int64_t step) {
        const EvalResult r = evaluate(gpt, ds.val, MB, cfg.train.eval_batches);
        emit({{"step", step}, {"val_loss", r.loss}, {"val_ppl", std::exp(r.loss)},
              {"val_tokens", r.tokens}, {"elapsed_s", seconds_since(t_start)}});
        progress.message(fmt::format("step {:>6} | val loss {:.4f} | val ppl {:.2f}", step, r.loss,
                                     std::exp(r.loss)));
        return r.loss;
    };

    const auto t_train = Clock::now();
    double     window_time = 0;
    int64_t    window_steps = 0;
    for (int64_t step = 0; step < cfg.train.steps; ++step) {
        const auto t0 = Clock::now();
        gpt.zero_grad();
        double loss = 0, aux = 0;
        for (int64_t micro = 0; micro < accum; ++micro) {
            sampler.next_batch(inputs.data(), targets.data(), MB);
            loss += gpt.forward(inputs.data(), targets.data(), MB, T) / static_cast<double>(accum);
            aux += gpt.aux_loss() / static_cast<double>(accum);
            gpt.backward(1.0f / static_cast<float>(accum));
        }
        if (!std::isfinite(loss)) {
            throw InternalError(fmt::format(
                "training diverged at step {}: loss = {} (lower train.lr or raise warmup_steps)",
                step + 1, loss));
        }
        float*       grads = gpt.grads();
        const double norm  = std::sqrt(kernels::sum_squares(grads, n_floats));
        if (cfg.train.grad_clip > 0 && norm > cfg.train.grad_clip) {
            kernels::scale_inplace(grads, static_cast<float>(cfg.train.grad_clip / norm), n_floats);
        }
        const double lr = lr_at(step, cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr,
                                cfg.train.min_lr);
        for (const model::ParamSpec& s : gpt.layout().specs()) {
            kernels::adamw_update(gpt.params() + s.offset, grads + s.offset, adam_m.data() + s.offset,
                                  adam_v.data() + s.offset, s.numel, static_cast<float>(lr),
                                  static_cast<float>(cfg.train.beta1),
                                  static_cast<float>(cfg.train.beta2),
                                  static_cast<float>(cfg.train.eps),
                                  s.decay ? static_cast<float>(cfg.train.weight_decay) : 0.0f,
                                  static_cast<int>(step + 1));
        }
        const double dt = seconds_since(t0);
        window_time += dt;
        ++window_steps;
        sum.final_loss = loss;

        const bool last = step + 1 == cfg.train.steps;
        if ((step + 1) % cfg.train.log_every == 0 || last || step == 0) {
            const double tps = static_cast<double>(tokens_per_step * window_steps) / window_time;
            const double mfu = peak_gflops > 0 ? tps * flops_per_token / (peak_gflops * 1e9) : 0;
            nlohmann::json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                {"tokens_per_s", tps}, {"mfu", mfu},
                                {"elapsed_s", seconds_since(t_start)}};
            if (!gpt.moe_layers().empty()) {
                j["aux_loss"] = aux;
                nlohmann::json loads = nlohmann::json::array();
                for (const auto& layer : gpt.moe_layers()) {
                    const int32_t* tpe = layer->tokens_per_expert();
                    double         mx = 0, total = 0;
                    for (int e = 0; e < m.n_experts; ++e) {
                        mx = std::max(mx, static_cast<double>(tpe[e]));
                        total += tpe[e];
                    }
                    loads.push_back(total > 0 ? mx / (total / m.n_experts) : 0.0);
                }
                j["expert_load_max_over_mean"] = loads;
            }
            emit(j);
            sum.tokens_per_s = tps;
            const double eta = (seconds_since(t_train) / static_cast<double>(step + 1)) *
                               static_cast<double>(cfg.train.steps - step - 1);
            progress.update(step + 1, cfg.train.steps, loss, tps, mfu, eta);
            window_time  = 0;
            window_steps = 0;
        }
        if (cfg.train.eval_every > 0 && (step + 1) % cfg.train.eval_every == 0 && !last) {
            run_eval(step + 1);
        }
    }
    sum.steps          = cfg.train.steps;
    sum.final_val_loss = run_eval(cfg.train.steps);

    sum.model_dir = cfg.train.run_dir + "/model";
    model::save_model(sum.model_dir, m, gpt.params(), false,
                      ds.has_tokenizer ? cfg.data.tokenizer : std::string(),
                      {{"step", std::to_string(cfg.train.steps)},
                       {"val_loss", fmt::format("{:.9g}", sum.final_val_loss)}});
    report::write_loss_chart(cfg.train.run_dir);
    progress.finish();

    log::info0("final val loss {:.4f} nats/token (ppl {:.2f}) after {} steps, {:.1f} s", sum.final_val_loss,
               std::exp(sum.final_val_loss), sum.steps, seconds_since(t_start));
    if (sum.val_unigram_entropy >= 0) {
        log::info0("val unigram entropy {:.4f} nats/token: the model is {:.3f} nats below it",
                   sum.val_unigram_entropy, sum.val_unigram_entropy - sum.final_val_loss);
    }
    log::info0("run directory {}: config.toml metrics.jsonl loss.svg model/", cfg.train.run_dir);
    if (!opt.quiet && ds.has_tokenizer && cfg.sample.n_samples > 0) {
        print_samples(m, gpt.params(), cfg.data.tokenizer, cfg.sample);
    }
    return sum;
}

}  // namespace bagualu::train

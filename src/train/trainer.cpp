// run_training: a Trainer, whose members each do one stage of a run: set-up, resume, one step,
// evaluation, finish (see trainer.h).
#include "train/trainer.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/helper_thread.h"
#include "core/log.h"
#include "core/phase_timer.h"
#include "core/proc_memory.h"
#include "core/stop_signal.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "dist/comm/checks.h"
#include "dist/comm/counters.h"
#include "dist/paro/optimizer.h"
#include "io/checkpoint/checkpoint.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/gemm/driver.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "model/model_io.h"
#include "optim/loss_scale.h"
#include "optim/lr_schedule.h"
#include "report/metrics.h"
#include "train/checkpointing.h"
#include "train/evaluate.h"
#include "train/full_params.h"
#include "train/gemm_choices.h"
#include "train/progress.h"
#include "train/resources.h"
#include "train/routing_metrics.h"
#include "train/run_dir.h"
#include "train/samples.h"

namespace bagualu::train {

using Clock  = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Where sample.prompts came from, for an error about one: the --set item in effect, else the
// config file.
std::string prompts_source(const TrainConfig& cfg) {
    for (size_t i = cfg.overrides.size(); i-- > 0;) {
        if (cfg.overrides[i].rfind("sample.prompts=", 0) == 0) return "--set sample.prompts";
    }
    return cfg.source + ": sample.prompts";
}

// Test hook for crash recovery: BAGUALU_FAULT_KILL_AT_STEP=N sends SIGKILL to rank
// BAGUALU_FAULT_KILL_RANK (default 0) after the backward pass of step N (1-based), i.e. in the
// middle of that step, exactly like `kill -9`.
void maybe_inject_kill(int64_t step, int rank) {
    static const char* at = std::getenv("BAGUALU_FAULT_KILL_AT_STEP");
    if (!at || std::atoll(at) != step) return;
    const char* r = std::getenv("BAGUALU_FAULT_KILL_RANK");
    if ((r ? std::atoi(r) : 0) == rank) ::raise(SIGKILL);
}

// Tests of the graceful stop: BAGUALU_FAULT_SIGNAL_AT_STEP=N raises BAGUALU_FAULT_SIGNAL (a
// number, default SIGTERM) on rank BAGUALU_FAULT_SIGNAL_RANK (default 0) during step N
// (1-based), as `kill` from outside would, at a step the test knows.
void maybe_inject_signal(int64_t step, int rank) {
    static const char* at = std::getenv("BAGUALU_FAULT_SIGNAL_AT_STEP");
    if (!at || std::atoll(at) != step) return;
    const char* r = std::getenv("BAGUALU_FAULT_SIGNAL_RANK");
    const char* s = std::getenv("BAGUALU_FAULT_SIGNAL");
    if ((r ? std::atoi(r) : 0) == rank) ::raise(s ? std::atoi(s) : SIGTERM);
}

// train.init_from: the exported model it names, checked before the run directory is touched:
// a model (or a run directory's); where `writer` (rank 0 of a run that writes its directory),
// not inside the run directory whose model/ this run replaces, and made with the tokenizer of
// this run's data (the same ids for the same pieces): one rank reads the tokenizers.
std::string init_model_dir(const TrainConfig& cfg, bool writer) {
    const std::string arg = cfg.train.init_from;
    if (fs::exists(fs::path(arg) / io::ckpt::kManifestName)) {
        input_error(
            "train.init_from = {}: a checkpoint, not an exported model: export it first "
            "(bagualu export --checkpoint {} --out DIR) and start from DIR",
            arg, arg);
    }
    std::string dir;
    try {
        dir = model::model_dir_of(arg);
    } catch (const InputError& e) {
        input_error("train.init_from: {}", e.what());
    }
    if (!writer) return dir;
    std::error_code ec;
    const fs::path m   = fs::weakly_canonical(dir, ec);
    const fs::path run = fs::weakly_canonical(cfg.train.run_dir, ec);
    const auto [r, _]  = std::mismatch(run.begin(), run.end(), m.begin(), m.end());
    if (!ec && r == run.end()) {
        input_error(
            "train.init_from = {}: inside train.run_dir = {}, whose model/ this run replaces: "
            "copy the model elsewhere or train into another run directory",
            arg, cfg.train.run_dir);
    }
    const std::string tok = dir + "/tokenizer.model";
    if (!cfg.data.tokenizer.empty() && fs::exists(tok) && fs::exists(cfg.data.tokenizer) &&
        data::read_file_bytes(tok, "tokenizer") !=
            data::read_file_bytes(cfg.data.tokenizer, "data.tokenizer")) {
        input_error(
            "train.init_from = {}: its tokenizer.model differs from data.tokenizer = {}: the "
            "model's token ids would name other pieces (train on data made with its tokenizer)",
            arg, cfg.data.tokenizer);
    }
    return dir;
}

// A hash of this executable, so ranks can check they run the same build.
uint64_t binary_hash() {
    std::ifstream f("/proc/self/exe", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    return XXH64(bytes.data(), bytes.size(), 0);
}

// One training run from set-up to export. The constructor does the set-up (inputs checked on
// every rank before the model's first collective, the model, the optimizer, the start-up log);
// run() resumes from a checkpoint, trains the steps and finishes (final evaluation, resource
// report, export). Members are declared in the order they are built: the checkpointer goes before
// the optimizer it saves, the optimizer before the helper thread and the model it uses.
class Trainer {
   public:
    Trainer(const TrainConfig& cfg, const TrainOptions& opt, dist::ParallelContext* par_in);
    TrainSummary run();

   private:
    struct StepRecord {    // what a step's metrics line reports
        int64_t step = 0;  // 0-based
        double loss = 0, aux = 0, lr = 0, grad_norm = 0;
        double loss_scale = 1;  // the scale the step ran with
        bool skipped      = false;
    };

    void check_inputs();
    void build_model(const TrainConfig& cfg);
    void init_weights_from_model();
    void log_setup() const;
    void resume();
    data::OrderCursor resumed_cursor(const TrainerState& ts, const std::string& dir) const;
    void open_metrics();
    void train_step(int64_t step);
    double forward_backward(int64_t step, double& aux);
    double reduce_loss(double local_loss, int64_t step);
    void save_checkpoint(int64_t step);
    void log_step(const StepRecord& r);
    double evaluate_at(int64_t step);
    void emit(const nlohmann::json& j);
    TrainSummary finish();
    TrainSummary finish_stopped(int64_t steps_done);
    void report_checkpoints();
    void report_peak_rss();
    void write_outputs(const Buffer<float>& full);

    const TrainConfig& cfg_;
    const TrainOptions& opt_;
    const Clock::time_point t_start_;
    std::unique_ptr<dist::ParallelContext> single_;  // the context of a plain one-process run
    dist::ParallelContext* par_;
    const int P_;
    const bool root_;
    const bool writer_;  // logs, run directory, metrics, model
    const bool resume_;
    const int T_;
    int MB_        = 0;  // the largest micro-batch of a rank
    int64_t accum_ = 0;  // micro-steps per step
    BatchSplit split_;   // the step's batch over ranks and micro-steps
    data::Dataset ds_;
    std::unique_ptr<data::DataLoader> loader_;
    RunDirLock run_dir_lock_;  // held until the run ends
    std::string init_dir_;     // train.init_from's model directory, or ""
    model::PrecisionPolicy prec_;
    optim::LossScaler scaler_;
    std::unique_ptr<model::GPT> gpt_;
    std::unique_ptr<HelperThread> helper_;  // reduces gradients during backward
    std::unique_ptr<dist::paro::Optimizer> optimizer_;
    dist::paro::MemoryFootprint mem_;
    std::vector<int32_t> inputs_, targets_;  // (MB, T): this rank's micro-step
    double peak_gflops_          = 0;
    kernels::PeakPath peak_path_ = kernels::PeakPath::fp32_fma;
    double flops_per_token_      = 0;  // forward + backward
    int64_t tokens_per_step_     = 0;  // all ranks
    std::optional<Checkpointer> ckpt_;
    GemmChoiceRecord gemm_choices_;  // BGL_GEMM=auto's table of this rank
    int64_t start_step_ = 0;
    MetricsWriter metrics_;
    Progress progress_;
    TrainSummary sum_;
    dist::CommTally eval_comm_;   // evaluation's collectives, left out
    dist::CommTally comm_start_;  // of the steps' counts
    Clock::time_point t_train_;
    bool stop_          = false;                // a rank was signalled to stop (core/stop_signal.h)
    double window_time_ = 0, window_wait_ = 0;  // since the last
    int64_t window_steps_ = 0;                  // metrics line
};

// After the set-up (the constructor): resume, the steps, finish.
TrainSummary Trainer::run() {
    resume();
    open_metrics();
    comm_start_ = dist::comm_tally();
    t_train_    = Clock::now();
    for (int64_t step = start_step_; step < cfg_.train.steps; ++step) {
        train_step(step);
        if (stop_ && step + 1 < cfg_.train.steps) return finish_stopped(step + 1);
    }
    return finish();
}

// ---- set-up ----

Trainer::Trainer(const TrainConfig& cfg, const TrainOptions& opt, dist::ParallelContext* par_in)
    : cfg_(cfg),
      opt_(opt),
      t_start_(Clock::now()),
      single_(par_in ? nullptr : dist::ParallelContext::single()),
      par_(par_in ? par_in : single_.get()),
      P_(par_->size()),
      root_(par_->rank() == 0),
      writer_(root_ && !opt.dry_run),
      resume_(cfg.checkpoint.resume == Resume::automatic && !opt.dry_run),
      T_(cfg.model.seq_len),
      progress_(opt.quiet || !writer_ ? Progress::Mode::Quiet : Progress::Mode::Auto) {
    set_compute_threads(cfg.train.threads);
    moe::reset_a2a_seconds();
    check_inputs();
    split_ = cfg.batch_split(P_);
    MB_    = static_cast<int>(split_.max_rows());
    accum_ = split_.steps();
    if (writer_) write_run_file(cfg.train.run_dir + "/config.toml", to_toml(cfg));
    build_model(cfg);
    gemm_choices_ =
        GemmChoiceRecord(gemm_choice_path(cfg.train.run_dir, par_->rank()), !opt.dry_run);
    inputs_.resize(static_cast<size_t>(MB_) * T_);
    targets_.resize(inputs_.size());
    // MFU against the peak of the arithmetic the run's products use (kernels/peak.h)
    const kernels::ProductPeak pk = kernels::measure_product_peak(cfg.precision.dtype, 0.2);
    peak_gflops_                  = pk.gflops;
    peak_path_                    = pk.path;
    flops_per_token_              = 3.0 * gpt_->flops_per_token(T_);
    tokens_per_step_              = cfg.train.batch_size * T_;
    if (writer_) log_setup();
    sum_.peak_gflops         = peak_gflops_;
    sum_.flops_per_token     = flops_per_token_;
    sum_.run_dir             = cfg.train.run_dir;
    sum_.val_unigram_entropy = ds_.val_unigram_entropy;
}

// Every input check before the first collective of the model: a problem on any rank ends every
// rank with one message (exit 2). More than one rank: all run the same config and binary.
void Trainer::check_inputs() {
    // train.init_from, unless a checkpoint is there to resume from (its weights win, and the
    // model need not exist any more): as rank 0 sees it, which also chooses the checkpoint
    uint8_t init_from = 0;
    if (!cfg_.train.init_from.empty()) {
        if (root_)
            init_from = !(resume_ && !io::ckpt::list_complete(cfg_.checkpoint_dir()).empty());
        par_->world().broadcast(&init_from, 1, 0);
    }
    dist::check_together(par_->world(), [&] {
        validate_layout(cfg_, P_);
        validate_micro_batch(cfg_, P_);
        loader_ = std::make_unique<data::DataLoader>(cfg_, *par_);
        // rank 0 alone reads the val split's ids, for every rank (check_together)
        ds_ = data::load_dataset(cfg_, par_->rank() == 0);
        // the samples printed at the end: a prompt that cannot fit is refused now, not after
        // the training
        if (ds_.has_tokenizer && !opt_.quiet && cfg_.sample.n_samples > 0) {
            check_prompts_fit(cfg_.model, data::Tokenizer::load(cfg_.data.tokenizer), cfg_.sample,
                              prompts_source(cfg_));
        }
        // evaluation gives every rank the same number of windows (train/evaluate.cpp): fewer
        // windows than ranks would evaluate none and report a loss of 0
        if (ds_.val.num_windows() < P_) {
            input_error(
                "data.val holds {} window(s) of {} tokens, fewer than the {} ranks that evaluate "
                "it: use a longer validation split or fewer ranks",
                ds_.val.num_windows(), cfg_.model.seq_len + 1, P_);
        }
        if (init_from) init_dir_ = init_model_dir(cfg_, writer_);
        if (writer_) run_dir_lock_ = prepare_run_dir(cfg_, opt_.force, resume_);
    });
    if (P_ > 1) {
        const std::string toml = to_toml(cfg_);
        dist::check_same_everywhere(par_->world(), XXH64(toml.data(), toml.size(), 0),
                                    "the resolved config");
        dist::check_same_everywhere(par_->world(), binary_hash(), "the bagualu binary");
    }
}

// The model, its initial parameters, the loss scaler and the optimizer.
void Trainer::build_model(const TrainConfig& cfg) {
    prec_   = model::PrecisionPolicy::from_config(cfg.precision);
    scaler_ = optim::LossScaler(cfg.precision, prec_.loss_scaling());
    gpt_    = std::make_unique<model::GPT>(
        cfg.model, MB_, par_, cfg.parallel.virtual_workers, prec_,
        cfg.train.fused_head ? static_cast<int>(model::fused_head_rows(cfg.model)) : 0,
        cfg.train.recompute, cfg.parallel.a2a_chunks, cfg.parallel.overlap_shared);
    if (cfg.parallel.a2a_chunks > 1 && cfg.parallel.expert_parallel > 1 &&
        !par_->world().threads_multiple() && root_) {
        log::warn(
            "MPI does not provide MPI_THREAD_MULTIPLE: the all-to-all pieces "
            "(parallel.a2a_chunks) are exchanged in turn, not overlapped with the experts");
    }
    model::init_params(gpt_->params(), gpt_->layout(), cfg.model, cfg.train.seed);
    // Gradient reduction overlaps the last backward of each step on the helper thread, which
    // needs MPI_THREAD_MULTIPLE (the main thread's all-to-alls run at the same time).
    const bool overlap_wanted = cfg.parallel.overlap_grad_reduce && P_ > 1;
    const bool overlap        = overlap_wanted && par_->world().threads_multiple();
    if (overlap_wanted && !overlap && root_) {
        log::warn(
            "MPI does not provide MPI_THREAD_MULTIPLE: gradients are reduced after backward, "
            "not overlapped with it (parallel.overlap_grad_reduce)");
    }
    helper_ = overlap ? std::make_unique<HelperThread>() : nullptr;
    // bf16's O2 masters in the parameters themselves where the optimizer is replicated
    if (model::masters_in_place(prec_, cfg.partition_optimizer(P_))) gpt_->keep_masters_in_place();
    optimizer_ = dist::paro::make_optimizer(cfg, gpt_->layout(), *par_, prec_, helper_.get(),
                                            gpt_->masters_in_place());
    mem_       = optimizer_->footprint();
    if (!init_dir_.empty()) init_weights_from_model();
}

// train.init_from: the exported model's weights (and routing biases) in place of the initial
// ones, each rank reading its own tensors, where the run starts at its first step. They are
// FP32 masters, as a checkpoint's are: the half-stored tensors' masters keep every bit and the
// parameters computed with are rounded from them. Not where the run resumes from a checkpoint
// (check_inputs leaves init_dir_ empty then): it reads the checkpoint's.
void Trainer::init_weights_from_model() {
    model::InitWeights w;
    dist::check_together(par_->world(), [&] {
        try {
            w = model::load_weights_into(init_dir_, cfg_.model, gpt_->layout(), gpt_->params(),
                                         cfg_.train.upcycle);
        } catch (const InputError& e) {
            input_error("train.init_from: {}", e.what());
        }
    });
    optimizer_->masters_loaded(gpt_->params());
    const bool bias = cfg_.model.moe_every > 0 && cfg_.model.balance_bias_rate > 0;
    if (bias && w.biases_read > 0) gpt_->set_balance_biases(w.biases);
    if (!writer_) return;
    log::info("weights from {}", init_dir_);
    if (!w.upcycled.empty()) {
        log::info(
            "upcycled: block(s) {} from the dense MLP into each of {} experts, routers "
            "initialised",
            fmt::join(w.upcycled, ", "), cfg_.model.n_experts);
    }
    const size_t blocks = w.biases.size();
    if (bias && static_cast<size_t>(w.biases_read) < blocks) {
        log::info("{}: routing biases of {} of the {} MoE blocks; the others start at 0", init_dir_,
                  w.biases_read, blocks);
    } else if (!bias && w.biases_read > 0) {
        log::warn(
            "{} routed with balancing biases; this run (model.balance_bias_rate = 0) routes "
            "without them",
            init_dir_);
    }
}

void Trainer::log_setup() const {
    const ModelConfig& m = cfg_.model;
    log::info("model: {} parameters ({} layers, {} MoE, {} experts top-{}), vocab {}",
              model::make_layout(m).num_params(), m.n_layer,
              m.moe_every > 0 ? m.n_layer / m.moe_every : 0, m.n_experts, m.top_k, m.vocab_size);
    log::info(
        "layout: {} rank(s), expert parallel {} x data parallel {}; {} local experts "
        "per MoE layer",
        P_, par_->ep_size(), par_->edp_size(), m.n_experts / par_->ep_size());
    if (P_ > 1) {
        const dist::CollAlgo ca = par_->coll_algo();
        log::info("{}: {} of {} rank(s); gradient reduction {} ({}), all-to-all {}",
                  par_->reduce_groups() ? "reduction groups" : "nodes", par_->nodes(),
                  par_->world_nodes().per_node, par_->two_level() ? "two-level" : "one-level",
                  ca == dist::CollAlgo::ring               ? "ring"
                  : ca == dist::CollAlgo::halving_doubling ? "halving/doubling"
                                                           : "ring or halving/doubling by size",
                  par_->hierarchical_a2a() ? "hierarchical" : "flat");
        if (par_->a2a_grid() > 1) {
            log::info("expert all-to-all: {} exchange in two phases, rows of {} of {}",
                      par_->hierarchical_a2a() ? "the leaders'" : "the", par_->a2a_grid(),
                      par_->a2a_exchange_ranks());
        }
    }
    if (par_->node_dedup()) log::info("expert all-to-all: each token crosses once per node");
    if (m.moe_every > 0 && m.route_nodes > 0 && par_->ep_size() > 1 &&
        m.route_groups != par_->ep_node_count()) {
        log::warn(
            "model.route_groups = {} but the expert-parallel group spans {} node(s): tokens keep "
            "to {} group(s) of experts, not to {} node(s)",
            m.route_groups, par_->ep_node_count(), m.route_nodes, m.route_nodes);
    }
    if (loader_->blended()) {
        for (int s = 0; s < loader_->num_sources(); ++s) {
            log::info("data: blend {:.1f}% of the windows from {} ({} windows, {} order)",
                      100 * loader_->share(s), cfg_.data.blend[static_cast<size_t>(s)],
                      loader_->source_windows(s),
                      data::shuffle_kind_name(loader_->shuffle_kind(s)));
        }
    }
    // who reads the shards (data.readers, "auto" resolved by the node layout)
    std::string readers;
    if (P_ > 1) {
        readers =
            loader_->readers() == 0
                ? "; every rank reads its slice"
                : fmt::format("; {} reader rank(s) read for their groups{}", loader_->readers(),
                              cfg_.data.readers.automatic() ? " (auto: one a node)" : "");
    }
    log::info(
        "data: {} train tokens ({} windows of {}{}{}), {} val tokens; batch {} x {} "
        "tokens = {} micro-batch(es) of {}{} per rank{}",
        loader_->num_tokens(), loader_->num_windows(), T_ + 1, loader_->blended() ? "" : ", ",
        loader_->blended()
            ? std::string()
            : fmt::format("{} order", data::shuffle_kind_name(loader_->shuffle_kind())),
        ds_.val.num_tokens(), cfg_.train.batch_size, T_, accum_, split_.even() ? "" : "up to ", MB_,
        readers);
    constexpr double kMiB = 1 << 20;
    log::info(
        "memory per rank: parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer "
        "state {:.1f} MiB ({}), bucket buffers {:.1f} MiB",
        mem_.param_bytes / kMiB, mem_.grad_bytes / kMiB, mem_.optim_bytes / kMiB,
        optimizer_->partitioned() ? fmt::format("ParO over {} rank(s)", P_) : "replicated",
        mem_.comm_bytes / kMiB);
    log::info(
        "precision: {}{}", prec_.describe(),
        scaler_.enabled() ? fmt::format(", dynamic loss scale from {}", scaler_.scale()) : "");
    log::info(
        "compute: {} threads per rank (rank 0 on CPUs {}{}), kernels {}, measured peak "
        "{:.1f} GFLOP/s {}",
        compute_pool().size(), cpu_list_text(compute_pool().cpus()),
        allowed_cpus() == launcher_cpus() ? std::string()
                                          : ", its part of " + cpu_list_text(launcher_cpus()) +
                                                " shared with other ranks on this machine",
        kernels::dispatch().describe(), peak_gflops_, kernels::peak_path_name(peak_path_));
    if (P_ > 1) {
        log::info("gradient reduction: {}", optimizer_->overlapped()
                                                ? "overlapped with backward (helper thread)"
                                                : "after backward");
    }
}

// ---- resume ----

// Where the data order resumes. A split of another number of windows than the checkpoint's
// run read (more data prepared, say) has another order, where the old position means nothing:
// it starts its next epoch. A blend's splits are matched by name: one the checkpoint does not
// have starts at its first epoch, and so does everything when one run read a blend and the
// other data.train. Each such case is said in one line.
data::OrderCursor Trainer::resumed_cursor(const TrainerState& ts, const std::string& dir) const {
    data::OrderCursor c = loader_->start_cursor();
    // split s, named `what`, at the checkpoint's (epoch, position) in its `windows` windows
    // (0: not recorded, as in checkpoints written before the count was)
    const auto place = [&](int s, const std::string& what, int64_t epoch, int64_t position,
                           int64_t windows) {
        data::SamplerCursor& sc = c.sources[static_cast<size_t>(s)];
        if (windows == 0 || windows == loader_->source_windows(s)) {
            sc = {epoch, position};
            return;
        }
        if (writer_) {
            log::info(
                "resume: {} holds {} windows, the run of {} read {}: its order starts over them "
                "at epoch {}",
                what, loader_->source_windows(s), dir, windows, epoch + 1);
        }
        sc = {epoch + 1, 0};
    };
    if (!loader_->blended()) {
        if (ts.blend.empty()) {
            place(0, "data.train", ts.epoch, ts.position, ts.windows);
        } else if (writer_) {
            log::info(
                "resume: the run of {} read a blend of {} splits, this one data.train: "
                "its order starts at epoch 0",
                dir, ts.blend.size());
        }
        return c;
    }
    if (ts.blend.empty()) {
        if (writer_) {
            log::info(
                "resume: the run of {} read data.train, this one a blend: each split starts "
                "at epoch 0",
                dir);
        }
        return c;
    }
    for (int s = 0; s < loader_->num_sources(); ++s) {
        const std::string& name = cfg_.data.blend[static_cast<size_t>(s)];
        const auto same_name    = [&](const BlendSourceState& b) { return b.data == name; };
        const auto it           = std::find_if(ts.blend.begin(), ts.blend.end(), same_name);
        if (it == ts.blend.end()) {
            if (writer_) {
                log::info(
                    "resume: data.blend[{}] = \"{}\" is not in the blend of {}: it starts "
                    "at epoch 0",
                    s, name, dir);
            }
            continue;
        }
        c.deficits[static_cast<size_t>(s)] = it->deficit;
        place(s, fmt::format("data.blend[{}] = \"{}\"", s, name), it->epoch, it->position,
              it->windows);
    }
    return c;
}

// Checkpoints: resume from the newest usable one (parameters, optimizer state, data cursor,
// loss scale, skipped steps).
void Trainer::resume() {
    if (opt_.dry_run || (cfg_.checkpoint.every <= 0 && !resume_)) return;
    ckpt_.emplace(cfg_, gpt_->layout(), *optimizer_, *par_);
    if (!resume_) return;
    const std::optional<ResumePoint> rp = ckpt_->load_latest(gpt_->params());
    if (!rp) {
        if (writer_) log::info("no checkpoint in {}: training from the start", ckpt_->root());
        return;
    }
    start_step_            = rp->step;
    const TrainerState& ts = rp->trainer;
    if (writer_) {
        for (const KeyDifference& d : rp->changed)
            log::info("resume: {} = {} from here on, {} in {}", d.key, d.a, d.b, rp->dir);
    }
    loader_->set_cursor(resumed_cursor(ts, rp->dir));
    if (ts.has_loss_scale) {  // absent in checkpoints of FP32 runs' first format
        // a checkpoint of a run without loss scaling holds scale 1: an fp16 run resumed from it
        // starts from its configured scale
        if (rp->loss_scaled || !scaler_.enabled()) {
            scaler_.restore(ts.loss_scale, ts.clean_steps);
        } else if (writer_) {
            log::info("{} was written without loss scaling: the loss scale starts from {}", rp->dir,
                      scaler_.scale());
        }
        optimizer_->set_steps_skipped(ts.steps_skipped);
    }
    if (cfg_.model.balance_bias_rate > 0) {
        if (ts.balance_bias.size() != gpt_->moe_layers().size()) {
            input_error(
                "{}: state.balance_bias holds {} layers, the model has {} MoE layers "
                "(was it written with model.balance_bias_rate = 0?)",
                rp->dir, ts.balance_bias.size(), gpt_->moe_layers().size());
        }
        for (size_t i = 0; i < ts.balance_bias.size(); ++i) {
            if (ts.balance_bias[i].size() != static_cast<size_t>(cfg_.model.n_experts)) {
                input_error("{}: state.balance_bias[{}] holds {} values for {} experts", rp->dir, i,
                            ts.balance_bias[i].size(), cfg_.model.n_experts);
            }
        }
        gpt_->set_balance_biases(ts.balance_bias);
    }
    if (writer_) log::info("resumed from {} (step {})", rp->dir, start_step_);
    // the backends the interrupted run chose for BGL_GEMM=auto: the same results bit for bit
    const GemmChoiceRecord::Loaded g = gemm_choices_.load();
    if (g == GemmChoiceRecord::Loaded::foreign) {
        log::info(
            "{}: made on another CPU, oneDNN version or thread count: ignored, GEMM "
            "backends timed again",
            gemm_choices_.path());
    } else if (g == GemmChoiceRecord::Loaded::loaded && writer_) {
        log::info("GEMM backends of {} shapes from {}", gemm_choices_.saved_shapes(),
                  gemm_choices_.path());
    }
}

// metrics.jsonl: a resumed run's is cut back to its checkpoint and appended to.
void Trainer::open_metrics() {
    const std::string metrics_path = cfg_.train.run_dir + "/metrics.jsonl";
    if (writer_ && start_step_ > 0) trim_metrics(metrics_path, start_step_);
    if (writer_) metrics_.open(metrics_path, start_step_ > 0);
}

void Trainer::emit(const nlohmann::json& j) { metrics_.write(j); }

// ---- step ----

void Trainer::train_step(int64_t step) {
    const auto t0 = Clock::now();
    StepRecord r;
    r.step                  = step;
    r.loss_scale            = scaler_.scale();
    const double local_loss = forward_backward(step, r.aux);
    maybe_inject_kill(step + 1, par_->rank());
    maybe_inject_signal(step + 1, par_->rank());
    r.loss = reduce_loss(local_loss, step);
    PhaseScope optimizer_phase(Phase::optimizer);
    r.lr        = optim::lr_at(step, cfg_.train.steps, cfg_.train.warmup_steps, cfg_.train.lr,
                               cfg_.train.min_lr, cfg_.train.lr_schedule, cfg_.train.decay_steps);
    r.grad_norm = optimizer_->step(gpt_->params_rounded_update(), gpt_->grads(), r.lr, step + 1);
    r.skipped   = optimizer_->skipped();
    scaler_.update(r.skipped);
    end_bias_step(*gpt_, cfg_.model.balance_bias_rate,
                  cfg_.model.balance_bias_update == BiasUpdate::proportional, r.skipped);
    sum_.skipped_steps += r.skipped ? 1 : 0;
    optimizer_phase.stop();
    const double dt = seconds_since(t0);
    gemm_choices_.save_if_grown();
    window_time_ += dt;
    window_wait_ += optimizer_->reduce_wait_s();
    ++window_steps_;
    sum_.final_loss = r.loss;
    if (opt_.data_wait_s) *opt_.data_wait_s = loader_->wait_seconds();
    if (opt_.on_step) opt_.on_step(step, dt, optimizer_->reduce_wait_s());

    const bool last = step + 1 == cfg_.train.steps;
    if (ckpt_ && cfg_.checkpoint.every > 0 && ((step + 1) % cfg_.checkpoint.every == 0 || last)) {
        save_checkpoint(step);
    } else if (stop_ && !last && !opt_.dry_run) {
        // stopped by a signal: a checkpoint here, also where checkpoint.every = 0 (every rank
        // agreed on the stop in reduce_loss, so they build the checkpointer together)
        if (!ckpt_) ckpt_.emplace(cfg_, gpt_->layout(), *optimizer_, *par_);
        save_checkpoint(step);
    }
    if ((step + 1) % cfg_.train.log_every == 0 || last || step == 0 || r.skipped || stop_)
        log_step(r);
    if (cfg_.train.eval_every > 0 && (step + 1) % cfg_.train.eval_every == 0 && !last &&
        !opt_.dry_run) {
        evaluate_at(step + 1);
    }
}

// The step's micro-batches: forward, and backward with the loss scale; the reduction of the
// gradients starts during the last backward. Returns this rank's share of the step's mean loss
// times P; aux: the step's aux loss. An uneven split weighs each micro-batch by its rows
// (config/batch_split.h); an even one by 1 / accum, as it always has.
double Trainer::forward_backward(int64_t step, double& aux) {
    struct Release {  // the compute weights held below, however the loop ends
        model::GPT& gpt;
        ~Release() { gpt.release_compute_weights(); }
    } release{*gpt_};
    gpt_->zero_grad();
    // Set before backward: with overlap, buckets are unscaled on the helper thread meanwhile.
    optimizer_->set_loss_scale(scaler_.scale());
    const auto grads_ready = [this](size_t from) { optimizer_->grads_ready(from); };
    const bool even        = split_.even();
    const int rank         = par_->rank();
    double loss            = 0;
    for (int64_t micro = 0; micro < accum_; ++micro) {
        int rows = 0;
        {
            PhaseScope data_phase(Phase::data);
            rows = loader_->next(inputs_.data(), targets_.data());
        }
        moe::RoutingContext ctx{cfg_.train.seed, step * accum_ + micro, true};
        if (!even) {
            ctx.token0 = split_.offset(rank, micro) * T_;
            ctx.tokens = split_.total(micro) * T_;
        }
        gpt_->set_routing_context(ctx);
        // the weights of this micro-batch's mean CE and of the aux losses (one number over the
        // micro-step on all ranks); forward is told the CE's, so that the LM head may form its
        // gradient while its logits are in cache (model/gpt.h)
        float ce_scale = 0, aux_scale = 0;
        if (even) {
            ce_scale = aux_scale = static_cast<float>(scaler_.scale()) / static_cast<float>(accum_);
        } else {
            ce_scale  = static_cast<float>(scaler_.scale() * split_.weight(rank, micro));
            aux_scale = static_cast<float>(scaler_.scale() * split_.fraction(micro));
        }
        const double fwd = gpt_->forward(inputs_.data(), targets_.data(), rows, T_, ce_scale);
        // the step's later micro-batches compute from the weights this forward rounded
        if (micro == 0 && accum_ > 1) gpt_->hold_compute_weights();
        add_choice_loads(*gpt_);
        if (even) {
            loss += fwd / static_cast<double>(accum_);
            aux += gpt_->aux_loss() / static_cast<double>(accum_);
        } else {
            loss += fwd * split_.weight(rank, micro);
            aux += gpt_->aux_loss() * split_.fraction(micro);
        }
        if (micro + 1 < accum_) {
            gpt_->backward(ce_scale, aux_scale);
        } else {  // the last backward of the step: reduce what it has finished meanwhile
            optimizer_->begin_reduction(gpt_->grads());
            gpt_->backward(ce_scale, aux_scale, grads_ready);
        }
    }
    return loss;
}

// The mean loss over ranks. The step's one small collective also tells whether every rank's
// checkpoint write is done, and then finalizes that checkpoint, and whether any rank was
// signalled to stop (then all stop after this step). A loss that is not finite ends the run.
double Trainer::reduce_loss(double local_loss, int64_t step) {
    double sums[3] = {local_loss, ckpt_ ? ckpt_->busy() : 0.0, stop_signal() != 0 ? 1.0 : 0.0};
    if (P_ > 1) par_->world().allreduce_sum(std::span<double>(sums, 3));
    stop_             = sums[2] > 0;
    const double loss = sums[0] / P_;
    if (ckpt_ && ckpt_->pending() && sums[1] == 0) ckpt_->finalize();
    if (!std::isfinite(loss)) {
        throw InternalError(fmt::format(
            "training diverged at step {}: loss = {} (lower train.lr or raise warmup_steps)",
            step + 1, loss));
    }
    return loss;
}

void Trainer::save_checkpoint(int64_t step) {
    const data::OrderCursor& c = loader_->cursor();
    // a split's cursor, its windows and the kind of its order
    const auto split_state = [&](int s) {
        const data::SamplerCursor& sc = c.sources[static_cast<size_t>(s)];
        return nlohmann::json{{"epoch", sc.epoch},
                              {"position", sc.position},
                              {"windows", loader_->source_windows(s)},
                              {"order", data::shuffle_kind_name(loader_->shuffle_kind(s))}};
    };
    nlohmann::json sampler = split_state(0);
    if (loader_->blended()) {
        nlohmann::json splits = nlohmann::json::array();
        for (int s = 0; s < loader_->num_sources(); ++s) {
            nlohmann::json& split = splits.emplace_back(split_state(s));
            split["data"]         = cfg_.data.blend[static_cast<size_t>(s)];
            split["deficit"]      = c.deficits[static_cast<size_t>(s)];
        }
        sampler = {{"blend", std::move(splits)}};
    }
    // All randomness of a step (gate noise and jitter) is drawn from Rng(seed, micro-step
    // index), so the RNG state is the seed and the count of micro-steps taken.
    nlohmann::json state = {
        {"sampler", std::move(sampler)},
        {"rng", {{"seed", cfg_.train.seed}, {"micro_steps", (step + 1) * accum_}}},
        {"loss_scale", {{"scale", scaler_.scale()}, {"clean_steps", scaler_.clean_steps()}}},
        {"steps_skipped", optimizer_->steps_skipped()}};
    // the routing bias is replicated: every rank holds the same, rank 0's manifest keeps it
    if (cfg_.model.balance_bias_rate > 0) state["balance_bias"] = gpt_->balance_biases();
    ckpt_->save(step + 1, state, std::as_const(*gpt_).params());
}

// One metrics line (throughput over the steps since the last one) and the progress line.
void Trainer::log_step(const StepRecord& r) {
    const int64_t step = r.step;
    const double tps   = static_cast<double>(tokens_per_step_ * window_steps_) / window_time_;
    const double mfu   = peak_gflops_ > 0 ? tps * flops_per_token_ / (P_ * peak_gflops_ * 1e9) : 0;
    nlohmann::json j   = {{"step", step + 1},
                          {"loss", r.loss},
                          {"lr", r.lr},
                          {"grad_norm", r.grad_norm},
                          {"tokens_per_s", tps},
                          {"mfu", mfu},
                          {"elapsed_s", seconds_since(t_start_)}};
    if (P_ > 1) j["grad_reduce_wait_s"] = window_wait_ / static_cast<double>(window_steps_);
    // passes over the training data so far: epochs done plus the part of the current one
    const data::OrderCursor& c = loader_->cursor();
    const auto epochs          = [&](int s) {
        const data::SamplerCursor& sc = c.sources[static_cast<size_t>(s)];
        return static_cast<double>(sc.epoch) +
               static_cast<double>(sc.position) / static_cast<double>(loader_->source_windows(s));
    };
    if (!loader_->blended()) {
        j["data_epochs"] = epochs(0);
    } else {
        nlohmann::json e = nlohmann::json::array();
        for (int s = 0; s < loader_->num_sources(); ++s) e.push_back(epochs(s));
        j["data_epochs"] = std::move(e);
    }
    if (scaler_.enabled()) j["loss_scale"] = r.loss_scale;
    if (scaler_.enabled() || r.skipped) j["skipped"] = r.skipped;
    if (step == 0) {
        j["param_bytes"] = mem_.param_bytes;
        j["grad_bytes"]  = mem_.grad_bytes;
        j["optim_bytes"] = mem_.optim_bytes;
    }
    if (!gpt_->moe_layers().empty()) {
        j["aux_loss"] = r.aux;
        add_routing_metrics(j, *gpt_, cfg_.model.n_experts, cfg_.model.balance_bias_rate > 0);
    }
    emit(j);
    sum_.tokens_per_s = tps;
    const double eta  = (seconds_since(t_train_) / static_cast<double>(step + 1)) *
                       static_cast<double>(cfg_.train.steps - step - 1);
    progress_.update(step + 1, cfg_.train.steps, r.loss, tps, mfu, eta);
    window_time_  = 0;
    window_wait_  = 0;
    window_steps_ = 0;
}

// ---- evaluation ----

// Validation loss after `step` steps, with inference routing (plain top-k); its collectives are
// kept out of the steps' communication counts.
double Trainer::evaluate_at(int64_t step) {
    gpt_->set_routing_context(moe::RoutingContext{});
    const dist::CommTally c0 = dist::comm_tally();
    const EvalResult r       = evaluate(*gpt_, ds_.val, MB_, cfg_.train.eval_batches, par_);
    gemm_choices_.save_if_grown();
    emit({{"step", step},
          {"val_loss", r.loss},
          {"val_ppl", std::exp(r.loss)},
          {"val_tokens", r.tokens},
          {"elapsed_s", seconds_since(t_start_)}});
    progress_.message(fmt::format("step {:>6} | val loss {:.4f} | val ppl {:.2f}", step, r.loss,
                                  std::exp(r.loss)));
    eval_comm_ = eval_comm_ + (dist::comm_tally() - c0);
    return r.loss;
}

// ---- finish ----

TrainSummary Trainer::finish() {
    if (ckpt_) ckpt_->close();
    emit(resource_report(dist::comm_tally() - comm_start_ - eval_comm_,
                         std::max<int64_t>(cfg_.train.steps - start_step_, 1), *par_));
    report_checkpoints();
    sum_.steps            = cfg_.train.steps;
    sum_.data_wait_s      = loader_->wait_seconds();
    sum_.final_loss_scale = scaler_.scale();
    sum_.head_recomputes  = gpt_->head_recomputes();
    if (opt_.dry_run) return sum_;
    sum_.final_val_loss = evaluate_at(cfg_.train.steps);
    report_peak_rss();
    // the model's FP32 master weights, as a checkpoint's "param/" holds them: not the rounded
    // values of the half-stored tensors (ParO's all-gathered parameters, fp16's)
    Buffer<float> masters(gpt_->n_floats());
    std::copy(gpt_->params(), gpt_->params() + gpt_->n_floats(), masters.data());
    optimizer_->masters_over(masters.data());
    const Buffer<float> full = gather_full_params(*gpt_, masters.data(), par_);
    sum_.model_dir           = cfg_.train.run_dir + "/model";
    if (root_) write_outputs(full);
    return sum_;
}

// After a signal: the checkpoint of the step the ranks stopped at is written out and committed,
// the metrics say so; no final evaluation, export or samples (a resumed run makes them).
TrainSummary Trainer::finish_stopped(int64_t steps_done) {
    // the signal that stopped the job: SIGINT if any rank received it, else SIGTERM, else SIGUSR1
    int64_t got[3] = {stop_signal() == SIGINT, stop_signal() == SIGTERM, stop_signal() == SIGUSR1};
    if (P_ > 1) par_->world().allreduce_sum(std::span<int64_t>(got, 3));
    sum_.stop_signal = got[0] ? SIGINT : got[1] ? SIGTERM : got[2] ? SIGUSR1 : stop_signal();
    if (ckpt_) {
        ckpt_->close();
        sum_.stop_checkpoint = ckpt_->last_committed();
    }
    emit({{"step", steps_done},
          {"stopped_by", signal_name(sum_.stop_signal)},
          {"checkpoint", sum_.stop_checkpoint},
          {"elapsed_s", seconds_since(t_start_)}});
    report_checkpoints();
    progress_.finish();
    sum_.steps            = steps_done;
    sum_.data_wait_s      = loader_->wait_seconds();
    sum_.final_loss_scale = scaler_.scale();
    return sum_;
}

void Trainer::report_checkpoints() {
    if (!ckpt_ || cfg_.checkpoint.every <= 0) return;
    emit({{"step", cfg_.train.steps},
          {"checkpoint_stall_s", ckpt_->stall_seconds()},
          {"checkpoint_write_s", ckpt_->write_seconds()},
          {"checkpoint_bytes", ckpt_->bytes_written()}});
    if (writer_) {
        log::info("checkpoints: {} (the step loop waited {:.3f} s for them)",
                  ckpt_->last_committed().empty() ? "none written" : ckpt_->last_committed(),
                  ckpt_->stall_seconds());
    }
}

// Every rank's peak resident memory and what its GEMMs' packing buffers hold (grow-only, so
// their peak; the planner's gemm_packing), into metrics.jsonl and the log. Collective.
void Trainer::report_peak_rss() {
    std::vector<int64_t> rss(static_cast<size_t>(P_)), packing(rss.size());
    const int64_t mine[2] = {static_cast<int64_t>(peak_rss_bytes()),
                             static_cast<int64_t>(kernels::gemm::pack_buffer_bytes())};
    std::vector<int64_t> both(2 * rss.size());
    par_->world().allgather(mine, sizeof(mine), both.data());
    for (size_t r = 0; r < rss.size(); ++r) {
        rss[r]     = both[2 * r];
        packing[r] = both[2 * r + 1];
    }
    emit({{"step", cfg_.train.steps}, {"peak_rss_bytes", rss}, {"gemm_packing_bytes", packing}});
    if (root_) {
        std::string mib;
        for (const int64_t b : rss) mib += fmt::format("{}{}", mib.empty() ? "" : ", ", b >> 20);
        log::info(
            "peak resident memory per rank (VmHWM): {} MiB (GEMM packing buffers {:.2f} MiB "
            "on rank 0)",
            mib, static_cast<double>(packing[0]) / 1048576);
    }
    if (par_->ep_size() > 1) {  // rank 0's expert all-to-alls over the run (token_dispatcher.h)
        const moe::A2aSeconds a = moe::a2a_seconds();
        emit({{"step", cfg_.train.steps},
              {"a2a_raw_s", a.raw},
              {"a2a_exposed_s", a.exposed},
              {"a2a_pieces", a.pieces},
              {"a2a_beside_shared", a.beside_shared}});
        if (root_) {
            log::info(
                "expert all-to-all (rank 0): {:.3f} s in the exchanges, {:.3f} s exposed{}{}",
                a.raw, a.exposed, a.pieces > 0 ? fmt::format(", {} piece exchanges", a.pieces) : "",
                a.beside_shared > 0
                    ? fmt::format(", {} dispatches beside the shared experts", a.beside_shared)
                    : "");
        }
    }
    if (par_->ep_node_count() > 1) {  // what the expert all-to-alls sent across nodes, all ranks
        int64_t away = static_cast<int64_t>(dist::inter_node_a2a_bytes());
        par_->world().allreduce_sum(std::span<int64_t>(&away, 1));
        emit({{"step", cfg_.train.steps}, {"a2a_inter_node_bytes", away}});
        if (root_) {
            log::info("expert all-to-all across nodes: {:.3f} MiB over the run (all ranks){}",
                      static_cast<double>(away) / (1 << 20),
                      par_->node_dedup() ? ", each token once per node" : "");
        }
    }
}

// Rank 0: the exported model, the charts, the closing log lines and the samples.
void Trainer::write_outputs(const Buffer<float>& full) {
    const ModelConfig& m = cfg_.model;
    model::save_model(sum_.model_dir, m, full.data(), false,
                      ds_.has_tokenizer ? cfg_.data.tokenizer : std::string(),
                      {{"step", std::to_string(cfg_.train.steps)},
                       {"val_loss", fmt::format("{:.9g}", sum_.final_val_loss)}},
                      m.balance_bias_rate > 0 ? gpt_->balance_biases() : moe::BalanceBiases{});
    metrics_.close();
    report::write_charts(cfg_.train.run_dir, report::render_run_charts(cfg_.train.run_dir));
    progress_.finish();
    log::info("final val loss {:.4f} nats/token (ppl {:.2f}) after {} steps, {:.1f} s",
              sum_.final_val_loss, std::exp(sum_.final_val_loss), sum_.steps,
              seconds_since(t_start_));
    if (sum_.val_unigram_entropy >= 0) {
        const double below = sum_.val_unigram_entropy - sum_.final_val_loss;
        log::info("val unigram entropy {:.4f} nats/token: the model is {:.3f} nats {} it",
                  sum_.val_unigram_entropy, std::abs(below), below >= 0 ? "below" : "above");
    }
    log::info("run directory {}: config.toml metrics.jsonl loss.svg{} model/", cfg_.train.run_dir,
              gpt_->moe_layers().empty() ? "" : " expert_load.svg");
    if (!opt_.quiet && ds_.has_tokenizer && cfg_.sample.n_samples > 0) {
        print_samples(m, full.data(), cfg_.data.tokenizer, cfg_.sample, prompts_source(cfg_),
                      m.balance_bias_rate > 0 ? gpt_->balance_biases() : moe::BalanceBiases{});
    }
}

}  // namespace

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opt,
                          dist::ParallelContext* par) {
    return Trainer(cfg, opt, par).run();
}

}  // namespace bagualu::train

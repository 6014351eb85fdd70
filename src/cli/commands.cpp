#include "cli/commands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "bench/comm_bench.h"
#include "bench/kernels_bench.h"
#include "bench/train_bench.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proc_memory.h"
#include "core/stop_signal.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "data/file_io.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/token_shards.h"
#include "dist/comm/checks.h"
#include "dist/comm/comm.h"
#include "dist/node_cpus.h"
#include "dist/parallel.h"
#include "io/checkpoint/checkpoint.h"
#include "model/gpt.h"
#include "model/model_io.h"
#include "model/precision.h"
#include "plan/memory_check.h"
#include "report/metrics.h"
#include "train/checkpointing.h"
#include "train/evaluate.h"
#include "train/samples.h"
#include "train/trainer.h"

namespace bagualu::cli {

namespace fs = std::filesystem;

static TrainConfig resolve_config(const CommonArgs& a) {
    return a.config.empty() ? default_config(a.overrides) : load_config(a.config, a.overrides);
}

int cmd_prepare(const CommonArgs& a, bool force, const std::string& tokenizer_arg) {
    const TrainConfig cfg = resolve_config(a);
    // --tokenizer: a SentencePiece model, or an exported model or run directory holding one
    std::string tokenizer_from = tokenizer_arg;
    if (!tokenizer_arg.empty() && fs::is_directory(tokenizer_arg)) {
        tokenizer_from = model::model_dir_of(tokenizer_arg) + "/tokenizer.model";
        if (!fs::exists(tokenizer_from))
            input_error("--tokenizer {}: the model has no tokenizer.model", tokenizer_arg);
    }
    data::PrepareOptions o;
    o.corpus            = cfg.data.corpus;
    o.train_path        = cfg.data.train;
    o.val_path          = cfg.data.val;
    o.tokenizer_path    = cfg.data.tokenizer;
    o.text_key          = cfg.data.text_key;
    o.tokenizer_entries = cfg.data.tokenizer_entries;
    o.shard_tokens      = cfg.data.shard_tokens;
    o.vocab_size        = cfg.model.vocab_size;
    o.val_fraction      = cfg.data.val_fraction;
    o.seed              = cfg.train.seed;
    o.tokenizer_from    = tokenizer_from;
    if (!force && data::outputs_up_to_date(o)) {
        log::info("prepare: {} and {} are up to date (--force rebuilds them)", cfg.data.train,
                  cfg.data.val);
        return 0;
    }
    o.progress                  = [](const std::string& what) { log::info("prepare: {}", what); };
    const data::PrepareResult r = data::prepare_corpus(o);
    log::info("prepare: {} entries -> {} train / {} val; {} train tokens, {} val tokens",
              r.n_entries, r.n_train_entries, r.n_val_entries, r.train_tokens, r.val_tokens);
    log::info(
        "prepare: val unigram entropy {:.4f} nats/token (the best a context-blind model "
        "can do)",
        r.val_unigram_entropy);
    auto files = [](const std::string& path, const std::vector<std::string>& written) {
        return written.size() == 1 && written[0] == path
                   ? path
                   : fmt::format("{} ({} shard{})", path, written.size(),
                                 written.size() == 1 ? "" : "s");
    };
    log::info("prepare: wrote {}, {}, {}", files(o.train_path, r.train_files),
              files(o.val_path, r.val_files), o.tokenizer_path);
    return 0;
}

// The process layout of cfg on world (collective), with the config's collective settings.
static std::unique_ptr<dist::ParallelContext> make_parallel(const TrainConfig& cfg,
                                                            dist::Comm& world) {
    auto par = std::make_unique<dist::ParallelContext>(
        world, cfg.parallel.expert_parallel, cfg.parallel.hierarchical_a2a,
        cfg.parallel.ranks_per_node, cfg.parallel.two_level, cfg.parallel.reduce_group);
    par->set_node_dedup(cfg.node_dedup(par->ep_node_count()));
    par->set_collectives(cfg.parallel.collectives);
    par->set_a2a_grid(cfg.parallel.a2a_grid);
    return par;
}

// Free bytes of the file system that holds path, or would (its nearest existing ancestor);
// UINT64_MAX when that cannot be told: unreadable, a file system without a size (/proc), or a
// directory this process cannot write (the checkpointer names that at start-up).
static uint64_t free_disk_bytes(const std::string& path) {
    fs::path p = fs::absolute(fs::path(path)).lexically_normal();
    std::error_code ec;
    while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
    const fs::space_info s = fs::space(p, ec);
    if (ec || s.capacity == 0 || ::access(p.c_str(), W_OK) != 0) return UINT64_MAX;
    return static_cast<uint64_t>(s.available);
}

// What the run will need, before the model is built (plan/memory_check.h), from the planner's
// footprint of its layout; every rank ends with the message if it cannot fit:
// - train.check_memory: the bytes per rank times the ranks on this machine (`node`) against what
//   they may allocate;
// - the checkpoints (checkpoint.every > 0): one must fit in the free space of the checkpoint
//   directory's file system (rank 0's view: a shared file system), and a warning when the
//   checkpoints kept may not.
// The data shards' headers are read by rank 0 alone (every rank opening them at start-up would
// load the file system for nothing). A layout the planner cannot count is not checked (the run's
// own checks have passed). Test hooks: BAGUALU_FAULT_MEMORY_LEFT=<bytes> stands for what this
// machine's ranks may allocate, BAGUALU_FAULT_DISK_FREE=<bytes> for the free space.
static void check_run_resources(const TrainConfig& cfg, const std::string& config_path,
                                dist::Comm& world, dist::Comm& node) {
    const int ranks_here = node.size();
    const int per_node = cfg.parallel.ranks_per_node > 0 ? cfg.parallel.ranks_per_node : ranks_here;
    uint64_t order     = world.rank() == 0 ? plan::data_order_bytes(cfg) : 0;
    world.broadcast(&order, sizeof order, 0);
    // the pool the trainer builds: train.threads, else one per CPU of this rank's part
    const int threads =
        cfg.train.threads > 0 ? cfg.train.threads : static_cast<int>(allowed_cpus().size());
    std::optional<plan::Footprint> fp;
    try {
        fp = plan::run_footprint(cfg, world.size(), per_node, threads, order);
    } catch (const InputError&) {
        return;  // the same on every rank
    }
    std::string warning;
    dist::check_together(world, [&] {
        if (world.rank() == 0 && cfg.checkpoint.every > 0) {
            uint64_t free = free_disk_bytes(cfg.checkpoint_dir());
            if (const char* f = std::getenv("BAGUALU_FAULT_DISK_FREE"))
                free = std::strtoull(f, nullptr, 10);
            const model::PrecisionPolicy prec = model::PrecisionPolicy::from_config(cfg.precision);
            const double one = plan::checkpoint_bytes(fp->params_full, prec.moment_bytes());
            warning          = plan::check_checkpoint_space(cfg, one, cfg.checkpoint_dir(), free);
        }
        if (!cfg.train.check_memory) return;
        MemoryLeft left = memory_left();
        if (const char* f = std::getenv("BAGUALU_FAULT_MEMORY_LEFT")) {
            left = {std::strtoull(f, nullptr, 10), "BAGUALU_FAULT_MEMORY_LEFT"};
        }
        plan::check_memory_fits(
            fp->memory, config_path.empty() ? "the default config" : config_path, ranks_here, left);
    });
    if (!warning.empty()) log::warn("{}", warning);
}

// The compute pool on this rank's part of the CPUs the launcher gave it, when it gave the same
// ones to other ranks on this machine (`node`, dist/node_cpus.h); a warning when train.threads
// asks for more threads than that part has.
static void share_node_cpus(const TrainConfig& cfg, dist::Comm& world, dist::Comm& node) {
    const std::vector<int> mine  = launcher_cpus();
    const std::vector<int> share = dist::node_cpu_share(node, mine);
    if (share == mine) return;
    set_allowed_cpus(share);
    if (world.rank() == 0 && cfg.train.threads > static_cast<int>(share.size())) {
        log::warn(
            "train.threads = {}: this rank's part of the CPUs its launcher gave it and other ranks "
            "on this machine is {} CPU(s) ({}), so its threads will wait for each other's cores: "
            "expected train.threads = 0 (one per CPU of the part) or at most {}",
            cfg.train.threads, share.size(), cpu_list_text(share), share.size());
    }
}

int cmd_train(const CommonArgs& a, const std::string& run_dir, bool force, bool resume,
              dist::Comm& world) {
    TrainConfig cfg;
    dist::check_together(world, [&] {
        cfg = resolve_config(a);
        if (!run_dir.empty()) cfg.train.run_dir = run_dir;
        if (resume) cfg.checkpoint.resume = Resume::automatic;
        validate_layout(cfg, world.size());
        validate_micro_batch(cfg, world.size());
    });
    if (world.rank() == 0) {
        for (const std::string& w : ineffective_settings(cfg)) log::warn("{}", w);
    }
    const std::unique_ptr<dist::Comm> node = world.split_shared();  // this machine's ranks
    share_node_cpus(cfg, world, *node);
    const auto par_ptr         = make_parallel(cfg, world);
    dist::ParallelContext& par = *par_ptr;
    check_run_resources(cfg, a.config, world, *node);
    train::TrainOptions opt;
    opt.force = force;
    install_stop_handlers(dist::launcher_owns_termination());
    const train::TrainSummary s = train::run_training(cfg, opt, &par);
    if (s.stop_signal == 0) return 0;
    // stopped by a signal after a checkpoint: the status a shell gives a process the signal
    // ended (128 + its number), so a job script does not take the run for finished
    if (world.rank() == 0) {
        std::fflush(stdout);
        fmt::print(stderr, "bagualu: stopped by {} after step {} of {}: {}\n",
                   signal_name(s.stop_signal), s.steps, cfg.train.steps,
                   s.stop_checkpoint.empty()
                       ? std::string("no checkpoint")
                       : "checkpoint " + s.stop_checkpoint + " (continue with --resume)");
    }
    return 128 + s.stop_signal;
}

int cmd_eval(const CommonArgs& a, const std::string& model_dir_arg, const std::string& val_path) {
    const std::string model_dir = model::model_dir_of(model_dir_arg);
    model::LoadedModel lm       = model::load_model(model_dir);
    // Evaluation settings: --config if given, else the run's own config.toml beside model/.
    CommonArgs ca          = a;
    const fs::path run_cfg = fs::path(model_dir).parent_path() / "config.toml";
    if (ca.config.empty() && fs::exists(run_cfg)) ca.config = run_cfg.string();
    TrainConfig cfg = resolve_config(ca);
    // the model is the exported one: a --set model.* that disagrees with its config.json would
    // be ignored
    TrainConfig exported = cfg;
    exported.model       = lm.config;
    for (const KeyDifference& d : differing_keys(cfg, exported, "model")) {
        for (const std::string& o : a.overrides) {
            if (o.rfind(d.key + "=", 0) == 0) {
                input_error(
                    "eval: --set {}: the model's config.json has {} = {} (the exported "
                    "model is evaluated as it is)",
                    o, d.key, d.b);
            }
        }
    }
    cfg.model = lm.config;
    if (!val_path.empty()) cfg.data.val = val_path;
    validate_micro_batch(cfg, 1);
    set_compute_threads(cfg.train.threads);
    const data::TokenShards val =
        data::TokenShards::open(cfg.data.val, "data.val", cfg.model.vocab_size, cfg.model.seq_len);
    const int MB = static_cast<int>(cfg.micro_batch());
    // in the precision the run trained with (config.toml's [precision]), so its val loss repeats
    model::GPT gpt(cfg.model, MB, nullptr, 1, model::PrecisionPolicy::from_config(cfg.precision));
    std::copy(lm.params.data(), lm.params.data() + lm.params.size(), gpt.params());
    gpt.set_balance_biases(lm.biases);
    const train::EvalResult r = train::evaluate(gpt, val, MB, cfg.train.eval_batches);
    fmt::print("val_loss {:.6f}  perplexity {:.3f}  tokens {}  ({})\n", r.loss, std::exp(r.loss),
               r.tokens, cfg.data.val);
    return 0;
}

int cmd_sample(const SampleArgs& a) {
    const std::string model_dir = model::model_dir_of(a.model_dir);
    model::LoadedModel lm       = model::load_model(model_dir);
    const std::string tok       = (fs::path(model_dir) / "tokenizer.model").string();
    if (!fs::exists(tok)) input_error("{}: not found (sampling needs the tokenizer)", tok);
    data::check_tokenizer_vocab(tok, lm.config.vocab_size);
    SampleSection s;
    if (!a.prompts.empty()) s.prompts = a.prompts;
    if (a.n >= 0) s.n_samples = a.n;
    if (a.max_new_tokens > 0) s.max_new_tokens = a.max_new_tokens;
    if (a.top_k >= 0) s.top_k = a.top_k;
    if (a.temperature >= 0) s.temperature = a.temperature;
    if (a.seed) s.seed = *a.seed;
    train::print_samples(lm.config, lm.params.data(), tok, s,
                         a.prompts.empty() ? "the default prompts" : "--prompt", lm.biases);
    return 0;
}

int cmd_export(const std::string& from, const std::string& out, const std::string& dtype) {
    if (dtype != "f32" && dtype != "bf16") input_error("--dtype {}: expected f32 or bf16", dtype);
    const std::string model_dir = model::model_dir_of(from);
    model::LoadedModel lm       = model::load_model(model_dir);
    if (fs::exists(out) && !fs::is_empty(out)) {
        input_error("{}: exists and is not empty (nothing is overwritten; choose another --out)",
                    out);
    }
    model::save_model(out, lm.config, lm.params.data(), dtype == "bf16",
                      (fs::path(model_dir) / "tokenizer.model").string(),
                      {{"exported_from", model_dir}}, lm.biases);
    log::info("export: wrote {}/model.safetensors ({}), config.json, tokenizer.model", out, dtype);
    return 0;
}

int cmd_export_checkpoint(const std::string& dir, const std::string& out,
                          const std::string& dtype) {
    if (dtype != "f32" && dtype != "bf16") input_error("--dtype {}: expected f32 or bf16", dtype);
    if (fs::exists(out) && !fs::is_empty(out)) {
        input_error("{}: exists and is not empty (nothing is overwritten; choose another --out)",
                    out);
    }
    const train::CheckpointModel cm = train::read_checkpoint_model(dir);
    const std::string tok =
        fs::exists(cm.cfg.data.tokenizer) ? cm.cfg.data.tokenizer : std::string();
    model::save_model(out, cm.cfg.model, cm.params.data(), dtype == "bf16", tok,
                      {{"exported_from", dir}, {"step", std::to_string(cm.step)}}, cm.biases);
    log::info("export: wrote {}/model.safetensors ({}) of step {}, config.json{}", out, dtype,
              cm.step,
              tok.empty() ? " (tokenizer not found: " + cm.cfg.data.tokenizer + ")"
                          : ", tokenizer.model");
    return 0;
}

int cmd_inspect(const std::string& dir_arg) {
    std::string dir = dir_arg;
    if (!fs::exists(fs::path(dir) / io::ckpt::kManifestName)) {
        const std::vector<std::string> all = io::ckpt::list_complete(dir);
        if (all.empty())
            input_error(
                "{}: neither a checkpoint (manifest.json) nor a directory of complete checkpoints",
                dir);
        fmt::print("{}: {} complete checkpoint(s); the newest:\n", dir, all.size());
        dir = all.front();
    }
    const io::ckpt::Manifest m = io::ckpt::read_manifest(dir);
    const TrainConfig cfg      = config_from_text(m.config_toml, dir + "/manifest.json (config)");
    const ModelConfig& mc      = cfg.model;
    fmt::print("checkpoint {}\n  step {}  layout: {} rank(s), expert parallel {}\n", dir, m.step,
               m.ranks, m.expert_parallel);
    fmt::print(
        "  model: {} layers, d_model {}, {} experts top-{} every {} layer(s), vocab {}, "
        "seq_len {}\n",
        mc.n_layer, mc.d_model, mc.n_experts, mc.top_k, mc.moe_every, mc.vocab_size, mc.seq_len);
    fmt::print("  state: {}\n", m.state.dump());
    std::map<std::string, int64_t> per_kind;  // elements per kind
    std::set<std::string> tensors;
    int bad        = 0;
    uint64_t total = 0;
    fmt::print("  {:<28} {:>12} {:>7}  {}\n", "file", "bytes", "slices", "status");
    for (const io::ckpt::FileRecord& f : m.files) {
        const fs::path p = fs::path(dir) / f.name;
        std::error_code ec;
        const uintmax_t size = fs::file_size(p, ec);
        std::string status;
        if (ec)
            status = "MISSING";
        else if (size != f.bytes)
            status = fmt::format("TRUNCATED ({} bytes on disk)", size);
        else if (io::ckpt::file_xxh64(p.string()) != f.xxh64)
            status = "CHECKSUM MISMATCH";
        else
            status = "ok (xxh64)";
        bad += status.rfind("ok", 0) != 0;
        total += f.bytes;
        for (const io::ckpt::SliceRecord& s : f.slices) {
            tensors.insert(s.tensor);
            per_kind[s.tensor.substr(0, s.tensor.find('/'))] += s.end - s.begin;
        }
        fmt::print("  {:<28} {:>12} {:>7}  {}\n", f.name, f.bytes, f.slices.size(), status);
    }
    fmt::print("  {} file(s), {:.2f} MiB, {} logical tensors", m.files.size(),
               static_cast<double>(total) / (1 << 20), tensors.size());
    for (const auto& [kind, n] : per_kind) fmt::print(", {} {} values", kind, n);
    fmt::print(
        "\n  {}\n",
        bad == 0 ? "all files pass their size and checksum checks"
                 : fmt::format("{} file(s) FAIL their checks: this checkpoint is not usable", bad));
    if (bad != 0) return 1;
    // then every tensor read whole, as a resume reads it: files can pass their hashes and still
    // not load (a manifest edited with its hashes)
    const std::vector<std::string> unreadable = train::unreadable_tensors(dir);
    for (const std::string& line : unreadable) fmt::print("  {}\n", line);
    fmt::print("  {}\n",
               unreadable.empty()
                   ? "every tensor its config implies reads whole"
                   : fmt::format("{} tensor(s) FAIL to read: this checkpoint is not usable",
                                 unreadable.size()));
    return unreadable.empty() ? 0 : 1;
}

int cmd_report(const std::string& run_dir) {
    // every chart drawn before any is written: a log that fails one chart leaves none (it left
    // loss.svg new beside the earlier run's other charts)
    const std::vector<report::ChartFile> charts = report::render_run_charts(run_dir);
    report::write_charts(run_dir, charts);
    for (const report::ChartFile& c : charts) log::info("report: wrote {}/{}", run_dir, c.name);
    return 0;
}

int cmd_report_compare(const ReportCompareArgs& a) {
    if (a.metric != "val_loss" && a.metric != "loss") {
        input_error("--metric {}: expected val_loss (validation loss) or loss (train loss)",
                    a.metric);
    }
    if (!a.labels.empty() && a.labels.size() != a.run_dirs.size()) {
        input_error(
            "--labels: got {} label(s) for {} run directories (expected one per --compare "
            "directory, comma-separated)",
            a.labels.size(), a.run_dirs.size());
    }
    if (a.out.empty())
        input_error("report --compare: --out FILE.svg is required (the chart to write)");
    // the chart replaces what is at --out: only a chart (an input's metrics.jsonl was lost so)
    if (fs::path(a.out).extension() != ".svg")
        input_error("report --compare: --out {}: expected a file name ending in .svg", a.out);
    if (fs::is_directory(a.out))
        input_error("report --compare: --out {} is a directory, expected FILE.svg", a.out);
    std::vector<report::RunCurve> curves;
    for (size_t i = 0; i < a.run_dirs.size(); ++i) {
        const fs::path dir = a.run_dirs[i];
        const std::string label =
            !a.labels.empty()
                ? a.labels[i]
                : (dir.filename().empty() ? dir.parent_path() : dir).filename().string();
        curves.push_back(report::read_metric_curve(a.run_dirs[i], a.metric, label));
    }
    const bool val = a.metric == "val_loss";  // checked above: val_loss or loss
    report::write_comparison_chart(curves, val ? "Validation loss" : "Train loss",
                                   val ? "val loss" : "train loss", a.out);

    size_t width = 3;
    for (const auto& c : curves) width = std::max(width, c.label.size());
    const std::string final_head = "final " + a.metric, min_head = "min " + a.metric;
    fmt::print("{:<{}}  {:>9}  {:>{}}  {:>{}}\n", "run", width, "last step", final_head,
               final_head.size(), min_head, min_head.size());
    for (const auto& c : curves) {
        const report::CurveSummary s = report::summarize(c);
        fmt::print("{:<{}}  {:>9.0f}  {:>{}.4f}  {:>{}.4f}\n", c.label, width, s.last_step,
                   s.final_value, final_head.size(), s.min_value, min_head.size());
    }
    std::fflush(stdout);
    log::info("report: wrote {}", a.out);
    return 0;
}

// ---- bench ----

int cmd_bench_kernels(const CommonArgs& a, const BenchArgs& b) {
    CommonArgs ca = a;
    if (ca.config.empty() && fs::exists("configs/default.toml")) ca.config = "configs/default.toml";
    const TrainConfig cfg = resolve_config(ca);
    set_compute_threads(cfg.train.threads);
    bench::KernelsBenchOptions o;
    o.json = b.json;
    if (b.repeats > 0) o.repeats = b.repeats;
    o.filter           = b.filter;
    o.standalone_check = b.standalone_check;
    o.model_shapes = bench::training_gemm_shapes(cfg.model, static_cast<int>(cfg.micro_batch()));
    o.attn_B       = static_cast<int>(cfg.micro_batch());
    o.attn_T       = cfg.model.seq_len;
    o.attn_C       = cfg.model.d_model;
    o.attn_NH      = cfg.model.n_head;
    return bench::run_kernels_bench(o);
}

// "4096", "64K", "16M", "1G" (powers of 1024) -> bytes.
static size_t parse_bytes(const std::string& text) {
    errno             = 0;
    char* end         = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    const bool range  = errno == ERANGE;
    const std::string suffix(end);
    const std::string units = "KMG";
    const size_t pos        = suffix.size() == 1 ? units.find(suffix[0]) : std::string::npos;
    if (end == text.c_str() || v <= 0 || (!suffix.empty() && pos == std::string::npos)) {
        input_error("--sizes {}: expected a positive byte count such as 4096, 64K, 16M or 1G",
                    text);
    }
    const size_t shift = suffix.empty() ? 0 : 10 * (pos + 1);
    // a count that wraps would benchmark another size than the one asked for
    if (range || static_cast<unsigned long long>(v) > (SIZE_MAX >> shift)) {
        input_error(
            "--sizes {}: too large for a 64-bit byte count; expected a size such as 64K, 16M or 1G",
            text);
    }
    return static_cast<size_t>(v) << shift;
}

int cmd_bench_comm(const BenchArgs& b, dist::Comm& world) {
    bench::CommBenchOptions o;
    // the ranks whose buffers share this machine's memory (collective, so before the checks)
    const int ranks_here = world.split_shared()->size();
    dist::check_together(world, [&] {
        if (!b.sizes.empty()) {
            o.min_bytes = parse_bytes(b.sizes.at(0));
            o.max_bytes = parse_bytes(b.sizes.at(1));
            if (o.max_bytes < o.min_bytes) {
                input_error("--sizes {} {}: the first (smallest) size must come first", b.sizes[0],
                            b.sizes[1]);
            }
        }
        // before any buffer is allocated: too large a size would otherwise fail on every rank
        // alike, after the smaller sizes, with one out-of-memory message per rank
        try {
            bench::check_comm_bench_size(o.max_bytes, world.size(), ranks_here, memory_left());
        } catch (const InputError& e) {
            input_error("--sizes {}: {}",
                        b.sizes.empty()
                            ? fmt::format("{} {} (the default)", o.min_bytes, o.max_bytes)
                            : b.sizes[0] + " " + b.sizes[1],
                        e.what());
        }
        if (b.ranks_per_node > 0 && world.size() % b.ranks_per_node != 0) {
            input_error("--ranks-per-node {}: must divide the number of ranks {}", b.ranks_per_node,
                        world.size());
        }
    });
    o.ranks_per_node = b.ranks_per_node;
    o.json           = b.json;
    if (b.repeats > 0) o.repeats = b.repeats;
    return bench::run_comm_bench(world, o);
}

// The overrides of one `--compare` value: "SECTION.KEY=VALUE" items separated by ';', each key
// once (a second value would silently replace the first: the setting would not be the one
// written).
static std::vector<std::string> compare_overrides(const std::string& setting) {
    std::vector<std::string> items, keys;
    size_t start = 0;
    for (;;) {
        const size_t end = setting.find(';', start);
        std::string item = setting.substr(start, end == std::string::npos ? end : end - start);
        const size_t a = item.find_first_not_of(" \t"), z = item.find_last_not_of(" \t");
        item             = a == std::string::npos ? "" : item.substr(a, z - a + 1);
        const size_t eq  = item.find('=');
        const size_t dot = item.find('.');
        std::string key  = item.substr(0, eq);
        key.erase(key.find_last_not_of(" \t") + 1);
        if (eq == std::string::npos || dot == 0 || dot == std::string::npos || dot + 1 >= eq ||
            key.back() == '.') {
            input_error(
                "--compare \"{}\": expected SECTION.KEY=VALUE items separated by ';', got \"{}\"",
                setting, item);
        }
        if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
            input_error(
                "--compare \"{}\": {} is set twice in this setting (expected each key once)",
                setting, key);
        }
        keys.push_back(key);
        items.push_back(item);
        if (end == std::string::npos) return items;
        start = end + 1;
    }
}

// `bench train --compare S1 --compare S2 ...`: each setting is the config with --set and then
// its own overrides, checked like a run's config, with its own process layout.
static int bench_train_compare(const CommonArgs& a, const BenchArgs& b, dist::Comm& world) {
    std::vector<bench::BenchSetting> settings(b.compare.size());
    dist::check_together(world, [&] {
        if (b.isolate && dist::launched_by_mpi()) {
            input_error(
                "--isolate: runs each setting in a process of its own, one rank only: run it "
                "without mpirun");
        }
        if (b.compare.size() < 2) {
            input_error(
                "--compare: give at least two settings (got {}), e.g. --compare "
                "precision.dtype=fp32 --compare precision.dtype=bf16",
                b.compare.size());
        }
        for (size_t i = 0; i < b.compare.size(); ++i) {
            CommonArgs with = a;
            for (std::string& o : compare_overrides(b.compare[i])) with.overrides.push_back(o);
            try {
                settings[i].cfg = resolve_config(with);
                validate_layout(settings[i].cfg, world.size());
                validate_micro_batch(settings[i].cfg, world.size());
            } catch (const InputError& e) {
                input_error("--compare \"{}\": {}", b.compare[i], e.what());
            }
            settings[i].label = b.compare[i];
        }
    });
    share_node_cpus(settings.front().cfg, world, *world.split_shared());
    std::vector<std::unique_ptr<dist::ParallelContext>> layouts;
    for (bench::BenchSetting& s : settings) {
        layouts.push_back(make_parallel(s.cfg, world));
        s.par = layouts.back().get();
    }
    bench::TrainBenchOptions o;
    o.steps   = b.steps;
    o.warmup  = b.warmup;
    o.json    = b.json;
    o.isolate = b.isolate;
    if (b.repeats > 0) o.repeats = b.repeats;
    return bench::compare_settings(std::move(settings), o);
}

int cmd_bench_train(const CommonArgs& a, const BenchArgs& b, dist::Comm& world) {
    if (!b.compare.empty()) return bench_train_compare(a, b, world);
    TrainConfig cfg;
    dist::check_together(world, [&] {
        cfg = resolve_config(a);
        validate_layout(cfg, world.size());
        validate_micro_batch(cfg, world.size());
    });
    share_node_cpus(cfg, world, *world.split_shared());
    const auto par_ptr         = make_parallel(cfg, world);
    dist::ParallelContext& par = *par_ptr;
    bench::TrainBenchOptions o;
    o.steps           = b.steps;
    o.warmup          = b.warmup;
    o.json            = b.json;
    o.compare_overlap = b.compare_overlap;
    if (b.repeats > 0) o.repeats = b.repeats;
    return bench::run_train_bench(cfg, o, par);
}

}  // namespace bagualu::cli

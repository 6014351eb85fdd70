// `bagualu plan` (prediction report, layout sweep, JSON) and `bagualu calibrate` (machine file
// of the local machine). The models live in src/plan; this file parses, prints and writes.
#include "cli/plan_commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/checks.h"
#include "config/config.h"
#include "core/error.h"
#include "core/proc_memory.h"
#include "core/thread_pool.h"
#include "data/file_io.h"
#include "data/token_file.h"
#include "data/token_shards.h"
#include "dist/comm/checks.h"
#include "dist/comm/comm.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "plan/calibrate.h"
#include "plan/estimate.h"

namespace bagualu::cli {

using namespace plan;

PlanCommands::PlanCommands(CLI::App& app) {
    plan_ =
        app.add_subcommand("plan", "Predict memory, step time and FLOPS of a config on a machine");
    plan_->add_option("--config", config_, "TOML config file")
        ->required()
        ->check(CLI::ExistingFile);
    plan_->add_option("--set", overrides_, "Override a config key (repeatable)")
        ->type_name("SECTION.KEY=VALUE");
    plan_->add_option("--machine", machine_, "Machine file (machines/*.toml)")->required();
    plan_->add_option("--nodes", nodes_, "Nodes")->check(cli::positive())->capture_default_str();
    plan_->add_option("--ranks-per-node", ranks_per_node_, "MPI ranks per node")
        ->check(cli::positive())
        ->capture_default_str();
    plan_
        ->add_option("--overlap", overlap_,
                     "What-if: fraction f of min(gradient reduction, last backward) hidden "
                     "(default: as parallel.overlap_grad_reduce does, docs/scale.md)")
        ->check(cli::number_in(0.0, 1.0, "a fraction in [0, 1]"));
    plan_
        ->add_option("--capacity-factor", capacity_,
                     "What-if: the MoE row budget, this x N x K rows per rank (as "
                     "model.moe_rows_budget; 0 = the config's)")
        ->check(cli::non_negative());
    plan_->add_flag("--sweep", sweep_,
                    "Rank layouts (expert parallelism, micro-batch) by predicted throughput");
    plan_->add_option("--top", top_, "Layouts listed by --sweep")
        ->check(cli::positive())
        ->capture_default_str();
    plan_->add_flag("--json", json_, "Print one JSON object");

    calibrate_ = app.add_subcommand(
        "calibrate", "Measure this machine and write its machine file (under mpirun: the network)");
    out_ = "machines/local.toml";
    calibrate_->add_option("--out", out_, "Machine file to write (updated in place under mpirun)")
        ->capture_default_str();
    calibrate_->add_option("--seconds", seconds_, "Time per measurement")
        ->check(cli::number_in(1e-6, 600, "a time in seconds, at most 600"))
        ->capture_default_str();
}

namespace {

constexpr double kGiB = 1073741824.0;

struct Inputs {
    TrainConfig cfg;
    MachineSpec machine;
    Layout layout;
    uint64_t order_bytes = 0;
    double baseline      = 0;
    EstimateOptions opt;
};

// The trainer's layout on nodes x R ranks of machine m: threads from the config, else the
// node's cores shared by its ranks.
Layout layout_on(const TrainConfig& cfg, const model::PrecisionPolicy& policy, const MachineSpec& m,
                 int nodes, int R) {
    Layout L =
        make_layout(cfg, policy, nodes * R, R,
                    cfg.train.threads > 0 ? cfg.train.threads : std::max(1, m.node.cores / R));
    if (!m.node.gemm_path.empty()) {  // validated: a path's name, and both caches given
        L.gemm_path = *kernels::gemm::path_of_name(m.node.gemm_path);
        L.caches.l2 = static_cast<size_t>(m.node.l2_kib * 1024);
        L.caches.l3 = static_cast<size_t>(m.node.l3_kib * 1024);
        if (!m.node.half_features.empty()) {
            L.avx512_bf16 = m.node.half_features.find("avx512_bf16") != std::string::npos;
        }
    }
    return L;
}

Estimate run_estimate(const Inputs& in) {
    const Footprint fp = footprint(in.cfg, in.layout, in.order_bytes, in.baseline);
    return estimate(fp, in.cfg, in.machine, in.opt);
}

std::string gib(double b) { return fmt::format("{:.3f} GiB", b / kGiB); }
std::string human_bytes(double b) {
    if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
    if (b >= 1048576) return fmt::format("{:.2f} MiB", b / 1048576);
    if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
    return fmt::format("{:.0f} B", b);
}
std::string human_count(double n) {
    if (n >= 1e12) return fmt::format("{:.3f} T", n / 1e12);
    if (n >= 1e9) return fmt::format("{:.3f} B", n / 1e9);
    if (n >= 1e6) return fmt::format("{:.3f} M", n / 1e6);
    return fmt::format("{:.0f}", n);
}
std::string human_flops(double f) {
    if (f >= 1e18) return fmt::format("{:.3f} EFLOPS", f / 1e18);
    if (f >= 1e15) return fmt::format("{:.1f} PFLOPS", f / 1e15);
    if (f >= 1e12) return fmt::format("{:.2f} TFLOPS", f / 1e12);
    return fmt::format("{:.2f} GFLOPS", f / 1e9);
}

std::string fit_line(const Estimate& e) {
    const int R = e.fp.layout.ranks_per_node;
    if (e.fits) {
        return fmt::format("fits: {} per node ({} rank(s) x {}), node has {}",
                           gib(e.node_memory_bytes), R, gib(e.fp.memory.total()),
                           gib(e.node_capacity));
    }
    return fmt::format("does not fit: needs {} per node ({} rank(s) x {}), node has {}",
                       gib(e.node_memory_bytes), R, gib(e.fp.memory.total()), gib(e.node_capacity));
}

nlohmann::json to_json(const Estimate& e, const Inputs& in) {
    const Footprint& fp = e.fp;
    const Memory& m     = fp.memory;
    nlohmann::json j;
    j["config"]                = in.cfg.source;
    j["machine"]               = in.machine.source;
    j["layout"]                = {{"nodes", fp.layout.nodes()},
                                  {"ranks", fp.layout.ranks},
                                  {"ranks_per_node", fp.layout.ranks_per_node},
                                  {"expert_parallel", fp.layout.ep},
                                  {"expert_data_parallel", fp.layout.edp()},
                                  {"micro_batch", fp.layout.micro_batch},
                                  {"grad_accum", fp.layout.accum},
                                  {"threads", fp.layout.threads},
                                  {"optimizer_shards", fp.layout.opt_shards},
                                  {"optimizer_shards_expert", fp.layout.opt_shards_expert},
                                  {"bucket_floats", fp.layout.bucket_floats},
                                  {"overlap_grad_reduce", fp.layout.overlap},
                                  {"two_level", fp.layout.two_level},
                                  {"reduce_group", fp.layout.reduce_group},
                                  {"hierarchical_a2a", fp.layout.hierarchical_a2a},
                                  {"a2a_grid_rows", fp.layout.a2a_grid},
                                  {"capacity_factor", fp.layout.capacity_factor},
                                  {"precision", fp.layout.policy.describe()}};
    j["params"]                = {{"total", fp.params_full},
                                  {"per_rank_floats", fp.rank_floats},
                                  {"per_rank_expert_floats", fp.expert_floats}};
    j["memory_bytes_per_rank"] = {{"baseline", m.baseline},
                                  {"parameters", m.parameters},
                                  {"gradients", m.gradients},
                                  {"optimizer", m.optimizer},
                                  {"activations", m.activations},
                                  {"comm_buffers", m.comm_buffers},
                                  {"data", m.data},
                                  {"checkpoint", m.checkpoint},
                                  {"gemm_packing", m.gemm_packing},
                                  {"total", m.total()}};
    j["memory_per_node_bytes"] = e.node_memory_bytes;
    j["node_capacity_bytes"]   = e.node_capacity;
    j["fits"]                  = e.fits;
    nlohmann::json cs          = nlohmann::json::array();
    for (size_t i = 0; i < fp.collectives.size(); ++i) {
        const Collective& c = fp.collectives[i];
        cs.push_back({{"what", c.what},
                      {"kind", dist::comm_kind_name(c.kind)},
                      {"group", c.group},
                      {"group_size", c.group_size},
                      {"calls", c.calls},
                      {"bytes", c.bytes},
                      {"seconds", e.comm[i].seconds}});
    }
    j["collectives_per_step_per_rank"] = cs;
    nlohmann::json kinds               = nlohmann::json::object();
    const dist::CommTally t            = per_kind(fp.collectives);
    for (size_t k = 0; k < dist::kNumCommKinds; ++k) {
        if (t.by_kind[k].calls == 0) continue;
        kinds[dist::comm_kind_name(static_cast<dist::CommKind>(k))] = {
            {"calls", t.by_kind[k].calls}, {"bytes", t.by_kind[k].bytes}};
    }
    j["comm_per_step_per_rank"]                       = kinds;
    j["a2a_inter_node_bytes_per_step_per_rank"]       = fp.a2a_inter_node_bytes;
    j["a2a_inter_node_bytes_plain_per_step_per_rank"] = fp.a2a_inter_node_bytes_plain;
    j["node_dedup"]                                   = fp.layout.node_dedup;
    nlohmann::json terms                              = nlohmann::json::object();
    for (const Term& x : e.compute) terms[x.name] = x.seconds;
    j["time"]                 = {{"terms", terms},           {"compute_s", e.t_compute},
                                 {"memory_s", e.t_memory},   {"comm_s", e.t_comm},
                                 {"overlap_s", e.t_overlap}, {"a2a_hidden_s", e.t_a2a_hidden},
                                 {"step_s", e.t_step},       {"bottleneck", e.bottleneck}};
    j["model_flops_per_step"] = fp.model_flops_per_step;
    j["tokens_per_step"]      = fp.tokens_per_step;
    j["tokens_per_s"]         = e.tokens_per_s;
    j["sustained_flops"]      = e.sustained_flops;
    j["peak_flops"]           = e.peak_flops;
    j["fraction_of_peak"]     = e.fraction_of_peak;
    return j;
}

void print_text(const Estimate& e, const Inputs& in) {
    const Footprint& fp = e.fp;
    const Layout& L     = fp.layout;
    const Memory& m     = fp.memory;
    fmt::print("plan: {} on {} ({})\n", in.cfg.source, in.machine.name, in.machine.source);
    fmt::print(
        "layout: {} node(s) x {} rank(s) = {} ranks; expert parallel {} x data parallel {}; "
        "{} local expert(s) per MoE layer; micro-batch {} x {} accumulation; {} thread(s) "
        "per rank; {}; optimizer {}; gradient reduction {}{}; expert all-to-all {}; recompute "
        "{}\n",
        L.nodes(), L.ranks_per_node, L.ranks, L.ep, L.edp(),
        in.cfg.model.moe_every > 0 ? in.cfg.model.n_experts / L.ep : 0, L.micro_batch, L.accum,
        L.threads, L.policy.describe(),
        L.opt_shards > 1 ? fmt::format("ParO over {} (experts over {}), buckets of {} floats",
                                       L.opt_shards, L.opt_shards_expert, L.bucket_floats)
                         : "replicated",
        in.opt.comm_overlap >= 0 ? fmt::format("overlap what-if {}", in.opt.comm_overlap)
        : L.overlap              ? "overlapped with the last backward"
                                 : "after backward",
        L.two_level ? fmt::format(", two levels (groups of {} ranks, then across)", L.reduce_group)
                    : "",
        fmt::format("{}{}", L.hierarchical_a2a ? "via node leaders" : "flat",
                    L.a2a_grid > 0 ? fmt::format(", two phases over rows of {}", L.a2a_grid) : ""),
        name_of(in.cfg.train.recompute));
    fmt::print("model: {} parameters; {} floats per rank ({} in local experts)\n",
               human_count(static_cast<double>(fp.params_full)),
               human_count(static_cast<double>(fp.rank_floats)),
               human_count(static_cast<double>(fp.expert_floats)));
    fmt::print("\nmemory per rank\n");
    const std::pair<const char*, double> rows[] = {{"baseline (process, MPI)", m.baseline},
                                                   {"parameters", m.parameters},
                                                   {"gradients", m.gradients},
                                                   {"optimizer state", m.optimizer},
                                                   {"activations", m.activations},
                                                   {"communication buffers", m.comm_buffers},
                                                   {"data", m.data},
                                                   {"checkpoint snapshot", m.checkpoint},
                                                   {"GEMM packing buffers", m.gemm_packing},
                                                   {"total", m.total()}};
    for (const auto& [name, b] : rows) fmt::print("  {:<26}{:>14}\n", name, human_bytes(b));
    if (in.machine.node.gemm_path.empty()) {
        fmt::print(
            "  (GEMM packing buffers not counted: {} gives no node.gemm_path, l2_kib and "
            "l3_kib, which `bagualu calibrate` writes)\n",
            in.machine.source);
    }
    fmt::print("  {}\n", fit_line(e));
    fmt::print("\ncollectives per step and rank\n");
    for (size_t i = 0; i < fp.collectives.size(); ++i) {
        const Collective& c = fp.collectives[i];
        fmt::print("  {:<68} {:<15}{:>7}({:>6}){:>10.4g} calls{:>14}{:>12.3f} ms\n", c.what,
                   dist::comm_kind_name(c.kind), c.group, c.group_size, c.calls,
                   human_bytes(c.bytes), e.comm[i].seconds * 1e3);
    }
    if (fp.collectives.empty()) fmt::print("  none (one rank)\n");
    if (fp.a2a_inter_node_bytes_plain > 0) {
        fmt::print(
            "  MoE all-to-all across nodes: {} per step and rank{} (one row per slot, unlimited "
            "routing: {})\n",
            human_bytes(fp.a2a_inter_node_bytes),
            fp.layout.node_dedup ? ", each token once per node" : "",
            human_bytes(fp.a2a_inter_node_bytes_plain));
    }
    fmt::print("\ntime per step\n");
    for (const Term& t : e.compute) fmt::print("  {:<69}{:>12.3f} ms\n", t.name, t.seconds * 1e3);
    fmt::print(
        "  compute {:.3f} ms + memory-bound {:.3f} ms + communication {:.3f} ms - overlap "
        "{:.3f} ms{} = {:.3f} ms\n",
        e.t_compute * 1e3, e.t_memory * 1e3, e.t_comm * 1e3, e.t_overlap * 1e3,
        e.t_a2a_hidden > 0
            ? fmt::format(" - all-to-all behind the experts {:.3f} ms", e.t_a2a_hidden * 1e3)
            : "",
        e.t_step * 1e3);
    fmt::print(
        "\nthroughput: {:.4g} tokens/s; {} model FLOPs per step; sustained {} = {:.1f}% of "
        "the {} peak\nbottleneck: {}\n",
        e.tokens_per_s, human_count(fp.model_flops_per_step), human_flops(e.sustained_flops),
        100 * e.fraction_of_peak, human_flops(e.peak_flops), e.bottleneck);
}

std::vector<int64_t> divisors(int64_t n) {
    std::vector<int64_t> d;
    for (int64_t i = 1; i * i <= n; ++i) {
        if (n % i == 0) {
            d.push_back(i);
            if (i != n / i) d.push_back(n / i);
        }
    }
    std::sort(d.begin(), d.end());
    return d;
}

int run_sweep(const Inputs& base, int top, bool json) {
    const int P       = base.layout.ranks;
    const int64_t per = base.cfg.train.batch_size / P;
    const bool moe    = base.cfg.model.moe_every > 0;
    std::vector<Estimate> fit, nofit;
    std::string why;  // the first layout's error, should none be valid
    for (int64_t ep : divisors(P)) {
        if (moe ? base.cfg.model.n_experts % ep != 0 : ep != 1) continue;
        for (int64_t mb : divisors(std::max<int64_t>(1, per))) {
            Inputs in                       = base;
            in.cfg.parallel.expert_parallel = static_cast<int>(ep);
            in.cfg.train.micro_batch_size   = mb;
            try {
                in.layout = layout_on(in.cfg, base.layout.policy, in.machine, base.layout.nodes(),
                                      base.layout.ranks_per_node);
                in.layout.capacity_factor = base.layout.capacity_factor;
                const Estimate e          = run_estimate(in);
                (e.fits ? fit : nofit).push_back(e);
            } catch (const InputError& e) {
                if (why.empty()) why = e.what();
                continue;  // layout invalid for this batch
            }
        }
    }
    if (fit.empty() && nofit.empty()) {
        input_error("plan --sweep: no valid layout of {} ranks ({} node(s) x {}) for this config{}",
                    P, base.layout.nodes(), base.layout.ranks_per_node,
                    why.empty() ? "" : ", e.g.: " + why);
    }
    auto by_speed = [](const Estimate& a, const Estimate& b) {
        return a.tokens_per_s > b.tokens_per_s;
    };
    std::sort(fit.begin(), fit.end(), by_speed);
    std::sort(nofit.begin(), nofit.end(), [](const Estimate& a, const Estimate& b) {
        return a.node_memory_bytes < b.node_memory_bytes;
    });
    if (json) {
        nlohmann::json j = {{"fitting", nlohmann::json::array()}, {"not_fitting", nofit.size()}};
        for (size_t i = 0; i < fit.size() && i < static_cast<size_t>(top); ++i)
            j["fitting"].push_back(to_json(fit[i], base));
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    fmt::print("sweep: {} ranks ({} node(s) x {}), global batch {}: {} layouts fit, {} do not\n", P,
               base.layout.nodes(), base.layout.ranks_per_node, base.cfg.train.batch_size,
               fit.size(), nofit.size());
    fmt::print("  {:>4} {:>8} {:>8} {:>8} {:>6} {:>12} {:>12} {:>12} {:>8}  {}\n", "rank", "EP",
               "experts", "micro", "accum", "GiB/node", "step s", "tokens/s", "%peak",
               "bottleneck");
    for (size_t i = 0; i < fit.size() && i < static_cast<size_t>(top); ++i) {
        const Estimate& e = fit[i];
        const Layout& L   = e.fp.layout;
        fmt::print("  {:>4} {:>8} {:>8} {:>8} {:>6} {:>12.2f} {:>12.4g} {:>12.4g} {:>8.2f}  {}\n",
                   i + 1, L.ep, moe ? base.cfg.model.n_experts / L.ep : 0, L.micro_batch, L.accum,
                   e.node_memory_bytes / kGiB, e.t_step, e.tokens_per_s, 100 * e.fraction_of_peak,
                   e.bottleneck);
    }
    if (fit.empty() && !nofit.empty()) {
        fmt::print("  no layout fits; the smallest: EP {} micro-batch {}: {}\n",
                   nofit[0].fp.layout.ep, nofit[0].fp.layout.micro_batch, fit_line(nofit[0]));
    }
    return 0;
}

// The machine file `out` that calibrate may update: none yet (then a new one), or one that
// calibrate wrote on this CPU. Another CPU's file, or one written by hand, is refused: the
// update keeps the keys it does not measure, so it would mix two machines' figures.
MachineSpec own_machine_file(const std::string& out) {
    MachineSpec m;
    if (!std::filesystem::exists(out)) return m;
    m                      = load_machine(out);
    const std::string& cpu = kernels::cpu_features().model;
    if (m.cpu_model != cpu) {
        input_error(
            "calibrate --out {}: the file describes another machine ({}), this one has CPU \"{}\"; "
            "nothing was written: choose another --out",
            out,
            m.cpu_model.empty()
                ? fmt::format("\"{}\", no cpu_model: not measured here by calibrate", m.name)
                : fmt::format("CPU \"{}\"", m.cpu_model),
            cpu);
    }
    return m;
}

constexpr const char* kCalibrateHeader =
    "# The local machine, measured by `bagualu calibrate` (per-core numbers x cores).\n";

// The path whose packing buffers a run here keeps, as the machine file records it: the active
// one, or under BGL_GEMM=auto or onednn the best of ours, which auto picks for some shapes and
// onednn for the grouped products (oneDNN's own scratch is not counted). "auto" in the file
// would make the planner count its own CPU's kernel instead of this one's.
kernels::gemm::Path packing_path() {
    const kernels::gemm::Path p = kernels::gemm::active_path();
    return p == kernels::gemm::Path::automatic || p == kernels::gemm::Path::onednn
               ? kernels::gemm::best_path()
               : p;
}

int cmd_calibrate(const std::string& out, double seconds, int* argc, char*** argv) {
    set_compute_threads(1);
    if (!dist::launched_by_mpi()) {
        MachineSpec m = own_machine_file(out);  // before measuring: a refusal comes at once
        m.name        = "local";
        m.source      = out;
        m.cpu_model   = kernels::cpu_features().model;
        warm_up_kernels();
        (void)touch_own_image();  // what a training process has resident of the binary
        m.node.baseline_rss_mib    = static_cast<double>(resident_bytes()) / 1048576;
        m.node.l2_kib              = static_cast<double>(kernels::cache_sizes().l2) / 1024;
        m.node.l3_kib              = static_cast<double>(kernels::cache_sizes().l3) / 1024;
        m.node.gemm_path           = kernels::gemm::path_name(packing_path());
        m.node.half_features       = kernels::half_precision_features();
        const ComputeCalibration c = calibrate_compute(seconds);
        apply(m, c);
        if (const uint64_t total = total_memory_bytes())
            m.node.memory_gib = static_cast<double>(total) / kGiB;
        if (m.notes.empty())
            m.notes = "measured by bagualu calibrate; network: run it under mpirun";
        // a temporary file and a rename: an interrupted write leaves the file as it was
        data::write_file_atomic(out, to_toml(m, kCalibrateHeader));
        fmt::print(
            "calibrate: {} cores, peak {:.1f} GFLOP/s per core (fp32), {:.1f} (bf16), triad {:.1f} "
            "GB/s per core, {:.1f} GB/s node; GEMM efficiency {:.2f}..{:.2f} (fp32), "
            "{:.2f}..{:.2f} (bf16); attention {:.2f}; optimizer {:.2f} ns/float; baseline {:.1f} "
            "MiB -> {}\n",
            c.cores, c.peak_core_gflops, c.peak_core_half_gflops, c.triad_core_gbs,
            c.triad_node_gbs, c.gemm_efficiency.front(), c.gemm_efficiency.back(),
            c.half_gemm_efficiency.front(), c.half_gemm_efficiency.back(), c.attention_efficiency,
            c.optimizer_ns_per_float, m.node.baseline_rss_mib, out);
        return 0;
    }
    // what MPI adds: resident memory after its start-up and collectives, beyond a process that
    // has run the kernels (the baseline measured without mpirun)
    warm_up_kernels();
    (void)touch_own_image();  // as the run without mpirun, so that only MPI's part is measured
    const uint64_t rss0               = resident_bytes();
    std::unique_ptr<dist::Comm> world = dist::init_world(argc, argv);
    // Rank 0 updates the file the run without mpirun wrote on this CPU: checked before the
    // measurements, and every rank ends with rank 0's one message.
    MachineSpec m;
    dist::check_together(*world, [&] {
        if (world->rank() != 0) return;
        if (!std::filesystem::exists(out))
            input_error("{}: run `bagualu calibrate --out {}` without mpirun first", out, out);
        m = own_machine_file(out);
    });
    {
        std::vector<double> warm(1 << 16, 1.0);
        world->allreduce_sum(std::span<double>(warm));
        const CommCalibration c = calibrate_comm(*world);
        double mpi_mib =
            static_cast<double>(resident_bytes() - std::min(resident_bytes(), rss0)) / 1048576;
        world->allreduce_max(std::span<double>(&mpi_mib, 1));
        // a failed write ends every rank, not rank 0 alone
        dist::check_together(*world, [&] {
            if (world->rank() != 0) return;
            apply(m, c, world->size());
            m.node.mpi_rss_mib = mpi_mib;
            data::write_file_atomic(out, to_toml(m, kCalibrateHeader));
            fmt::print(
                "calibrate ({} ranks): all-to-all {:.1f} us + {:.2f} GB/s per rank; all-reduce "
                "{:.1f} us + {:.2f} GB/s; {:.0f} us per blocking call when sharing cores; MPI adds "
                "{:.1f} MiB per process -> {}\n",
                world->size(), c.alltoall_latency_us, c.alltoall_gbs, c.allreduce_latency_us,
                c.allreduce_gbs, c.sync_us, mpi_mib, out);
        });
    }
    world.reset();
    dist::finalize_world();
    return 0;
}

}  // namespace

int PlanCommands::run(int* argc, char*** argv) {
    if (*calibrate_) return cmd_calibrate(out_, seconds_, argc, argv);
    Inputs in;
    in.cfg     = load_config(config_, overrides_);
    in.machine = load_machine(machine_);
    if (nodes_ > in.machine.network.total_nodes) {
        input_error("--nodes {}: {} has {} nodes (network.total_nodes)", nodes_, in.machine.source,
                    in.machine.network.total_nodes);
    }
    in.layout = layout_on(in.cfg, model::PrecisionPolicy::from_config(in.cfg.precision), in.machine,
                          nodes_, ranks_per_node_);
    in.layout.capacity_factor = capacity_;
    in.order_bytes            = data_order_bytes(in.cfg);
    in.baseline               = (in.machine.node.baseline_rss_mib +
                   (in.layout.ranks > 1 ? in.machine.node.mpi_rss_mib : 0)) *
                  1048576;
    in.opt.comm_overlap = overlap_;
    if (sweep_) return run_sweep(in, top_, json_);
    const Estimate e = run_estimate(in);
    if (json_) {
        fmt::print("{}\n", to_json(e, in).dump(2));
    } else {
        print_text(e, in);
    }
    return 0;
}

}  // namespace bagualu::cli

// bagualu: command-line entry point. Parses the command line (CLI11), runs one subcommand,
// and turns errors into one line and an exit status: 2 for bad input (config, data, command
// line), 1 for internal failures.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <thread>

#include "bench/io_bench.h"
#include "cli/checks.h"
#include "cli/commands.h"
#include "cli/plan_commands.h"
#include "core/error.h"
#include "core/numbers.h"
#include "core/stop_signal.h"
#include "dist/comm/comm.h"

using namespace bagualu;

// An existing regular file: a FIFO or device named as a file would block or never end.
static const CLI::Validator kRegularFile(
    [](std::string& path) -> std::string {
        std::error_code ec;
        const auto st = std::filesystem::status(path, ec);
        if (st.type() == std::filesystem::file_type::not_found)
            return "File does not exist: " + path;
        if (!std::filesystem::is_regular_file(st)) return "Not a regular file: " + path;
        return {};
    },
    "FILE");

int main(int argc, char** argv) {
    CLI::App app{"bagualu: Mixture-of-Experts language-model training on CPU clusters"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");

    cli::CommonArgs common;
    auto add_common = [&](CLI::App* sub) {
        sub->add_option("--config", common.config, "TOML config file (default: built-in defaults)")
            ->check(kRegularFile);
        sub->add_option("--set", common.overrides,
                        "Override a config key, e.g. --set train.steps=100 (repeatable)")
            ->type_name("SECTION.KEY=VALUE");
    };

    bool force = false;
    auto* prepare =
        app.add_subcommand("prepare", "Train the tokenizer and write train/val token shards");
    add_common(prepare);
    prepare->add_flag("--force", force, "Rebuild even if the outputs are up to date");
    std::string tokenizer_from;
    prepare
        ->add_option("--tokenizer", tokenizer_from,
                     "Encode with this SentencePiece model (or an exported model's or run's) "
                     "instead of training one")
        ->type_name("FILE|DIR");

    std::string run_dir;
    auto* train = app.add_subcommand("train", "Train a model");
    add_common(train);
    train->add_option("--run-dir", run_dir, "Output directory (default: runs/<config name>)")
        ->check(CLI::Validator(
            [](std::string& dir) -> std::string {
                return dir.empty() ? "expected a directory, got an empty path" : "";
            },
            ""));
    train->add_flag("--force", force, "Replace an earlier run in the run directory");
    bool resume = false;
    train->add_flag("--resume", resume,
                    "Continue from the newest usable checkpoint (= checkpoint.resume = \"auto\")");

    std::string model_dir, val_path;
    auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of an exported model");
    add_common(eval);
    eval->add_option("--model", model_dir, "Exported model directory or run directory")->required();
    eval->add_option("--val", val_path, "Token shard to evaluate on (default: data.val)");

    cli::SampleArgs sa;
    auto* sample = app.add_subcommand("sample", "Generate text from an exported model");
    sample->add_option("--model", sa.model_dir, "Exported model directory or run directory")
        ->required();
    sample->add_option("--prompt", sa.prompts, "Prompt text (repeatable)");
    sample->add_option("-n,--num-samples", sa.n, "Number of samples")->check(cli::non_negative());
    sample->add_option("--max-new-tokens", sa.max_new_tokens, "Tokens to generate per sample")
        ->check(cli::positive());
    sample->add_option("--temperature", sa.temperature, "Sampling temperature (0 = greedy)")
        ->check(cli::non_negative());
    sample->add_option("--top-k", sa.top_k, "Sample from the k most likely tokens (0 = all)")
        ->check(cli::non_negative());
    sample
        ->add_option_function<std::string>(
            "--seed", [&](const std::string& text) { sa.seed = parse_uint64(text); },
            "Random seed, 0 to 2^64-1")
        ->check(cli::uint64_number("a seed"));

    std::string from, out, dtype = "f32", from_ckpt;
    auto* exp      = app.add_subcommand("export", "Write a model as safetensors + config.json");
    auto* exp_from = exp->add_option("--from", from, "Run directory or model directory");
    exp->add_option("--checkpoint", from_ckpt, "A checkpoint directory (step_NNNNNNNN)")
        ->excludes(exp_from);
    exp->add_option("--out", out, "Output directory (must not exist or be empty)")->required();
    exp->add_option("--dtype", dtype, "f32 or bf16")->capture_default_str();

    std::string inspect_dir;
    auto* inspect = app.add_subcommand(
        "inspect", "Print a checkpoint's manifest, tensors, sizes and checksum status");
    inspect
        ->add_option("dir", inspect_dir,
                     "A checkpoint (step_NNNNNNNN) or a directory of checkpoints")
        ->required();

    std::string report_dir;
    cli::ReportCompareArgs rca;
    auto* report = app.add_subcommand(
        "report",
        "Draw loss.svg from a run directory's metrics.jsonl, or compare runs on one chart");
    report->add_option("run_dir", report_dir, "Run directory");
    auto* report_compare = report->add_option(
        "--compare", rca.run_dirs, "Draw one metric of these run directories on one chart instead");
    auto* report_labels =
        report
            ->add_option("--labels", rca.labels,
                         "Legend labels, comma-separated (default: the directory names)")
            ->delimiter(',');
    auto* report_metric =
        report
            ->add_option("--metric", rca.metric, "val_loss (validation loss) or loss (train loss)")
            ->capture_default_str();
    auto* report_out = report->add_option("--out", rca.out, "SVG file to write the comparison to")
                           ->type_name("FILE.svg");

    cli::BenchArgs ba;
    auto* bench = app.add_subcommand(
        "bench", "Benchmarks: GEMM kernels, collectives, training steps, checkpoint I/O");
    bench->require_subcommand(1);
    auto* bench_kernels = bench->add_subcommand(
        "kernels", "GEMM GFLOP/s of ours, oneDNN and OpenBLAS on the model's shapes, and the peak");
    bench_kernels
        ->add_option("--config", common.config,
                     "Model shapes from this config (default: configs/default.toml)")
        ->check(kRegularFile);
    bench_kernels->add_option("--set", common.overrides, "Override a config key (repeatable)")
        ->type_name("SECTION.KEY=VALUE");
    bench_kernels->add_option("--repeats", ba.repeats, "Timed runs per GEMM (median)")
        ->check(cli::positive())
        ->default_str("5");
    bench_kernels->add_option("--filter", ba.filter,
                              "Only GEMMs whose name contains this, e.g. square, qkv, \"lm head\"");
    bench_kernels->add_flag("--standalone-check", ba.standalone_check,
                            "Also time oneDNN in a child process without our thread pool");
    bench_kernels->add_flag("--json", ba.json, "Print one JSON object");
    auto* bench_comm = bench->add_subcommand(
        "comm", "All-to-all and reduce-scatter + all-gather bandwidth (run under mpirun)");
    bench_comm->add_option("--sizes", ba.sizes, "Smallest and largest message per rank (x4 steps)")
        ->expected(2)
        ->type_name("MIN MAX")
        ->default_str("4K 64M");
    bench_comm->add_option("--repeats", ba.repeats, "Timed runs per size and operation (median)")
        ->check(cli::positive())
        ->default_str("10");
    bench_comm
        ->add_option("--ranks-per-node", ba.ranks_per_node,
                     "Treat every R consecutive ranks as a node (0: the shared-memory split)")
        ->check(cli::non_negative())
        ->default_str("0");
    bench_comm->add_flag("--json", ba.json, "Print one JSON object");
    auto* bench_train = bench->add_subcommand(
        "train", "Time training steps (nothing written): tokens/s, MFU, memory, time per phase");
    add_common(bench_train);
    bench_train->get_option("--config")->required();
    bench_train->add_option("--steps", ba.steps, "Timed steps")
        ->check(cli::positive())
        ->capture_default_str();
    bench_train->add_option("--warmup", ba.warmup, "Untimed steps first")
        ->check(cli::non_negative())
        ->capture_default_str();
    bench_train->add_flag("--json", ba.json, "Print one JSON object");
    bench_train->add_flag(
        "--compare-overlap", ba.compare_overlap,
        "Time the steps with parallel.overlap_grad_reduce off and on, side by side");
    bench_train
        ->add_option("--compare", ba.compare,
                     "Time this setting beside the others (repeatable, two or more): "
                     "SECTION.KEY=VALUE items separated by ';', applied after --set; "
                     "speeds are given against the first")
        ->excludes("--compare-overlap");
    bench_train
        ->add_flag("--isolate", ba.isolate,
                   "With --compare: run each setting in a fresh process of its own (without "
                   "mpirun) and compare the runs' peak resident memory too")
        ->needs("--compare");
    bench_train
        ->add_option("--repeats", ba.repeats,
                     "Runs of each setting for --compare and --compare-overlap (default 3)")
        ->check(cli::positive());
    bench::IoBenchOptions io_options;
    int64_t io_mib = 256;
    auto* bench_io = bench->add_subcommand(
        "io", "Checkpoint write/read MB/s against a plain write+fsync/read of the same bytes");
    bench_io->add_option("--mib", io_mib, "Checkpoint payload in MiB, split over many tensors")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    bench_io->add_option("--repeats", io_options.repeats, "Timed rounds (median)")
        ->check(cli::positive())
        ->capture_default_str();
    bench_io
        ->add_option("--dir", io_options.dir,
                     "Scratch space goes in a temporary directory here (default: system temp dir)")
        ->check(CLI::ExistingDirectory);
    bench_io->add_flag("--json", io_options.json, "Print one JSON object");
    add_common(bench_io);  // --config: also the training stall of checkpoints on that config
    bench_io->add_option("--stall-steps", io_options.stall_steps, "Steps of each stall run")
        ->check(CLI::Range(int64_t{2}, int64_t{100000}))
        ->capture_default_str();
    bench_io->add_option("--stall-every", io_options.stall_every, "A checkpoint every N steps")
        ->check(cli::positive())
        ->capture_default_str();
    cli::PlanCommands plan_commands(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        // every rank of a job parses the same command line: one message, from the first
        if (dist::first_or_only_process())
            fmt::print(stderr, "bagualu: error: {} (see bagualu --help)\n", e.what());
        return 2;
    }

    // Only `train`, `bench comm` and `bench train` run on several ranks; the world exists for them.
    std::unique_ptr<dist::Comm> world;
    auto fail = [&](int code, const std::string& msg) {
        restore_default_stop_handlers();  // failing: a launcher's SIGTERM ends this rank at once
        std::fflush(stdout);
        if (world && world->size() > 1) {
            // An error one rank found alone, during the run (set-up errors end the ranks
            // together in dist::fail_together). The cause is often shared — a token file changed
            // under the job fails every rank that reads it — so ranks other than 0 give rank 0 a
            // moment to end the job with its message first: one message, not one per rank. 2 s,
            // since on a loaded node rank 0's abort has taken over 1 s to reach the others.
            if (world->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
            world->abort(code, msg);  // ends every rank
        }
        fmt::print(stderr, "{}\n", msg);
        return code;
    };
    try {
        if (*train) {
            world        = dist::init_world(&argc, &argv);
            const int rc = cli::cmd_train(common, run_dir, force, resume, *world);
            world.reset();
            dist::finalize_world();
            return rc;
        }
        if (*bench_comm || *bench_train) {
            world        = dist::init_world(&argc, &argv);
            const int rc = *bench_comm ? cli::cmd_bench_comm(ba, *world)
                                       : cli::cmd_bench_train(common, ba, *world);
            world.reset();
            dist::finalize_world();
            return rc;
        }
        if (plan_commands.selected()) return plan_commands.run(&argc, &argv);
        if (dist::launched_by_mpi() && std::getenv("OMPI_COMM_WORLD_SIZE") &&
            std::string(std::getenv("OMPI_COMM_WORLD_SIZE")) != "1") {
            throw InputError(
                "only `bagualu train`, `bench comm` and `bench train` run on several ranks; run "
                "this command without mpirun");
        }
        if (*prepare) return cli::cmd_prepare(common, force, tokenizer_from);
        if (*eval) return cli::cmd_eval(common, model_dir, val_path);
        if (*sample) return cli::cmd_sample(sa);
        if (*exp && from.empty() == from_ckpt.empty()) {
            throw InputError("export: give either --from DIR (a run or model) or --checkpoint DIR");
        }
        if (*exp)
            return from_ckpt.empty() ? cli::cmd_export(from, out, dtype)
                                     : cli::cmd_export_checkpoint(from_ckpt, out, dtype);
        if (*inspect) return cli::cmd_inspect(inspect_dir);
        if (*report) {
            if (report_compare->count() == 0) {
                if (report_labels->count() || report_metric->count() || report_out->count()) {
                    throw InputError(
                        "report: --labels, --metric and --out go with --compare DIR ...");
                }
                if (report_dir.empty()) {
                    throw InputError(
                        "report: give a run directory, or --compare DIR ... --out FILE.svg");
                }
                return cli::cmd_report(report_dir);
            }
            if (!report_dir.empty()) {
                throw InputError(fmt::format(
                    "report {}: give either one run directory or --compare DIR ..., not both",
                    report_dir));
            }
            return cli::cmd_report_compare(rca);
        }
        if (*bench_kernels) return cli::cmd_bench_kernels(common, ba);
        if (*bench_io) {
            io_options.bytes = static_cast<size_t>(io_mib) << 20;
            if (!common.config.empty()) {
                io_options.stall_config = load_config(common.config, common.overrides);
                if (io_options.stall_every >= io_options.stall_steps) {
                    throw InputError(fmt::format("--stall-every {} must be below --stall-steps {}",
                                                 io_options.stall_every, io_options.stall_steps));
                }
            }
            return bench::run_io_bench(io_options);
        }
    } catch (const InputError& e) {
        return fail(2, fmt::format("bagualu: error: {}", e.what()));
    } catch (const std::bad_alloc&) {
        // A model, batch or input too large for this machine's memory: the user's to change.
        return fail(2,
                    "bagualu: error: out of memory (std::bad_alloc): lower the model size, "
                    "batch or ranks per node, or check that the input files are what they claim");
    } catch (const std::exception& e) {
        return fail(1, fmt::format("bagualu: internal error: {}", e.what()));
    }
    return 0;
}

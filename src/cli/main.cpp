// bagualu: command-line entry point. Parses the command line (CLI11), runs one subcommand,
// and turns errors into one line and an exit status: 2 for bad input (config, data, command
// line), 1 for internal failures.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_commands.h"
#include "core/error.h"
#include "dist/comm/comm.h"

using namespace bagualu;

int main(int argc, char** argv) {
    CLI::App app{"bagualu: Mixture-of-Experts language-model training on CPU clusters"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");

    cli::CommonArgs common;
    auto add_common = [&](CLI::App* sub) {
        sub->add_option("--config", common.config, "TOML config file (default: built-in defaults)")
            ->check(CLI::ExistingFile);
        sub->add_option("--set", common.overrides,
                        "Override a config key, e.g. --set train.steps=100 (repeatable)")
            ->type_name("SECTION.KEY=VALUE");
    };

    bool force = false;
    auto* prepare = app.add_subcommand("prepare", "Train the tokenizer and write train/val token shards");
    add_common(prepare);
    prepare->add_flag("--force", force, "Rebuild even if the outputs are up to date");

    std::string run_dir;
    auto* train = app.add_subcommand("train", "Train a model");
    add_common(train);
    train->add_option("--run-dir", run_dir, "Output directory (default: runs/<config name>)");
    train->add_flag("--force", force, "Replace an earlier run in the run directory");

    std::string model_dir, val_path;
    auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of an exported model");
    add_common(eval);
    eval->add_option("--model", model_dir, "Exported model directory or run directory")->required();
    eval->add_option("--val", val_path, "Token shard to evaluate on (default: data.val)");

    cli::SampleArgs sa;
    auto* sample = app.add_subcommand("sample", "Generate text from an exported model");
    sample->add_option("--model", sa.model_dir, "Exported model directory or run directory")->required();
    sample->add_option("--prompt", sa.prompts, "Prompt text (repeatable)");
    sample->add_option("-n,--num-samples", sa.n, "Number of samples")->check(CLI::NonNegativeNumber);
    sample->add_option("--max-new-tokens", sa.max_new_tokens, "Tokens to generate per sample")->check(CLI::PositiveNumber);
    sample->add_option("--temperature", sa.temperature, "Sampling temperature (0 = greedy)")->check(CLI::NonNegativeNumber);
    sample->add_option("--top-k", sa.top_k, "Sample from the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
    sample->add_option("--seed", sa.seed, "Random seed")->check(CLI::NonNegativeNumber);

    std::string from, out, dtype = "f32";
    auto* exp = app.add_subcommand("export", "Write a model as safetensors + config.json");
    exp->add_option("--from", from, "Run directory or model directory")->required();
    exp->add_option("--out", out, "Output directory (must not exist or be empty)")->required();
    exp->add_option("--dtype", dtype, "f32 or bf16")->capture_default_str();

    std::string report_dir;
    auto* report = app.add_subcommand("report", "Draw loss.svg from a run directory's metrics.jsonl");
    report->add_option("run_dir", report_dir, "Run directory")->required();

    cli::PlanCommands plan_commands(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        fmt::print(stderr, "bagualu: error: {} (see bagualu --help)\n", e.what());
        return 2;
    }

    // Only `train` runs on several ranks; the world exists for it alone.
    std::unique_ptr<dist::Comm> world;
    auto fail = [&](int code, const std::string& msg) {
        std::fflush(stdout);
        if (world && world->size() > 1) world->abort(code, msg);  // ends every rank
        fmt::print(stderr, "{}\n", msg);
        return code;
    };
    try {
        if (*train) {
            world      = dist::init_world(&argc, &argv);
            const int rc = cli::cmd_train(common, run_dir, force, *world);
            world.reset();
            dist::finalize_world();
            return rc;
        }
        if (plan_commands.selected()) return plan_commands.run(&argc, &argv);
        if (dist::launched_by_mpi() && std::getenv("OMPI_COMM_WORLD_SIZE") &&
            std::string(std::getenv("OMPI_COMM_WORLD_SIZE")) != "1") {
            throw InputError("only `bagualu train` runs on several ranks; run this command without mpirun");
        }
        if (*prepare) return cli::cmd_prepare(common, force);
        if (*eval) return cli::cmd_eval(common, model_dir, val_path);
        if (*sample) return cli::cmd_sample(sa);
        if (*exp) return cli::cmd_export(from, out, dtype);
        if (*report) return cli::cmd_report(report_dir);
    } catch (const InputError& e) {
        return fail(2, fmt::format("bagualu: error: {}", e.what()));
    } catch (const std::exception& e) {
        return fail(1, fmt::format("bagualu: internal error: {}", e.what()));
    }
    return 0;
}

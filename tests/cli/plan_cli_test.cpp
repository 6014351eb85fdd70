// `bagualu plan` from the command line: paper-scale configs are the size their names say, the
// JSON is one object, --sweep ranks layouts, and bad machine files end with one line and status 2.
// `bagualu calibrate` updates only a machine file of its own CPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/run_command.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "plan/machine.h"

namespace bagualu::testing {
namespace {

const std::string kSunway = " --machine machines/sunway-oceanlight.toml --nodes 96000";

TEST(PlanCli, PaperScaleConfigsHaveTheirNamedSize) {
    const std::pair<const char*, double> models[] = {
        {"moda-1.93t", 1.93e12}, {"moda-14.5t", 14.5e12}, {"moda-174t", 174e12}};
    for (const auto& [name, params] : models) {
        const CommandResult r = bagualu(std::string("plan --config configs/scale/") + name +
                                        ".toml" + kSunway + " --json");
        ASSERT_EQ(r.status, 0) << r.output;
        const auto j = nlohmann::json::parse(r.output);
        EXPECT_NEAR(j["params"]["total"].get<double>() / params, 1.0, 0.02) << name;
        EXPECT_GT(j["sustained_flops"].get<double>(), 0) << name;
    }
}

// The paper's figures (PPoPP'22): FP32 and mixed-precision PFLOPS of the three models on 96,000
// nodes. As the configs stand every model fits in a node in both precisions and the planner
// predicts at least as much for each (docs/scale.md states the assumptions); the half router of
// the configs is what takes 1.93T's bf16 step there.
TEST(PlanCli, PaperScalePredictionsReachThePapersFigures) {
    struct Model {
        const char* name;
        double fp32, mixed;  // PFLOPS
    };
    auto flops = [&](const std::string& name, const std::string& extra) {
        const CommandResult r =
            bagualu("plan --config configs/scale/" + name + ".toml" + kSunway + " --json" + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        if (r.status != 0) return 0.0;
        const auto j = nlohmann::json::parse(r.output);
        EXPECT_TRUE(j["fits"].get<bool>()) << name << extra << ": " << j["memory_per_node_bytes"];
        return j["sustained_flops"].get<double>() / 1e15;
    };
    for (const Model& m : {Model{"moda-1.93t", 647, 1180}, Model{"moda-14.5t", 525, 1002},
                           Model{"moda-174t", 198, 230}}) {
        EXPECT_GE(flops(m.name, ""), m.fp32) << m.name;
        EXPECT_GE(flops(m.name, " --set precision.dtype=bf16"), m.mixed) << m.name;
    }
    EXPECT_LT(flops("moda-1.93t", " --set precision.dtype=bf16 --set precision.router=fp32"), 1180);
}

TEST(PlanCli, TextReportSaysWhetherItFits) {
    // MoDa-174T with a flat gate: 7.1 G replicated gate floats per rank do not fit
    const CommandResult r = bagualu("plan --config configs/scale/moda-174t.toml" + kSunway +
                                    " --set model.product_keys=0");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("does not fit: needs"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("node has 89.407 GiB"), std::string::npos) << r.output;
    const CommandResult s = bagualu(
        "plan --config configs/tiny.toml --machine machines/sunway-oceanlight.toml "
        "--nodes 1 --ranks-per-node 2 --sweep");
    ASSERT_EQ(s.status, 0) << s.output;
    EXPECT_NE(s.output.find("layouts fit"), std::string::npos) << s.output;
}

TEST(PlanCli, PrecisionOptimizerAndOverlapComeFromTheConfig) {
    const std::string base =
        "plan --config configs/tiny.toml --machine machines/sunway-oceanlight.toml "
        "--nodes 1 --ranks-per-node 2 --json";
    auto run = [&](const std::string& extra) {
        const CommandResult r = bagualu(base + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        return r.status == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
    };
    const auto fp32 = run("");
    ASSERT_TRUE(fp32.contains("layout"));
    // optimizer.partition = "auto": ParO over both ranks; the config's precision is fp32
    EXPECT_EQ(fp32["layout"]["optimizer_shards"], 2);
    EXPECT_EQ(fp32["layout"]["precision"], "fp32");
    EXPECT_EQ(fp32["layout"]["overlap_grad_reduce"], true);
    const auto& kinds = fp32["comm_per_step_per_rank"];
    ASSERT_TRUE(kinds.contains("reduce_scatter") && kinds.contains("all_gather")) << kinds.dump();
    // bf16 under the default levels: the FFN's tensors are gathered as half values
    const auto bf16 = run(" --set precision.dtype=bf16");
    ASSERT_TRUE(bf16.contains("layout"));
    EXPECT_EQ(bf16["layout"]["precision"].get<std::string>().rfind("bf16", 0), 0u)
        << bf16["layout"].dump();
    EXPECT_LT(bf16["comm_per_step_per_rank"]["all_gather"]["bytes"].get<double>(),
              kinds["all_gather"]["bytes"].get<double>());
    const auto off = run(" --set optimizer.partition=off --overlap 0");
    ASSERT_TRUE(off.contains("layout"));
    EXPECT_EQ(off["layout"]["optimizer_shards"], 1);
    EXPECT_FALSE(off["comm_per_step_per_rank"].contains("reduce_scatter"));
    EXPECT_EQ(off["time"]["overlap_s"].get<double>(), 0.0);
    // the precision is the config's: no command-line flag for it
    EXPECT_NE(bagualu(base + " --precision bf16").status, 0);
}

// parallel.a2a_grid on MoDa-1.93T (EP = 19,200 nodes, one rank each, so the leaders' exchange
// is over all of them): rows of one 256-node supernode, 75 columns. By hand from
// machines/sunway-oceanlight.toml: a column call of b bytes crosses supernodes, 74 messages at
// 5 us and 74/75 of b at 25 GB/s / 4; a row call stays inside one, 255 at 2 us and 255/256 of b
// at 25 GB/s.
TEST(PlanCli, GridExchangeAtScale) {
    const std::string base = "plan --config configs/scale/moda-1.93t.toml" + kSunway + " --json";
    auto leaders_seconds   = [&](const std::string& extra, double* flops) {
        const CommandResult r = bagualu(base + extra);
        EXPECT_EQ(r.status, 0) << r.output;
        if (r.status != 0) return 0.0;
        const auto j = nlohmann::json::parse(r.output);
        *flops       = j["sustained_flops"].get<double>();
        double t     = 0;
        for (const auto& c : j["collectives_per_step_per_rank"]) {
            const std::string what = c["what"];
            if (what.find("between node leaders") == std::string::npos) continue;
            t += c["seconds"].get<double>();
            const double calls = c["calls"], b = c["bytes"].get<double>() / calls;
            if (what.find("along columns") != std::string::npos) {
                EXPECT_EQ(c["group_size"], 75);
                EXPECT_NEAR(c["seconds"].get<double>() / calls,
                              74 * 5e-6 + b * 74 / 75 / (25e9 / 4), 1e-9)
                    << what;
            } else if (what.find("along rows") != std::string::npos) {
                EXPECT_EQ(c["group_size"], 256);
                EXPECT_NEAR(c["seconds"].get<double>() / calls, 255 * 2e-6 + b * 255 / 256 / 25e9,
                              1e-9)
                    << what;
            }
        }
        return t;
    };
    double direct_flops = 0, grid_flops = 0;
    const double direct = leaders_seconds(" --set parallel.a2a_grid=0", &direct_flops);
    const double grid   = leaders_seconds(" --set parallel.a2a_grid=256", &grid_flops);
    EXPECT_GT(direct, 0);
    EXPECT_LT(grid, 0.2 * direct);
    EXPECT_GT(grid_flops, direct_flops);
    // rows of gcd(a2a_grid, 19,200): 512 gives 256 again; 7 gives 1, the direct exchange
    double flops = 0;
    EXPECT_EQ(leaders_seconds(" --set parallel.a2a_grid=512", &flops), grid);
    EXPECT_EQ(leaders_seconds(" --set parallel.a2a_grid=7", &flops), direct);
}

TEST(PlanCli, BadMachineFileIsOneLineAndStatus2) {
    TempDir dir;
    write_file(
        dir / "m.toml",
        "[node]\npeak_fp32_gflops = 1\nmemory_gib = 1\nmemory_bandwidth_gbs = 1\nspeed = 3\n");
    const CommandResult r =
        bagualu("plan --config configs/tiny.toml --machine " + (dir / "m.toml"));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("unknown key node.speed"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(dir / "m.toml"), std::string::npos) << r.output;
    std::string line = r.output;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    EXPECT_EQ(line.find('\n'), std::string::npos) << r.output;
    const CommandResult n = bagualu(
        "plan --config configs/tiny.toml --machine machines/sunway-oceanlight.toml --nodes 200000");
    EXPECT_EQ(n.status, 2) << n.output;
    EXPECT_NE(n.output.find("network.total_nodes"), std::string::npos) << n.output;
}

// A machine file of another CPU, or one written by hand, is refused naming the file and both
// machines, and left byte for byte as it was (calibrate keeps the keys it does not measure, so
// the update would mix two machines' figures); under mpirun before any measurement, with one
// message. The file calibrate wrote on this CPU is measured again in place, through a temporary
// file that does not stay behind.
TEST(PlanCli, CalibrateUpdatesOnlyAMachineFileOfThisCpu) {
    TempDir dir;
    const std::string model = kernels::cpu_features().model;
    const std::string cpu   = "\"" + model + "\"";  // as the message quotes it
    auto calibrate          = [](const std::string& file) {
        return fmt::format("cd {} && {} calibrate --seconds 0.001 --out {}", BGL_SOURCE_DIR,
                                    BGL_BINARY, file);
    };
    auto expect_refused = [&](const std::string& cmd, const std::string& file,
                              const std::string& theirs) {
        const std::string before = read_file(file);
        const CommandResult r    = run_command(cmd);
        EXPECT_EQ(r.status, 2) << cmd << "\n" << r.output;
        size_t messages = 0;
        for (size_t p = r.output.find("bagualu: error:"); p != std::string::npos;
             p        = r.output.find("bagualu: error:", p + 1))
            ++messages;
        EXPECT_EQ(messages, 1u) << r.output;
        for (const std::string& n : {file, cpu, theirs, std::string("choose another --out")})
            EXPECT_NE(r.output.find(n), std::string::npos) << "'" << n << "' not in: " << r.output;
        EXPECT_EQ(read_file(file), before) << file << " was changed";
    };

    write_file(dir / "sunway.toml",
               read_file(std::string(BGL_SOURCE_DIR) + "/machines/sunway-oceanlight.toml"));
    expect_refused(calibrate(dir / "sunway.toml"), dir / "sunway.toml",
                   "\"sunway-oceanlight\", no cpu_model");

    const std::string own     = dir / "own.toml";
    const CommandResult first = run_command(calibrate(own));
    ASSERT_EQ(first.status, 0) << first.output;
    std::string other = read_file(own);
    ASSERT_NE(other.find("cpu_model = '" + model + "'"), std::string::npos) << other;
    other.replace(other.find(model), model.size(), "Other CPU 9000");
    write_file(dir / "other.toml", other);
    expect_refused(calibrate(dir / "other.toml"), dir / "other.toml", "CPU \"Other CPU 9000\"");
    expect_refused(fmt::format("cd {} && timeout 60 {} --allow-run-as-root --oversubscribe -np 2 "
                               "{} calibrate --out {}",
                               BGL_SOURCE_DIR, BGL_MPIEXEC, BGL_BINARY, dir / "other.toml"),
                   dir / "other.toml", "CPU \"Other CPU 9000\"");

    const CommandResult again = run_command(calibrate(own));
    ASSERT_EQ(again.status, 0) << again.output;
    EXPECT_NE(read_file(own).find("cpu_model = '" + model + "'"), std::string::npos);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir.str()))
        files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, (std::vector<std::string>{"other.toml", "own.toml", "sunway.toml"}));
}

// The machine file names the kernel whose packing buffers the planner counts: under BGL_GEMM=auto
// and onednn the best of ours (which they run for some or all of the products), not "auto" or
// "onednn", which the planner would read as its own CPU's kernel or as none.
TEST(PlanCli, CalibrateRecordsTheKernelItsRunsPack) {
    TempDir dir;
    const std::string ours = kernels::gemm::path_name(kernels::gemm::best_path());
    for (const char* env : {"auto", "onednn", ""}) {
        const std::string file = dir / (std::string("m-") + env + ".toml");
        const CommandResult r  = run_command(
             fmt::format("cd {} && {}{} calibrate --seconds 0.001 --out {}", BGL_SOURCE_DIR,
                        *env ? fmt::format("BGL_GEMM={} ", env) : std::string(), BGL_BINARY, file));
        ASSERT_EQ(r.status, 0) << env << "\n" << r.output;
        const std::string text = read_file(file);
        EXPECT_NE(text.find("gemm_path = '" + ours + "'"), std::string::npos)
            << "BGL_GEMM=" << env << ":\n"
            << text;
        // the bf16 products' own efficiency at every size, against the 16-bit peak
        const plan::MachineSpec m = plan::load_machine(file);
        EXPECT_EQ(m.node.half_gemm_efficiency.size(), m.node.gemm_sizes.size()) << text;
        EXPECT_GT(m.node.peak_half_gflops, 0) << text;
    }
    // where the bf16 products widen (avx2), they run on the float FMAs: the file's 16-bit peak
    // is the float one, whatever 16-bit instructions the CPU has
    if (!kernels::gemm::path_supported(kernels::gemm::Path::avx2)) return;
    const std::string file = dir / "m-avx2.toml";
    const CommandResult r =
        run_command(fmt::format("cd {} && BGL_GEMM=avx2 {} calibrate --seconds 0.001 --out {}",
                                BGL_SOURCE_DIR, BGL_BINARY, file));
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string text = read_file(file);
    const auto value       = [&](const std::string& key) {
        const size_t at = text.find(key + " = ");
        return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size() + 3));
    };
    EXPECT_GT(value("peak_fp32_gflops"), 0) << text;
    EXPECT_EQ(value("peak_half_gflops"), value("peak_fp32_gflops")) << text;
    EXPECT_NE(text.find("gemm_path = 'avx2'"), std::string::npos) << text;
}

}  // namespace
}  // namespace bagualu::testing

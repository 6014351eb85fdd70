// `bagualu bench` through the binary: kernels, train and io print one parseable JSON object with
// the documented keys, train's phase fractions add up to one, io cleans up after itself, and bad
// arguments exit 2 with one line (under mpirun, once).
// Kept fast: the tiny config, one repeat, two timed steps on token shards written directly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <vector>

#include "../common/expect_error.h"
#include "../common/run_command.h"
#include "data/token_file.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/grouped_gemm.h"
#include "kernels/mixed.h"

namespace bagualu::testing {
namespace {

// The JSON object in a command's output: from the first '{' on a line of its own to the end.
nlohmann::json json_of(const std::string& output) {
    const size_t start = output.find("{\n");
    if (start == std::string::npos) return nlohmann::json::parse(output);
    return nlohmann::json::parse(output.substr(start));
}

TEST(BenchCli, KernelsJsonHasPeakAndModelShapes) {
    const CommandResult r = bagualu(
        "bench kernels --json --repeats 1 --config configs/tiny.toml --filter \"qkv\" "
        "--standalone-check");
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);
    for (const char* key : {"backend", "threads", "peak_fp32_gflops", "peak_fp32_isa",
                            "peak_bf16_gflops", "gemm", "cpu_model", "half_features",
                            "onednn_version", "peak_bf16_dot_gflops", "peak_amx_bf16_gflops"}) {
        EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_GT(j["peak_fp32_gflops"].get<double>(), 0.0);
    // The 16-bit peak is the better of the dot-product loop and AMX.
    EXPECT_EQ(
        j["peak_bf16_gflops"].get<double>(),
        std::max(j["peak_bf16_dot_gflops"].get<double>(), j["peak_amx_bf16_gflops"].get<double>()));
    ASSERT_EQ(j["gemm"].size(), 6u);  // qkv fwd, dinp, dw in f32 and bf16
    bool qkv_fwd = false, qkv_dw = false;
    for (const auto& g : j["gemm"]) {
        for (const char* key :
             {"name", "m", "n", "k", "trans", "dtype", "ours_gflops", "onednn_gflops",
              "onednn_omp_gflops", "onednn_standalone_gflops", "openblas_gflops"}) {
            EXPECT_TRUE(g.contains(key)) << key;
        }
        // With --standalone-check the child's number is there wherever oneDNN ran here.
        EXPECT_EQ(g["onednn_omp_gflops"].is_null(), g["onednn_standalone_gflops"].is_null());
        EXPECT_GT(g["ours_gflops"].get<double>(), 0.0);
        // tiny: micro-batch 4 x 64 tokens = 256 rows, d_model 64
        if (g["name"] == "qkv fwd" && g["dtype"] == "f32") {
            qkv_fwd = g["m"] == 256 && g["n"] == 192 && g["k"] == 64 && g["trans"] == "NT";
        }
        if (g["name"] == "qkv dw") {
            qkv_dw = g["m"] == 192 && g["n"] == 64 && g["k"] == 256 && g["trans"] == "TN";
        }
    }
    EXPECT_TRUE(qkv_fwd);
    EXPECT_TRUE(qkv_dw);
    // the grouped GEMM's two cases (8 experts of Zipf rows, one expert) x two products
    ASSERT_EQ(j["grouped_gemm"].size(), 4u);
    EXPECT_EQ(j["grouped_gemm"][0]["experts"], 8);
    EXPECT_EQ(j["grouped_gemm"][2]["experts"], 1);
    EXPECT_EQ(j["grouped_gemm"][2]["tokens_per_expert"], "2048");
    for (const auto& g : j["grouped_gemm"]) EXPECT_GT(g["grouped_gflops"].get<double>(), 0.0);
    // bf16 products of float weights, narrowed first and packed from the floats, both ways of
    // storing B: where the bf16 kernel packs floats (all of ours but the generic one, under the
    // default backend)
    ASSERT_TRUE(j.contains("float_b"));
    const bool float_b =
        bagualu::kernels::gemm_bf16_float_b() && bagualu::kernels::grouped_gemm_bf16_float_b();
    EXPECT_EQ(j["float_b"].size(), float_b ? 4u : 0u);
    for (const auto& f : j["float_b"]) {
        EXPECT_GT(f["narrowed_ms"].get<double>(), 0.0);
        EXPECT_GT(f["float_b_ms"].get<double>(), 0.0);
    }
    // the router's ranking, ours and the generic insertion's, up to the whole row of 256
    ASSERT_FALSE(j["rank_rows"].empty());
    for (const auto& rank : j["rank_rows"]) {
        EXPECT_GT(rank["ns_per_row"].get<double>(), 0.0);
        EXPECT_GT(rank["generic_ns_per_row"].get<double>(), 0.0);
        EXPECT_LE(rank["top"].get<int>(), rank["experts"].get<int>());
    }
    // a fine-grained layer's experts, each whole on one thread and in passes over all experts
    const auto& mlp = j["experts_mlp"];
    EXPECT_EQ(mlp["experts"], 64);
    EXPECT_EQ(mlp["width"], 96);
    EXPECT_TRUE(mlp["whole"].get<bool>());
    for (const char* key :
         {"whole_forward_ms", "whole_backward_ms", "passes_forward_ms", "passes_backward_ms"})
        EXPECT_GT(mlp[key].get<double>(), 0.0) << key;
    // the attention core on one micro-batch; tiny's head size 16 is not the tiles'
    const auto& a = j["attention"];
    EXPECT_EQ(a["B"], 4);
    EXPECT_EQ(a["T"], 64);
    EXPECT_EQ(a["C"], 64);
    EXPECT_EQ(a["NH"], 4);
    EXPECT_GT(a["forward_ms"].get<double>(), 0.0);
    EXPECT_GT(a["backward_ms"].get<double>(), 0.0);
    for (const char* key :
         {"tiles_forward_ms", "tiles_backward_ms", "dots_forward_ms", "dots_backward_ms"}) {
        EXPECT_TRUE(a[key].is_null()) << key << " " << a.dump();
    }
}

// BGL_GEMM naming one of our kernels makes it "ours", timed against its own float peak: on a CPU
// with AVX-512, BGL_GEMM=avx2 measures the AVX2 kernels as an AVX2-only CPU would run them.
TEST(BenchCli, KernelsTimeTheKernelsBglGemmNames) {
    if (!kernels::gemm::path_supported(kernels::gemm::Path::avx2)) {
        GTEST_SKIP() << "needs AVX2+FMA";
    }
    const CommandResult r =
        run_command(std::string("cd ") + BGL_SOURCE_DIR + " && BGL_GEMM=avx2 " + BGL_BINARY +
                    " bench kernels --json --repeats 1 --config configs/tiny.toml --filter qkv");
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);
    EXPECT_EQ(j["backend"], "avx2");
    EXPECT_EQ(j["ours"], "avx2");
    EXPECT_EQ(j["peak_fp32_isa"], "avx2");
}

size_t count(const std::string& s, const std::string& needle) {
    size_t n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
}

// A filter that selects no GEMM would print empty tables and succeed.
TEST(BenchCli, KernelsFilterMatchingNothingListsWhatItCanMatch) {
    expect_one_line_error(
        "bench kernels --repeats 1 --config configs/tiny.toml --filter nomatch",
        {"--filter \"nomatch\": matches no GEMM", "\"square\"", "\"qkv fwd\"", "\"lm head dw\""});
}

// Sizes whose byte counts wrap, or whose buffers exceed this machine's memory, are refused before
// any buffer is allocated; under mpirun with one message, not one per rank.
TEST(BenchCli, CommSizesBeyondByteCountsOrMemoryAreRefusedOnce) {
    // counts that would wrap: 17179869184G (2^64) to 0, 99999999999G to some other size
    expect_one_line_error("bench comm --sizes 4K 17179869184G",
                          {"--sizes 17179869184G", "64-bit byte count"});
    expect_one_line_error("bench comm --sizes 4K 99999999999G",
                          {"--sizes 99999999999G", "64-bit byte count"});
    expect_one_line_error("bench comm --sizes 4K 99999999999999999999", {"64-bit byte count"});
    expect_one_line_error("bench comm --sizes 4K 4294967295G",
                          {"--sizes 4K 4294967295G", "64-bit byte count"});
    // 1 TiB a rank: 5 TiB of buffers on one rank (4.5 TiB each on two), more than this machine has
    expect_one_line_error("bench comm --sizes 4K 1024G",
                          {"--sizes 4K 1024G", "5120.0 GiB per rank", "GiB available"});
    const CommandResult r = run_command(fmt::format(
        "cd {} && timeout 60 {} --allow-run-as-root --oversubscribe -np 2 {} bench comm --sizes 4K "
        "1024G",
        BGL_SOURCE_DIR, BGL_MPIEXEC, BGL_BINARY));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(count(r.output, "4608.0 GiB per rank"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "out of memory"), 0u) << r.output;
}

// A small token corpus in dir and the --set arguments that train configs/tiny.toml on it.
std::string tiny_corpus(const TempDir& dir) {
    std::vector<int32_t> tokens(4000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 97);
    data::write_token_file(dir / "train.bin", tokens, 128);
    data::write_token_file(dir / "val.bin", tokens, 128);
    return " --set model.vocab_size=128 --set data.train=" + (dir / "train.bin") +
           " --set data.val=" + (dir / "val.bin") + " --set data.tokenizer=" + (dir / "none.model");
}

// In bf16 with a head size of 32 the attention core runs on the unit of the GEMM path's bf16
// products where it has one (kernels::half_attention, asked in this process: same CPU and
// BGL_GEMM), float32 elsewhere.
TEST(BenchCli, TrainJsonNamesTheAttentionCore) {
    TempDir dir;
    const std::string data = tiny_corpus(dir) + " --set train.run_dir=" + (dir / "run");
    const CommandResult r  = bagualu(
         "bench train --config configs/tiny.toml --steps 1 --warmup 0 --json --set "
          "precision.dtype=bf16 --set model.n_head=2" +
         data);
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);
    namespace k            = bagualu::kernels;
    const auto h           = k::half_attention(bagualu::Dtype::bfloat16, 32);
    EXPECT_EQ(j["attention_core"].get<std::string>(),
              h == k::HalfAttention::none
                  ? fmt::format("float32 ({})", k::isa_name(k::dispatch().attention_isa))
                  : fmt::format("bf16 on {}", k::half_attention_name(h)));
    // the bf16 head forms its gradient in forward, told the backward's scale by the trainer: no
    // backward computes the logits again
    EXPECT_EQ(j["lm_head"].get<std::string>().rfind("16-bit gradient formed in forward", 0), 0u)
        << j["lm_head"];
    EXPECT_EQ(j["head_recomputes"].get<int64_t>(), 0);
}

TEST(BenchCli, TrainJsonReportsThroughputMemoryAndPhases) {
    TempDir dir;
    const std::string data = tiny_corpus(dir) + " --set train.run_dir=" + (dir / "run");
    const CommandResult r =
        bagualu("bench train --config configs/tiny.toml --steps 2 --warmup 1 --json" + data);
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);  // nothing but the JSON on stdout
    for (const char* key :
         {"tokens_per_s", "mfu", "model_gflops", "peak_gflops", "peak_rss_mb", "phases",
          "cpu_model", "half_features", "gemm_backends", "bf16_gemm_as_f32", "attention_core"}) {
        ASSERT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j["attention_core"].get<std::string>().rfind("float32 (", 0), 0u)
        << j["attention_core"];
    EXPECT_EQ(j["lm_head"].get<std::string>(), "float logits");
    // Every GEMM of the step names its phase and, without BGL_GEMM, the default backend's kernel
    // (on the amx path: amx for bf16 products, avx512 for float ones). The default backend
    // widens bf16 to float exactly where the CPU has no AVX512_BF16.
    EXPECT_EQ(j["bf16_gemm_as_f32"].get<bool>(), !bagualu::kernels::cpu_features().avx512_bf16)
        << j["gemm_backend"];
    ASSERT_FALSE(j["gemm_backends"].empty());
    const bool amx = j["gemm_backend"] == "amx";
    for (const auto& g : j["gemm_backends"]) {
        EXPECT_TRUE(g.contains("phase") && g.contains("gemm")) << g.dump();
        const bool expert = g["phase"] == "experts";
        EXPECT_EQ(g["f32"], amx ? "avx512" : j["gemm_backend"]) << g.dump();
        if (amx) {
            EXPECT_EQ(g["bf16"], expert ? "amx (bf16 grouped)" : "amx") << g.dump();
        }
    }
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["mfu"].get<double>(), 0.0);
    EXPECT_LT(j["mfu"].get<double>(), 1.5);
    EXPECT_GT(j["peak_rss_mb"].get<double>(), 1.0);
    double sum = 0;
    for (const char* phase : {"attention", "mlp", "experts", "gate_dispatch", "lm_head",
                              "optimizer", "data", "other"}) {
        ASSERT_TRUE(j["phases"].contains(phase)) << phase;
        EXPECT_GE(j["phases"][phase]["fraction"].get<double>(), 0.0) << phase;
        EXPECT_GE(j["phases"][phase]["s_per_step"].get<double>(), 0.0) << phase;
        sum += j["phases"][phase]["fraction"].get<double>();
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_GT(j["phases"]["attention"]["fraction"].get<double>(), 0.0);
    EXPECT_GT(j["phases"]["experts"]["fraction"].get<double>(), 0.0);
    ASSERT_TRUE(j.contains("data_wait_fraction"));
    EXPECT_GE(j["data_wait_fraction"].get<double>(), 0.0);
    EXPECT_LT(j["data_wait_fraction"].get<double>(), 1.0);
    EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "bench train writes nothing";
    // train.recompute: named, and the forward run again is timed (tiny: block 0 of 2)
    EXPECT_EQ(j["recompute"], "none");
    EXPECT_EQ(j["recompute_s_per_step"].get<double>(), 0.0);
    const CommandResult rb = bagualu(
        "bench train --config configs/tiny.toml --steps 2 --warmup 1 "
        "--json --set train.recompute=block" +
        data);
    ASSERT_EQ(rb.status, 0) << rb.output;
    const nlohmann::json jb = json_of(rb.output);
    EXPECT_EQ(jb["recompute"], "block");
    EXPECT_GT(jb["recompute_s_per_step"].get<double>(), 0.0);
}

TEST(BenchCli, TrainCompareTimesSettingsInTurnAgainstTheFirst) {
    // Two settings, the second with twice the tokens per step: each setting's speed against the
    // first is the ratio of tokens/s within a round, its median over the rounds is reported, and
    // a setting's overrides (two, separated by ';') come after --set.
    TempDir dir;
    const std::string data = tiny_corpus(dir) + " --set train.run_dir=" + (dir / "run");
    const CommandResult r  = bagualu(
         "bench train --config configs/tiny.toml --steps 1 --warmup 1 --repeats 3 --json "
          "--set model.top_k=1 --compare precision.dtype=fp32 "
          "--compare \"train.batch_size=16; precision.dtype=bf16\"" +
         data);
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);
    for (const char* key : {"cpu_model", "half_features", "rounds", "settings"}) {
        ASSERT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j["rounds"], 3);
    ASSERT_EQ(j["settings"].size(), 2u);
    const auto& first = j["settings"][0];
    const auto& bf16  = j["settings"][1];
    EXPECT_EQ(first["setting"], "precision.dtype=fp32");
    EXPECT_EQ(bf16["setting"], "train.batch_size=16; precision.dtype=bf16");
    EXPECT_EQ(first["tokens_per_step"].get<double>(), 8.0 * 64);
    EXPECT_EQ(bf16["tokens_per_step"].get<double>(), 16.0 * 64);
    for (const auto& s : j["settings"]) {
        ASSERT_EQ(s["step_s_rounds"].size(), 3u) << s.dump();
        ASSERT_EQ(s["speedup_vs_first_rounds"].size(), 3u) << s.dump();
        EXPECT_GT(s["step_s_median"].get<double>(), 0.0);
        EXPECT_NEAR(s["tokens_per_s"].get<double>(),
                    s["tokens_per_step"].get<double>() / s["step_s_median"].get<double>(), 1e-6);
        for (const char* phase : {"attention", "mlp", "experts", "gate_dispatch", "lm_head",
                                  "optimizer", "data", "other"}) {
            EXPECT_GE(s["phases_s_per_step"][phase].get<double>(), 0.0) << phase;
        }
    }
    std::vector<double> speedup;
    for (int round = 0; round < 3; ++round) {
        EXPECT_EQ(first["speedup_vs_first_rounds"][round].get<double>(), 1.0);
        const double mine = bf16["step_s_rounds"][round].get<double>();
        const double base = first["step_s_rounds"][round].get<double>();
        EXPECT_NEAR(bf16["speedup_vs_first_rounds"][round].get<double>(), 2.0 * base / mine, 1e-9);
        speedup.push_back(2.0 * base / mine);
    }
    std::sort(speedup.begin(), speedup.end());
    EXPECT_NEAR(bf16["speedup_vs_first_median"].get<double>(), speedup[1], 1e-9);
    // no 95% interval of a median from 3 rounds (the widest, [min, max], covers 75%)
    EXPECT_TRUE(bf16["speedup_vs_first_ci95"].is_null()) << bf16.dump();
    EXPECT_TRUE(bf16["step_ratio_vs_first_ci95"].is_null()) << bf16.dump();
    // the settings trained what they say: the same batch twice as large is another loss
    EXPECT_NE(first["final_loss_rounds"][0], bf16["final_loss_rounds"][0]);
    EXPECT_EQ(first["final_loss_rounds"][0], first["final_loss_rounds"][2]);
    EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "bench train writes nothing";

    const CommandResult table = bagualu(
        "bench train --config configs/tiny.toml --steps 1 --warmup 0 --repeats 1 "
        "--compare model.top_k=1 --compare model.top_k=2" +
        data);
    ASSERT_EQ(table.status, 0) << table.output;
    EXPECT_NE(table.output.find("#2 model.top_k=2"), std::string::npos) << table.output;
    EXPECT_NE(table.output.find("need at least 6 rounds"), std::string::npos) << table.output;
    EXPECT_NE(table.output.find("ms per step (median over rounds)"), std::string::npos)
        << table.output;

    // 6 rounds: the 95% interval of each ratio's median is the rounds' [min, max] (coverage
    // 1 - 2/64), the median's own rounds inside it
    const CommandResult six = bagualu(
        "bench train --config configs/tiny.toml --steps 1 --warmup 0 --repeats 6 --json "
        "--compare model.top_k=1 --compare model.top_k=2" +
        data);
    ASSERT_EQ(six.status, 0) << six.output;
    const nlohmann::json second = json_of(six.output)["settings"][1];
    std::vector<double> ratios;
    for (int round = 0; round < 6; ++round) {
        ratios.push_back(second["step_s_rounds"][round].get<double>() /
                         json_of(six.output)["settings"][0]["step_s_rounds"][round].get<double>());
    }
    const auto [lo, hi]      = std::minmax_element(ratios.begin(), ratios.end());
    const nlohmann::json& ci = second["step_ratio_vs_first_ci95"];
    ASSERT_EQ(ci.size(), 2u) << second.dump();
    EXPECT_NEAR(ci[0].get<double>(), *lo, 1e-12);
    EXPECT_NEAR(ci[1].get<double>(), *hi, 1e-12);
    ASSERT_EQ(second["speedup_vs_first_ci95"].size(), 2u) << second.dump();
    EXPECT_NEAR(second["speedup_vs_first_ci95"][0].get<double>(), 1 / *hi, 1e-9);
}

TEST(BenchCli, TrainMfuIsTakenAgainstThePeakOfThePathUsed) {
    // fp32: the float FMA peak; bf16: the peak of the 16-bit arithmetic the products run on
    // under the default backend (AMX tiles where the CPU has them, else AVX512_BF16's
    // vdpbf16ps), else the float one. Both MFUs are reported, and they are the same model
    // GFLOP/s over the two peaks.
    TempDir dir;
    const std::string data = tiny_corpus(dir);
    const bool amx = bagualu::kernels::gemm::path_supported(bagualu::kernels::gemm::Path::amx);
    const bool dot = amx || bagualu::kernels::cpu_features().avx512_bf16;
    for (const char* dtype : {"fp32", "bf16"}) {
        SCOPED_TRACE(dtype);
        const CommandResult r = bagualu(
            std::string("bench train --config configs/tiny.toml --steps 1 --warmup 1 --json "
                        "--set precision.dtype=") +
            dtype + data);
        ASSERT_EQ(r.status, 0) << r.output;
        const nlohmann::json j = json_of(r.output);
        const bool half16      = std::string(dtype) == "bf16" && dot;
        EXPECT_EQ(j["peak_path"], !half16 ? "fp32 fma"
                                  : amx   ? "bf16 amx"
                                          : "bf16 vdpbf16ps")
            << j["gemm_backend"];
        const double gf = j["model_gflops"].get<double>();
        EXPECT_NEAR(j["mfu"].get<double>(), gf / j["peak_gflops"].get<double>(), 1e-9);
        EXPECT_NEAR(j["mfu_f32"].get<double>(), gf / j["peak_gflops_f32"].get<double>(), 1e-9);
        if (!half16) {
            EXPECT_EQ(j["peak_gflops"].get<double>(), j["peak_gflops_f32"].get<double>());
        }
    }
}

TEST(BenchCli, IoReportsWriteAndReadRatiosAndCleansUp) {
    TempDir dir;
    const CommandResult r = bagualu("bench io --mib 1 --repeats 1 --json --dir " + dir.str());
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = json_of(r.output);
    for (const char* key :
         {"bytes", "tensors", "repeats", "write_checkpoint_mbs", "write_plain_mbs", "write_ratio",
          "read_checkpoint_mbs", "read_plain_mbs", "read_ratio"}) {
        ASSERT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j["bytes"], 1 << 20);
    EXPECT_GT(j["tensors"].get<int>(), 10);
    for (const char* key : {"write_checkpoint_mbs", "write_plain_mbs", "write_ratio",
                            "read_checkpoint_mbs", "read_plain_mbs", "read_ratio"}) {
        EXPECT_GT(j[key].get<double>(), 0.0) << key;
    }
    // ratio = checkpoint MB/s over plain MB/s (rounding aside)
    EXPECT_NEAR(j["write_ratio"].get<double>(),
                j["write_checkpoint_mbs"].get<double>() / j["write_plain_mbs"].get<double>(), 1e-9);
    EXPECT_TRUE(std::filesystem::is_empty(dir.str()))
        << "bench io leaves its scratch directory behind";

    const CommandResult table = bagualu("bench io --mib 1 --repeats 1 --dir " + dir.str());
    ASSERT_EQ(table.status, 0) << table.output;
    EXPECT_NE(table.output.find("write ratio checkpoint/plain:"), std::string::npos)
        << table.output;
    EXPECT_NE(table.output.find("read ratio checkpoint/plain:"), std::string::npos) << table.output;
}

TEST(BenchCli, UnknownGemmBackendIsOneLineExitTwo) {
    const CommandResult r =
        run_command(std::string("cd ") + BGL_SOURCE_DIR + " && BGL_GEMM=turbo " + BGL_BINARY +
                    " bench kernels --repeats 1 --filter qkv");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("BGL_GEMM=turbo"), std::string::npos) << r.output;
    std::string line = r.output;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    EXPECT_EQ(line.find('\n'), std::string::npos) << r.output;
}

TEST(BenchCli, BadArgumentsExitTwoWithOneLine) {
    for (const char* args :
         {"bench", "bench nope", "bench train", "bench train --config configs/tiny.toml --steps 0",
          "bench kernels --repeats 0", "bench comm --sizes 4K", "bench comm --sizes 4Q 1M",
          "bench comm --sizes 1M 4K", "bench io --mib 0", "bench io --repeats 0",
          "bench io --dir /nonexistent/dir",
          "bench train --config configs/tiny.toml --compare precision.dtype=fp32",
          "bench train --config configs/tiny.toml --compare model.top_k --compare model.top_k=1",
          "bench train --config configs/tiny.toml --compare model.nope=1 --compare model.top_k=1",
          "bench train --config configs/tiny.toml --compare model.top_k=1 --compare "
          "model.top_k=2 --compare-overlap",
          "bench train --config configs/tiny.toml --isolate"}) {
        expect_one_line_error(args, {});
    }
}

// A setting is SECTION.KEY=VALUE items separated by ';', each key once: the same key twice would
// silently time the last value only.
TEST(BenchCli, CompareSettingSetsEachKeyOnce) {
    TempDir dir;
    const std::string base =
        "bench train --config configs/tiny.toml --steps 1 --warmup 0 --repeats 1" +
        tiny_corpus(dir) + " --compare model.top_k=1 --compare ";
    expect_one_line_error(
        base + "\"model.top_k=1;model.top_k=2\"",
        {"--compare \"model.top_k=1;model.top_k=2\"", "model.top_k is set twice"});
    expect_one_line_error(base + "\"model.top_k=1; precision.dtype=bf16; model.top_k =2\"",
                          {"model.top_k is set twice"});
    for (const char* bad : {"=2", "\" = 2\"", "model.top_k", "top_k=2", ".top_k=2", "model.=2",
                            "\"model. =2\"", "\"model.top_k=2;\"", "\";\""}) {
        expect_one_line_error(base + bad, {"--compare", "expected SECTION.KEY=VALUE"});
    }
}

// --isolate: each run is a process of this binary with the setting's config, so each setting's
// losses are the in-process runs' to the last bit, and its peak RSS is its own; a run that fails
// is one line naming the setting and the run's own error; under mpirun it is refused at once.
TEST(BenchCli, TrainCompareIsolatedRunsEachSettingInAProcessOfItsOwn) {
    TempDir dir;
    const std::string args =
        "bench train --config configs/tiny.toml --steps 1 --warmup 1 --repeats 2 --json "
        "--compare model.top_k=1 --compare \"model.top_k=2;train.batch_size=16\"" +
        tiny_corpus(dir);
    const CommandResult in_process = bagualu(args);
    const CommandResult isolated   = bagualu(args + " --isolate");
    ASSERT_EQ(in_process.status, 0) << in_process.output;
    ASSERT_EQ(isolated.status, 0) << isolated.output;
    const nlohmann::json a = json_of(in_process.output), b = json_of(isolated.output);
    EXPECT_EQ(a["isolated"], false);
    EXPECT_EQ(b["isolated"], true);
    for (size_t v = 0; v < 2; ++v) {
        const nlohmann::json& s = b["settings"][v];
        EXPECT_EQ(s["final_loss_rounds"], a["settings"][v]["final_loss_rounds"]) << v;
        EXPECT_FALSE(a["settings"][v].contains("peak_rss_mb_rounds"));
        ASSERT_EQ(s["peak_rss_mb_rounds"].size(), 2u) << s.dump();
        for (const auto& mb : s["peak_rss_mb_rounds"]) EXPECT_GT(mb.get<double>(), 1.0);
        EXPECT_TRUE(s["rss_ratio_vs_first_ci95"].is_null());  // 2 rounds
    }
    EXPECT_NE(b["settings"][0]["final_loss_rounds"][0], b["settings"][1]["final_loss_rounds"][0]);
    EXPECT_EQ(b["settings"][0]["rss_ratio_vs_first_median"].get<double>(), 1.0);
    const double r0 = b["settings"][1]["peak_rss_mb_rounds"][0].get<double>() /
                      b["settings"][0]["peak_rss_mb_rounds"][0].get<double>();
    const double r1 = b["settings"][1]["peak_rss_mb_rounds"][1].get<double>() /
                      b["settings"][0]["peak_rss_mb_rounds"][1].get<double>();
    EXPECT_NEAR(b["settings"][1]["rss_ratio_vs_first_median"].get<double>(), (r0 + r1) / 2, 1e-9);

    // the settings' configs go under TMPDIR, and leave nothing there when a run fails
    std::filesystem::create_directory(dir / "tmp");
    const std::string failing =
        "bench train --config configs/tiny.toml --steps 1 --warmup 0 --repeats 1 --isolate" +
        tiny_corpus(dir) + " --compare model.top_k=1 --compare data.train=" + (dir / "nope.bin");
    expect_one_line_error(
        run_command(fmt::format("cd {} && TMPDIR={} {} {}", BGL_SOURCE_DIR, dir / "tmp", BGL_BINARY,
                                failing)),
        failing,
        {"setting \"data.train=" + (dir / "nope.bin") + "\" failed in its process (exit status 2)",
         (dir / "nope.bin") + ": cannot open token file"});
    EXPECT_TRUE(std::filesystem::is_empty(dir / "tmp"));
    const CommandResult r = run_command(fmt::format(
        "cd {} && timeout 60 {} --allow-run-as-root --oversubscribe -np 1 {} bench train --config "
        "configs/tiny.toml --isolate --compare model.top_k=1 --compare model.top_k=2{}",
        BGL_SOURCE_DIR, BGL_MPIEXEC, BGL_BINARY, tiny_corpus(dir)));
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_EQ(count(r.output, "bagualu: error:"), 1u) << r.output;
    EXPECT_NE(r.output.find("run it without mpirun"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bagualu::testing

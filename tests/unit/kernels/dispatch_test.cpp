// Tests for kernels/dispatch.h: what each ISA's table points to, how BGL_ISA is read (names,
// unknown values and ISAs the CPU lacks, checked against made-up CPUs), switching the active
// table, and that BGL_ISA reaches a real run: `bagualu train` under BGL_ISA=generic logs the
// generic path for every family, and an unknown value ends it with a one-line error and status
// 2. The kernels themselves are tested per ISA in ops_test.cpp.
#include "kernels/dispatch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../common/run_command.h"
#include "core/error.h"
#include "data/token_file.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels {
namespace {

constexpr Isa kIsas[] = {Isa::generic, Isa::avx2, Isa::avx512};

CpuFeatures cpu_with(bool avx2, bool avx512) {
    CpuFeatures f;
    f.avx2_fma = avx2;
    f.avx512   = avx512;
    return f;
}

// The message of the InputError isa_from_env(value, cpu) throws, or "" when it returns.
std::string env_error(const char* value, const CpuFeatures& cpu) {
    try {
        isa_from_env(value, cpu);
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(Dispatch, GenericTableRunsOnlyPortableKernels) {
    const KernelTable& t = kernel_table(Isa::generic);
    EXPECT_EQ(t.isa, Isa::generic);
    EXPECT_EQ(t.layernorm_forward_rows, &generic::layernorm_forward_rows);
    EXPECT_EQ(t.layernorm_backward, &generic::layernorm_backward);
    EXPECT_EQ(t.gelu_forward, &generic::gelu_forward_range);
    EXPECT_EQ(t.gelu_backward, &generic::gelu_backward_range);
    EXPECT_EQ(t.attention_forward, &generic::attention_forward);
    EXPECT_EQ(t.attention_backward, &generic::attention_backward);
    EXPECT_EQ(t.crossentropy_forward, &generic::crossentropy_forward_rows);
    EXPECT_EQ(t.crossentropy_backward, &generic::crossentropy_backward_rows);
    EXPECT_EQ(t.adamw_range, &generic::adamw_update_range);
    EXPECT_EQ(t.bf16_narrow, &generic::bf16_narrow_range);
    EXPECT_EQ(t.bf16_narrow_scaled, &generic::bf16_narrow_scaled);
    EXPECT_EQ(t.bf16_round, &generic::bf16_round_range);
    EXPECT_EQ(t.bf16_round_stream, &generic::bf16_round_range);
    EXPECT_EQ(t.bf16_widen, &generic::bf16_widen_range);
    EXPECT_EQ(t.bf16_bias_round, &generic::bf16_bias_round);
    EXPECT_EQ(t.col_sums_f64, &generic::col_sums_f64);
    EXPECT_EQ(t.col_sums_f64_bf16, &generic::col_sums_f64_bf16);
    EXPECT_EQ(t.scaled_rows_and_dots, &generic::scaled_rows_and_dots);
    EXPECT_EQ(t.scaled_rows_and_dots_bf16, &generic::scaled_rows_and_dots_bf16);
    EXPECT_EQ(t.rank_rows, &generic::rank_rows);
    EXPECT_EQ(t.exp_f64, &generic::exp_f64);
    EXPECT_EQ(t.weighted_row_sum, &generic::weighted_row_sum);
    EXPECT_EQ(t.add_row_sum, &generic::add_row_sum);
    for (Isa f : {t.layernorm_isa, t.gelu_isa, t.attention_isa, t.crossentropy_isa, t.adamw_isa,
                  t.convert_isa, t.rows_isa, t.exp_isa}) {
        EXPECT_EQ(f, Isa::generic);
    }
}

TEST(Dispatch, EveryTableIsCompleteAndNoWiderThanItsIsa) {
    for (Isa isa : kIsas) {
        SCOPED_TRACE(isa_name(isa));
        const KernelTable& t = kernel_table(isa);
        EXPECT_EQ(t.isa, isa);
        EXPECT_TRUE(t.layernorm_forward_rows && t.layernorm_backward && t.gelu_forward &&
                    t.gelu_backward && t.attention_forward && t.attention_backward &&
                    t.crossentropy_forward && t.crossentropy_backward && t.adamw_range &&
                    t.bf16_narrow && t.bf16_narrow_scaled && t.bf16_round && t.bf16_round_stream &&
                    t.bf16_widen && t.bf16_bias_round && t.col_sums_f64 && t.col_sums_f64_bf16 &&
                    t.scaled_rows_and_dots && t.scaled_rows_and_dots_bf16 && t.rank_rows &&
                    t.exp_f64 && t.weighted_row_sum && t.add_row_sum && t.bias_add &&
                    t.zero_stream);
        for (Isa f : {t.layernorm_isa, t.gelu_isa, t.attention_isa, t.crossentropy_isa, t.adamw_isa,
                      t.convert_isa, t.rows_isa, t.exp_isa}) {
            EXPECT_LE(int(f), int(isa)) << isa_name(f);
        }
        // A family that runs generic code points at the generic kernel, and the other way round.
        EXPECT_EQ(t.attention_isa == Isa::generic,
                  t.attention_forward == &generic::attention_forward);
        EXPECT_EQ(t.crossentropy_isa == Isa::generic,
                  t.crossentropy_forward == &generic::crossentropy_forward_rows);
        EXPECT_EQ(t.layernorm_isa == Isa::generic,
                  t.layernorm_forward_rows == &generic::layernorm_forward_rows);
        EXPECT_EQ(t.gelu_isa == Isa::generic, t.gelu_forward == &generic::gelu_forward_range);
        EXPECT_EQ(t.adamw_isa == Isa::generic, t.adamw_range == &generic::adamw_update_range);
        EXPECT_EQ(t.convert_isa == Isa::generic, t.bf16_narrow == &generic::bf16_narrow_range);
        EXPECT_EQ(t.convert_isa == Isa::generic,
                  t.bf16_narrow_scaled == &generic::bf16_narrow_scaled);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.col_sums_f64 == &generic::col_sums_f64);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.bias_add == &generic::bias_add);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.col_sums_f64_bf16 == &generic::col_sums_f64_bf16);
        EXPECT_EQ(t.rows_isa == Isa::generic,
                  t.scaled_rows_and_dots == &generic::scaled_rows_and_dots);
        EXPECT_EQ(t.rows_isa == Isa::generic,
                  t.scaled_rows_and_dots_bf16 == &generic::scaled_rows_and_dots_bf16);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.rank_rows == &generic::rank_rows);
        EXPECT_EQ(t.exp_isa == Isa::generic, t.exp_f64 == &generic::exp_f64);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.weighted_row_sum == &generic::weighted_row_sum);
        EXPECT_EQ(t.rows_isa == Isa::generic, t.add_row_sum == &generic::add_row_sum);
    }
}

TEST(Dispatch, DescribeNamesGemmAndEveryFamily) {
    const std::string d = kernel_table(Isa::avx2).describe();
    EXPECT_EQ(d.rfind("isa avx2: gemm " + gemm_backend_name() + ", layernorm avx2, ", 0), 0u) << d;
    for (const char* family : {"gelu avx2", "attention avx2", "crossentropy avx2", "adamw avx2",
                               "convert avx2", "rows avx2", "exp64 avx2"}) {
        EXPECT_NE(d.find(family), std::string::npos) << family << " not in: " << d;
    }
    // the AVX-512 table's own kernels (describing a table calls none of them)
    const std::string x = kernel_table(Isa::avx512).describe();
    for (const char* family :
         {"gelu avx512", "crossentropy avx512", "adamw avx512", "convert avx512",
          "attention avx512 (head size a multiple of 16, else avx2 or generic)"}) {
        EXPECT_NE(x.find(family), std::string::npos) << family << " not in: " << x;
    }
    // the generic table's families (its GEMM is the process's backend, avx2 on an AVX2 CPU)
    const std::string g = kernel_table(Isa::generic).describe();
    EXPECT_EQ(g.substr(g.find(", layernorm")).find("avx"), std::string::npos) << g;
}

TEST(Dispatch, IsaFromEnvNamesAndDefaults) {
    const CpuFeatures all = cpu_with(true, true), none = cpu_with(false, false);
    EXPECT_EQ(isa_from_env(nullptr, all), Isa::avx512);
    EXPECT_EQ(isa_from_env("", all), Isa::avx512);
    EXPECT_EQ(isa_from_env(nullptr, cpu_with(true, false)), Isa::avx2);
    EXPECT_EQ(isa_from_env(nullptr, none), Isa::generic);
    for (Isa isa : kIsas) EXPECT_EQ(isa_from_env(isa_name(isa), all), isa);
    EXPECT_EQ(isa_from_env("generic", none), Isa::generic);
}

TEST(Dispatch, IsaFromEnvRejectsUnknownNames) {
    const CpuFeatures all = cpu_with(true, true);
    for (const char* bad : {"AVX2", "avx", "portable", "ref", "avx512 "}) {
        const std::string msg = env_error(bad, all);
        EXPECT_EQ(msg, std::string("BGL_ISA=") + bad + ": expected generic, avx2 or avx512");
    }
}

TEST(Dispatch, IsaFromEnvRejectsWhatTheCpuLacks) {
    EXPECT_EQ(env_error("avx2", cpu_with(false, false)),
              "BGL_ISA=avx2: this CPU lacks AVX2+FMA (it runs generic)");
    EXPECT_EQ(env_error("avx512", cpu_with(true, false)),
              "BGL_ISA=avx512: this CPU lacks AVX-512F/BW/VL/DQ (it runs generic, avx2)");
    EXPECT_EQ(env_error("avx512", cpu_with(true, true)), "");
}

TEST(Dispatch, SetActiveIsaSwitchesTheTable) {
    const Isa saved = dispatch().isa;
    for (Isa isa : kIsas) {
        if (!isa_supported(isa)) continue;
        set_active_isa(isa);
        EXPECT_EQ(&dispatch(), &kernel_table(isa));
    }
    set_active_isa(saved);
    EXPECT_EQ(dispatch().isa, saved);
}

TEST(Dispatch, DefaultIsTheWidestSupported) {
    // Unless the environment of this test run forces one.
    const char* env = std::getenv("BGL_ISA");
    if (env != nullptr && *env != '\0') GTEST_SKIP() << "BGL_ISA is set";
    EXPECT_EQ(best_isa(), isa_from_env(nullptr, cpu_features()));
    EXPECT_TRUE(isa_supported(best_isa()));
    for (Isa isa : kIsas) {
        if (int(isa) > int(best_isa())) {
            EXPECT_FALSE(isa_supported(isa)) << isa_name(isa);
        }
    }
}

// ---- BGL_ISA in a real run ----

// Two steps of configs/tiny.toml on token shards written here (as tests/cli/bad_input_test.cpp),
// with `env` in the environment of the binary.
class DispatchEnv : public ::testing::Test {
   protected:
    void SetUp() override {
        std::vector<int32_t> tokens(2000);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7) % 97);
        data::write_token_file(dir_ / "train.bin", tokens, 128);
        data::write_token_file(dir_ / "val.bin", tokens, 128);
    }
    bagualu::testing::CommandResult train(const std::string& env) {
        return bagualu::testing::run_command(
            std::string("cd ") + BGL_SOURCE_DIR + " && " + env + " " + BGL_BINARY +
            " train --config configs/tiny.toml --run-dir " + (dir_ / "run") +
            " --set model.vocab_size=128 --set data.train=" + (dir_ / "train.bin") +
            " --set data.val=" + (dir_ / "val.bin") +
            " --set data.tokenizer=" + (dir_ / "none.model") + " --set train.steps=2");
    }
    bagualu::testing::TempDir dir_;
};

TEST_F(DispatchEnv, ForcesTheGenericPathInATrainingRun) {
    const auto r = train("BGL_ISA=generic");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("isa generic: gemm "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("layernorm generic, gelu generic, attention generic, crossentropy "
                            "generic, adamw generic, convert generic"),
              std::string::npos)
        << r.output;
}

TEST_F(DispatchEnv, UnknownValueIsOneLineAndStatus2) {
    // The table is chosen at its first use, where the run logs its set-up: the lines before the
    // error are that log; the error is the last line and the only one naming BGL_ISA.
    const auto r = train("BGL_ISA=avx3");
    EXPECT_EQ(r.status, 2) << r.output;
    const std::string want = "error: BGL_ISA=avx3: expected generic, avx2 or avx512\n";
    ASSERT_GE(r.output.size(), want.size()) << r.output;
    EXPECT_EQ(r.output.substr(r.output.size() - want.size()), want) << r.output;
    EXPECT_EQ(r.output.find("BGL_ISA"), r.output.rfind("BGL_ISA")) << r.output;
}

}  // namespace
}  // namespace bagualu::kernels

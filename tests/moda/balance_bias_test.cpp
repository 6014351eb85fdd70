// The balancing bias (moe/balance_bias.h) end to end: it is bitwise the same with gradient
// accumulation 1 and 4 (same global batch), and under `mpirun -np 2` / `-np 4` with expert
// parallelism 2 / 4, as in one process: per step (the bias statistics and the choice-load
// violation in metrics.jsonl) and at the end (h.{l}.moe.gate.bias in model.safetensors). It
// stays float32 under bf16 and fp16 precision.
//
// The weights themselves are not bitwise the same across these runs (gradients are summed in
// another order), and after a few steps some token's choice flips at a near-tie, which moves
// the counts and so the bias. What must be bitwise is the bias as a function of the step's
// choices: these runs freeze the weights (lr = 1e-30: every update is below half an ulp of the
// weights, so every token's scores are bitwise those of the first step) while the bias keeps
// moving by 0.01 per step. A bias updated per micro-batch, or from one rank's counts, or counts
// doubled, gives other bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

constexpr int64_t kStepTokens = 8 * 64;  // configs/tiny.toml: batch 8 of seq_len 64
constexpr int64_t kTopK       = 2;
constexpr const char* kBias   = " --set model.balance_bias_rate=0.01";
constexpr const char* kFrozen = " --set train.lr=1e-30 --set train.min_lr=1e-30";

// Per logged step: the balancing telemetry of every MoE layer, as written.
std::vector<std::string> bias_lines(const std::string& metrics) {
    std::vector<std::string> out;
    std::istringstream in(read_file(metrics));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("loss")) continue;
        nlohmann::json sel;
        for (const char* k :
             {"step", "balance_bias_min", "balance_bias_max", "balance_bias_mean_abs",
              "choice_load_max_violation", "choice_tokens"}) {
            EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
            if (j.contains(k)) sel[k] = j[k];
        }
        // the choices the violation is of: every token's top_k of the whole step (all
        // micro-batches and ranks), max / mean - 1 of them
        if (j.contains("choice_tokens") && j.contains("choice_load_max_violation")) {
            for (size_t l = 0; l < j["choice_tokens"].size(); ++l) {
                const auto counts = j["choice_tokens"][l].get<std::vector<int64_t>>();
                int64_t total = 0, mx = 0;
                for (const int64_t c : counts) {
                    total += c;
                    mx = std::max(mx, c);
                }
                EXPECT_EQ(total, kStepTokens * kTopK) << line;
                EXPECT_DOUBLE_EQ(j["choice_load_max_violation"][l].get<double>(),
                                 double(mx) * double(counts.size()) / double(total) - 1.0)
                    << line;
            }
        }
        out.push_back(sel.dump());
    }
    return out;
}

// The exported biases, as bytes, by name.
std::vector<std::pair<std::string, std::vector<float>>> exported_biases(const std::string& model) {
    const io::SafetensorsFile f(model);
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (const std::string& name : f.names()) {
        if (name.ends_with(".moe.gate.bias")) {
            EXPECT_EQ(f.info(name).dtype, io::DType::F32) << name;
            out.emplace_back(name, f.read_f32(name));
        }
    }
    return out;
}

class BalanceBiasTest : public TinyRunsSuite<> {
   protected:
    void expect_same_bias(const std::string& ref, const std::string& run) {
        const auto la = bias_lines(runs_->path(ref + "/metrics.jsonl"));
        const auto lb = bias_lines(runs_->path(run + "/metrics.jsonl"));
        ASSERT_EQ(la.size(), 20u);
        ASSERT_EQ(lb.size(), 20u);
        for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
        const auto ba = exported_biases(runs_->path(ref + "/model/model.safetensors"));
        const auto bb = exported_biases(runs_->path(run + "/model/model.safetensors"));
        ASSERT_EQ(ba.size(), 1u);  // tiny: one MoE block
        ASSERT_EQ(bb.size(), ba.size());
        for (size_t i = 0; i < ba.size(); ++i) {
            EXPECT_EQ(ba[i].first, bb[i].first);
            ASSERT_EQ(ba[i].second.size(), bb[i].second.size());
            EXPECT_EQ(std::memcmp(ba[i].second.data(), bb[i].second.data(),
                                  ba[i].second.size() * sizeof(float)),
                      0)
                << ba[i].first << " is not bitwise the same";
            bool nonzero = false;
            for (float v : ba[i].second) nonzero = nonzero || v != 0.0f;
            EXPECT_TRUE(nonzero) << "the bias never moved: the test would prove nothing";
        }
    }
    void ranks_vs_one(int P, int ep, const std::string& extra) {
        const std::string ref = "one" + std::to_string(P), run = fmt::format("p{}_ep{}", P, ep);
        const CommandResult a =
            bagualu(runs_->train_args(ref, 1, 1, "off") + kBias + kFrozen + extra);
        ASSERT_EQ(a.status, 0) << a.output;
        const CommandResult b =
            TinyRuns::run_mpi(P, runs_->train_args(run, P, ep, "auto") + kBias + kFrozen + extra);
        ASSERT_EQ(b.status, 0) << b.output;
        expect_same_bias(ref, run);
    }
};

TEST_F(BalanceBiasTest, GradientAccumulationOneAndFourGiveTheSameBits) {
    // global batch 8: one micro-batch of 8, or four of 2 (the later --set wins)
    const CommandResult a = bagualu(runs_->train_args("acc1", 1, 1, "off") + kBias + kFrozen +
                                    " --set train.micro_batch_size=8");
    ASSERT_EQ(a.status, 0) << a.output;
    const CommandResult b = bagualu(runs_->train_args("acc4", 1, 1, "off") + kBias + kFrozen +
                                    " --set train.micro_batch_size=2");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(a.output.find("= 1 micro-batch(es) of 8"), std::string::npos) << a.output;
    EXPECT_NE(b.output.find("= 4 micro-batch(es) of 2"), std::string::npos) << b.output;
    expect_same_bias("acc1", "acc4");
}

TEST_F(BalanceBiasTest, TwoRanksExpertParallelTwoMatchOne) { ranks_vs_one(2, 2, ""); }
TEST_F(BalanceBiasTest, FourRanksExpertParallelFourMatchOne) { ranks_vs_one(4, 4, ""); }
TEST_F(BalanceBiasTest, SwipeTwoRanksMatchOne) { ranks_vs_one(2, 2, " --set model.gate=swipe"); }

// Mixed precision rounds the experts' parameters and activations to 16 bits; the bias is not a
// parameter and must keep float32 values: updated by 0.01 steps and recentred, it holds values
// that bf16 (8 significant bits) and fp16 (11) cannot represent.
TEST_F(BalanceBiasTest, StaysFloat32UnderBf16AndFp16) {
    for (const char* dtype : {"bf16", "fp16"}) {
        const std::string run = std::string("prec_") + dtype;
        const CommandResult a = bagualu(runs_->train_args(run, 1, 1, "off") + kBias +
                                        " --set precision.dtype=" + dtype);
        ASSERT_EQ(a.status, 0) << a.output;
        const auto b = exported_biases(runs_->path(run + "/model/model.safetensors"));
        ASSERT_EQ(b.size(), 1u);
        int not_half = 0;
        for (float v : b[0].second) {
            uint32_t bits = 0;
            std::memcpy(&bits, &v, sizeof(bits));
            // a bf16 value has its low 16 mantissa bits zero, an fp16 value (normal) its low 13
            not_half += (bits & 0x1FFFu) != 0;
        }
        EXPECT_GT(not_half, 0) << dtype << ": every bias value is a 16-bit value";
    }
}

}  // namespace
}  // namespace bagualu::testing

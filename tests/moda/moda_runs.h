// Shared by the moda tests: tiny training runs of `bagualu train` (one process or under mpirun)
// on data prepared once per suite, and the comparison of two runs: per-step loss and gradient
// norm from metrics.jsonl, final parameters from model.safetensors.
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_command.h"
#include "io/safetensors.h"

namespace bagualu::testing {

struct StepLog {
    std::vector<double> loss, grad_norm;
    nlohmann::json first;  // the first step line (holds param_bytes, grad_bytes, optim_bytes)
};

inline StepLog read_steps(const std::string& path) {
    StepLog out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) {
            if (out.loss.empty()) out.first = j;
            out.loss.push_back(j["loss"]);
            out.grad_norm.push_back(j["grad_norm"]);
        }
    }
    return out;
}

// Every tensor of two model.safetensors files equal bit for bit (their metadata, the step and
// val loss, may differ).
inline void expect_same_model_bits(const std::string& a, const std::string& b) {
    const io::SafetensorsFile fa(a), fb(b);
    ASSERT_EQ(fa.names(), fb.names());
    for (const std::string& name : fa.names()) {
        const auto x = fa.bytes(name), y = fb.bytes(name);
        ASSERT_EQ(x.size(), y.size()) << name;
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << name << " differs";
    }
}

// Data under a temp dir, prepared once; runs write to run directories inside it.
class TinyRuns {
   public:
    TinyRuns() {
        data_ = " --set data.train=" + (dir_ / "data/train.bin") +
                " --set data.val=" + (dir_ / "data/val.bin") +
                " --set data.tokenizer=" + (dir_ / "data/tok.model");
        prepare_ = bagualu("prepare --config configs/tiny.toml" + data_);
    }
    const CommandResult& prepare() const { return prepare_; }
    std::string path(const std::string& name) const { return dir_ / name; }
    // The --set options that point a run at the prepared data.
    const std::string& data_args() const { return data_; }

    // 20 steps, every step logged; per-rank micro-batch chosen so that every micro-step covers
    // the same 4 sequences whatever P is (global batch 8 = 2 micro-steps).
    std::string train_args(const std::string& run, int P, int ep,
                           const std::string& partition) const {
        // fmt rather than operator+ chains: GCC 12 warns falsely (-Wrestrict) on the latter.
        return fmt::format(
            "train --config configs/tiny.toml{} --run-dir {} --set train.steps=20 "
            "--set train.log_every=1 --set train.eval_every=0 --set train.threads=1 "
            "--set sample.n_samples=0 --set train.micro_batch_size={} "
            "--set parallel.expert_parallel={} --set optimizer.partition={} --force",
            data_, dir_ / run, 4 / P, ep, partition);
    }
    static CommandResult run_mpi(int P, const std::string& args) {
        return run_command(
            fmt::format("cd {} && timeout 300 {} --allow-run-as-root --oversubscribe -np {} {} {}",
                        BGL_SOURCE_DIR, BGL_MPIEXEC, P, BGL_BINARY, args));
    }
    // One process without mpirun for P = 1.
    static CommandResult run(int P, const std::string& args) {
        return P == 1 ? bagualu(args) : run_mpi(P, args);
    }

   private:
    TempDir dir_;
    std::string data_;
    CommandResult prepare_;
};

// A test suite whose tests share one TinyRuns: the data is prepared once per suite.
template <typename Base = ::testing::Test>
class TinyRunsSuite : public Base {
   protected:
    static void SetUpTestSuite() { runs_ = new TinyRuns(); }
    static void TearDownTestSuite() {
        delete runs_;
        runs_ = nullptr;
    }
    void SetUp() override { ASSERT_EQ(runs_->prepare().status, 0) << runs_->prepare().output; }
    static inline TinyRuns* runs_ = nullptr;
};

// Runs `run` against the reference run `ref` (both 20 logged steps): per-step loss within 1e-5
// and gradient norm within 1e-4 relative; final parameters norm-wise within 1e-5 over the whole
// model and 1e-4 per tensor. Elementwise comparisons are not meaningful: an entry whose
// gradient nearly cancels gets a rounding-level gradient that Adam normalises into a full-size
// step, differently in each summation order. The key part of attn.c_attn.bias is left out:
// softmax is invariant to it, so its exact gradient is 0 and what the kernels compute is pure
// rounding noise.
inline void expect_same_training(const TinyRuns& runs, const std::string& ref,
                                 const std::string& run) {
    const StepLog la = read_steps(runs.path(ref + "/metrics.jsonl"));
    const StepLog lb = read_steps(runs.path(run + "/metrics.jsonl"));
    ASSERT_EQ(la.loss.size(), 20u);
    ASSERT_EQ(lb.loss.size(), 20u);
    for (size_t i = 0; i < la.loss.size(); ++i) {
        // Same math, different summation order across ranks (all-reduce, all-to-all):
        // float rounding differences stay far below 1e-5 relative over 20 steps.
        EXPECT_NEAR(lb.loss[i], la.loss[i], 1e-5 * la.loss[i]) << "step " << i + 1;
        EXPECT_NEAR(lb.grad_norm[i], la.grad_norm[i], 1e-4 * la.grad_norm[i]) << "step " << i + 1;
    }
    const io::SafetensorsFile fa(runs.path(ref + "/model/model.safetensors"));
    const io::SafetensorsFile fb(runs.path(run + "/model/model.safetensors"));
    ASSERT_EQ(fa.names(), fb.names());
    double worst = 0, diff_all = 0, norm_all = 0;
    for (const std::string& name : fa.names()) {
        const std::vector<float> x = fa.read_f32(name), y = fb.read_f32(name);
        ASSERT_EQ(x.size(), y.size()) << name;
        const bool qkv_bias = name.find("attn.c_attn.bias") != std::string::npos;
        const size_t C      = x.size() / 3;
        double diff = 0, norm = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            if (qkv_bias && i >= C && i < 2 * C) continue;
            diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
            norm += double(x[i]) * x[i];
        }
        diff_all += diff;
        norm_all += norm;
        const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
        worst            = std::max(worst, rel);
        EXPECT_LE(rel, 1e-4) << name;
    }
    const double rel_all = std::sqrt(diff_all / norm_all);
    EXPECT_LE(rel_all, 1e-5);
    std::printf("%s: parameters differ from %s by %.3g of their norm (worst tensor %.3g)\n",
                run.c_str(), ref.c_str(), rel_all, worst);
}

}  // namespace bagualu::testing

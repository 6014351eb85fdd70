// BGL_GEMM=auto's choice table kept with the run (train/gemm_choices.h): a run writes its
// gemm_choice.json; a run resumed from a checkpoint loads it before its first step and continues
// bit for bit like the run that wrote both; a table of other backends changes the resumed
// steps (so the loaded table is what runs); a table of another thread count is ignored with a
// log line and timed again.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "moda_runs.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

std::map<int64_t, double> losses_by_step(const std::string& path) {
    std::map<int64_t, double> out;
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return out;
}

class GemmChoiceResumeTest : public TinyRunsSuite<> {
   protected:
    static CommandResult train_auto(const std::string& run, const std::string& extra) {
        return run_command(fmt::format("cd {} && BGL_GEMM=auto {} {} --set checkpoint.every=10 {}",
                                       BGL_SOURCE_DIR, BGL_BINARY,
                                       runs_->train_args(run, 1, 1, "auto"), extra));
    }
    // A new run directory holding `src`'s step-10 checkpoint and the given choice table.
    static void seed_run(const std::string& src, const std::string& dst,
                         const nlohmann::json& table) {
        const std::string ck = "/checkpoints/step_00000010";
        fs::create_directories(runs_->path(dst + "/checkpoints"));
        fs::copy(runs_->path(src + ck), runs_->path(dst + ck), fs::copy_options::recursive);
        std::ofstream(runs_->path(dst + "/gemm_choice.json")) << table.dump(1);
    }
};

TEST_F(GemmChoiceResumeTest, ResumeWithAutoIsBitExact) {
    const CommandResult a = train_auto("auto_ref", "");
    ASSERT_EQ(a.status, 0) << a.output;
    const std::string table_path = runs_->path("auto_ref/gemm_choice.json");
    ASSERT_TRUE(fs::exists(table_path)) << a.output;
    const nlohmann::json table = nlohmann::json::parse(read_file(table_path));
    ASSERT_GT(table.at("choices").size(), 3u) << table.dump();
    const auto ref = losses_by_step(runs_->path("auto_ref/metrics.jsonl"));
    ASSERT_EQ(ref.size(), 20u);

    // the run's own table: steps 11..20 and the model bit for bit
    seed_run("auto_ref", "auto_resumed", table);
    const CommandResult b = train_auto("auto_resumed", "--resume");
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("(step 10)"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("GEMM backends of"), std::string::npos) << b.output;
    const auto got = losses_by_step(runs_->path("auto_resumed/metrics.jsonl"));
    for (int64_t s = 11; s <= 20; ++s) {
        ASSERT_TRUE(got.contains(s)) << s;
        EXPECT_EQ(got.at(s), ref.at(s)) << "loss of step " << s << " is not bitwise the same";
    }
    EXPECT_EQ(read_file(runs_->path("auto_ref/model/model.safetensors")),
              read_file(runs_->path("auto_resumed/model/model.safetensors")));

    // every shape on the double-accumulating ref kernels: the resumed steps run them
    nlohmann::json ref_table = table;
    for (auto& c : ref_table["choices"]) c["backend"] = "ref";
    seed_run("auto_ref", "auto_ref_kernels", ref_table);
    const CommandResult c = train_auto("auto_ref_kernels", "--resume");
    ASSERT_EQ(c.status, 0) << c.output;
    const auto other = losses_by_step(runs_->path("auto_ref_kernels/metrics.jsonl"));
    int differ       = 0;
    for (int64_t s = 11; s <= 20; ++s) differ += other.at(s) != ref.at(s);
    EXPECT_GT(differ, 0) << "a table of ref backends left every resumed loss unchanged";
    const nlohmann::json kept =
        nlohmann::json::parse(read_file(runs_->path("auto_ref_kernels/gemm_choice.json")));
    // the loaded choices are kept (evaluation may add shapes of its own)
    for (const auto& ch : ref_table.at("choices")) {
        EXPECT_NE(std::find(kept.at("choices").begin(), kept.at("choices").end(), ch),
                  kept.at("choices").end())
            << ch.dump();
    }

    // another thread count: ignored with a log line, timed again and rewritten
    nlohmann::json foreign = table;
    foreign["threads"]     = table.at("threads").get<int>() + 7;
    for (auto& ch : foreign["choices"]) ch["backend"] = "ref";
    seed_run("auto_ref", "auto_foreign", foreign);
    const CommandResult d = train_auto("auto_foreign", "--resume");
    ASSERT_EQ(d.status, 0) << d.output;
    EXPECT_NE(
        d.output.find("gemm_choice.json: made on another CPU, oneDNN version or thread count: "
                      "ignored"),
        std::string::npos)
        << d.output;
    const nlohmann::json retimed =
        nlohmann::json::parse(read_file(runs_->path("auto_foreign/gemm_choice.json")));
    EXPECT_EQ(retimed.at("threads"), table.at("threads"));
    for (const auto& ch : retimed.at("choices")) EXPECT_NE(ch.at("backend"), "ref");
}

// A table that is not one is an input error naming the file (exit 2).
TEST_F(GemmChoiceResumeTest, MalformedTableIsAnInputError) {
    const CommandResult a = train_auto("auto_src", "--set train.steps=10");
    ASSERT_EQ(a.status, 0) << a.output;
    const std::string ck = "/checkpoints/step_00000010";
    fs::create_directories(runs_->path("auto_bad/checkpoints"));
    fs::copy(runs_->path("auto_src" + ck), runs_->path("auto_bad" + ck),
             fs::copy_options::recursive);
    std::ofstream(runs_->path("auto_bad/gemm_choice.json")) << "{\"cpu_model\": 3}";
    const CommandResult b = train_auto("auto_bad", "--resume");
    EXPECT_EQ(b.status, 2) << b.output;
    EXPECT_NE(b.output.find("gemm_choice.json"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("cpu_model"), std::string::npos) << b.output;
}

}  // namespace
}  // namespace bagualu::testing

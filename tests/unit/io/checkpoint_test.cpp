// Sharded checkpoints: slices written by several "ranks" read back across slice boundaries
// (resharding), every kind of corruption is detected with a message naming the file, and the
// directory helpers keep only complete checkpoints.
#include "io/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "../../common/run_command.h"
#include "core/error.h"

namespace bagualu::io::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Two ranks each own half of tensor "a" (10 elements) and rank 1 also owns "b" (3 elements).
Manifest write_two_ranks(const std::string& dir, std::vector<float>& a, std::vector<float>& b) {
    a.resize(10);
    b = {7, 8, 9};
    std::iota(a.begin(), a.end(), 100.0f);
    const Slice r0[] = {{"param/a", {2, 5}, 0, 4, a.data()}};
    const Slice r1[] = {{"param/a", {2, 5}, 4, 10, a.data() + 4}, {"adam_m/b", {3}, 0, 3, b.data()}};
    Manifest    m;
    m.step        = 40;
    m.config_toml = "[model]\n";
    m.ranks       = 2;
    m.files.push_back(write_slices(dir, "rank_00000.safetensors", r0));
    m.files.push_back(write_slices(dir, "rank_00001.safetensors", r1));
    m.state["sampler"] = {{"epoch", 1}, {"position", 17}};
    write_manifest(dir, m);
    return m;
}

TEST(CheckpointTest, ReadsAnyRangeAcrossRanks) {
    TempDir            d;
    std::vector<float> a, b;
    write_two_ranks(d.str(), a, b);
    CheckpointReader r(d.str());
    EXPECT_EQ(r.manifest().step, 40);
    EXPECT_EQ(r.manifest().state["sampler"]["position"], 17);
    EXPECT_EQ(r.shape("param/a"), (std::vector<int64_t>{2, 5}));
    std::vector<float> out(10);
    r.read("param/a", 0, 10, out.data());
    EXPECT_EQ(out, a);
    std::vector<float> mid(3);
    r.read("param/a", 3, 6, mid.data());  // spans both files
    EXPECT_EQ(mid, (std::vector<float>{103, 104, 105}));
    std::vector<float> bb(3);
    r.read("adam_m/b", 0, 3, bb.data());
    EXPECT_EQ(bb, b);
    EXPECT_FALSE(r.has("param/zzz"));
    EXPECT_THROW(r.read("param/zzz", 0, 1, out.data()), InputError);
}

std::string error_of(const std::string& dir) {
    try {
        CheckpointReader r(dir);
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(CheckpointTest, DetectsFlippedByteTruncationAndMissingManifest) {
    std::vector<float> a, b;
    {
        TempDir d;
        write_two_ranks(d.str(), a, b);
        const std::string f = d / "rank_00001.safetensors";
        std::string       bytes = testing::read_file(f);
        bytes[bytes.size() - 3] ^= 0x10;
        testing::write_file(f, bytes);
        const std::string e = error_of(d.str());
        EXPECT_NE(e.find("rank_00001.safetensors"), std::string::npos) << e;
        EXPECT_NE(e.find("checksum"), std::string::npos) << e;
    }
    {
        TempDir d;
        write_two_ranks(d.str(), a, b);
        fs::resize_file(d / "rank_00000.safetensors", 20);
        const std::string e = error_of(d.str());
        EXPECT_NE(e.find("rank_00000.safetensors"), std::string::npos) << e;
        EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    }
    {
        TempDir d;
        write_two_ranks(d.str(), a, b);
        fs::remove(d / "manifest.json");
        EXPECT_NE(error_of(d.str()).find("manifest.json: missing"), std::string::npos);
    }
}

TEST(CheckpointTest, RejectsCraftedManifests) {
    std::vector<float> a, b;
    TempDir            d;
    const Manifest     m    = write_two_ranks(d.str(), a, b);
    const std::string  path = d / "manifest.json";
    auto               with = [&](auto edit) {
        nlohmann::json j = manifest_to_json(m);
        edit(j);
        testing::write_file(path, j.dump());
        return error_of(d.str());
    };
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][1]["slices"][0]["begin"] = 2; }).find("overlap"), std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][0]["slices"][0]["end"] = 11; }).find("outside"), std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j.erase("step"); }).find("missing step"), std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][0]["name"] = "../x"; }).find("plain file name"), std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][0]["xxh64"] = "xyz"; }).find("hex"), std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][1]["slices"][0]["shape"] = {3, 5}; }).find("disagrees"), std::string::npos);
    testing::write_file(path, "{\"format\": ");
    EXPECT_NE(error_of(d.str()).find("invalid JSON"), std::string::npos);
}

TEST(CheckpointTest, ListCommitPrune) {
    TempDir            root;
    std::vector<float> a, b;
    for (int64_t step : {10, 20, 30}) {
        const std::string tmp = root / fmt::format("tmp_{}", step);
        fs::create_directories(tmp);
        write_two_ranks(tmp, a, b);
        commit(tmp, step_dir(root.str(), step));
    }
    fs::create_directories(root / "step_00000040");  // incomplete: no manifest
    auto all = list_complete(root.str());
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(fs::path(all[0]).filename(), "step_00000030");
    EXPECT_THROW(commit(root / "step_00000040", step_dir(root.str(), 30)), InputError);  // never overwrites
    prune(root.str(), 2);
    all = list_complete(root.str());
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(fs::path(all[1]).filename(), "step_00000020");
    EXPECT_FALSE(fs::exists(root / "step_00000010"));
}

}  // namespace
}  // namespace bagualu::io::ckpt

// Sharded checkpoints: slices written by several "ranks" read back across slice boundaries
// (resharding), every kind of corruption is detected with a message naming the file, and the
// directory helpers keep only complete checkpoints.
#include "io/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "../../common/run_command.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

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
    const Slice r1[] = {{"param/a", {2, 5}, 4, 10, a.data() + 4},
                        {"adam_m/b", {3}, 0, 3, b.data()}};
    Manifest m;
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
    TempDir d;
    std::vector<float> a, b;
    write_two_ranks(d.str(), a, b);
    CheckpointReader r(d.str());
    // write_slices hashes while writing; the hash must be that of the bytes on disk.
    for (const FileRecord& f : r.manifest().files)
        EXPECT_EQ(f.xxh64, file_xxh64(d / f.name)) << f.name;
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
        std::string bytes   = testing::read_file(f);
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
    TempDir d;
    const Manifest m       = write_two_ranks(d.str(), a, b);
    const std::string path = d / "manifest.json";
    auto with              = [&](auto edit) {
        nlohmann::json j = manifest_to_json(m);
        edit(j);
        testing::write_file(path, j.dump());
        return error_of(d.str());
    };
    EXPECT_NE(
        with([](nlohmann::json& j) { j["files"][1]["slices"][0]["begin"] = 2; }).find("overlap"),
        std::string::npos);
    EXPECT_NE(
        with([](nlohmann::json& j) { j["files"][0]["slices"][0]["end"] = 11; }).find("outside"),
        std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j.erase("step"); }).find("missing step"),
              std::string::npos);
    EXPECT_NE(
        with([](nlohmann::json& j) { j["files"][0]["name"] = "../x"; }).find("plain file name"),
        std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) { j["files"][0]["xxh64"] = "xyz"; }).find("hex"),
              std::string::npos);
    EXPECT_NE(with([](nlohmann::json& j) {
                  j["files"][1]["slices"][0]["shape"] = {3, 5};
              }).find("disagrees"),
              std::string::npos);
    testing::write_file(path, "{\"format\": ");
    EXPECT_NE(error_of(d.str()).find("invalid JSON"), std::string::npos);
}

// Each edit of a valid manifest must be refused by the parser with a message naming the field;
// these are the shapes of input the manifest fuzzer (fuzz/manifest_fuzz.cpp) generates.
TEST(CheckpointTest, RejectsMistypedAndOutOfRangeFields) {
    std::vector<float> a, b;
    TempDir d;
    const Manifest m                                      = write_two_ranks(d.str(), a, b);
    using Edit                                            = void (*)(nlohmann::json&);
    const std::vector<std::pair<Edit, const char*>> cases = {
        {[](nlohmann::json& j) { j = nlohmann::json::array(); }, "missing format"},
        {[](nlohmann::json& j) { j["format"] = 1; }, "format must be a string"},
        {[](nlohmann::json& j) { j["version"] = 2; }, "unsupported version"},
        {[](nlohmann::json& j) { j["step"] = "40"; }, "step must be an integer"},
        {[](nlohmann::json& j) { j["step"] = 40.5; }, "step must be an integer"},
        {[](nlohmann::json& j) { j["step"] = -1; }, "step = -1 is negative"},
        {[](nlohmann::json& j) { j["step"] = UINT64_MAX; },
         "step = 18446744073709551615 is too large"},
        {[](nlohmann::json& j) { j["layout"]["ranks"] = (int64_t{1} << 32) + 2; },
         "layout ranks = 4294967298"},
        {[](nlohmann::json& j) { j["layout"]["ranks"] = 0; }, "layout ranks = 0"},
        {[](nlohmann::json& j) { j["layout"]["expert_parallel"] = 3; }, "expert_parallel = 3"},
        {[](nlohmann::json& j) { j["files"] = nlohmann::json::object(); },
         "files must be an array"},
        {[](nlohmann::json& j) { j["files"][0] = 5; }, "missing files[0].name"},
        {[](nlohmann::json& j) { j["files"][0]["bytes"] = -204; },
         "files[0].bytes = -204 is negative"},
        {[](nlohmann::json& j) { j["files"][0]["bytes"] = UINT64_MAX; },
         "files[0].bytes = 18446744073709551615 is too large"},
        {[](nlohmann::json& j) { j["files"][0]["xxh64"] = "0x00000000000001"; },
         "xxh64 '0x00000000000001'"},
        {[](nlohmann::json& j) { j["files"][0]["xxh64"] = "-000000000000001"; },
         "16 lowercase hex digits"},
        {[](nlohmann::json& j) { j["files"][0]["xxh64"] = " 000000000000001"; },
         "16 lowercase hex digits"},
        {[](nlohmann::json& j) { j["files"][0]["xxh64"] = "ABCDEF0123456789"; },
         "16 lowercase hex digits"},
        {[](nlohmann::json& j) { j["files"][0]["name"] = "manifest.json"; }, "plain file name"},
        {[](nlohmann::json& j) { j["files"][0]["name"] = "a\\b"; }, "plain file name"},
        {[](nlohmann::json& j) { j["files"][0]["name"] = std::string("a\nb"); }, "plain file name"},
        {[](nlohmann::json& j) { j["files"][0]["name"] = ""; }, "plain file name"},
        {[](nlohmann::json& j) { j["files"][1]["name"] = "rank_00000.safetensors"; },
         "files[1].name 'rank_00000.safetensors' appears twice"},
        {[](nlohmann::json& j) { j["files"][0]["slices"] = "x"; },
         "files[0].slices must be an array"},
        {[](nlohmann::json& j) { j["files"][0]["slices"][0]["begin"] = -1; },
         "range [-1, 4) outside"},
        {[](nlohmann::json& j) { j["files"][0]["slices"][0]["end"] = UINT64_MAX; },
         "end = 18446744073709551615 is too large"},
        {[](nlohmann::json& j) {
             j["files"][0]["slices"][0]["end"]   = 0;
             j["files"][0]["slices"][0]["begin"] = 4;
         },
         "range [4, 0) outside"},
        {[](nlohmann::json& j) {
             j["files"][0]["slices"][0]["shape"] = {2, -5};
         },
         "shape must hold non-negative integers"},
        {[](nlohmann::json& j) {
             j["files"][0]["slices"][0]["shape"] = {1 << 30, 1 << 30, 1 << 30};
         },
         "shape too large"},
        {[](nlohmann::json& j) { j["files"][0]["slices"][0]["shape"] = 10; },
         "shape must be an array"},
        {[](nlohmann::json& j) { j["files"][0]["slices"][0]["tensor"] = nullptr; },
         "tensor must be a string"},
        {[](nlohmann::json& j) {
             j["files"][1]["slices"][1]["key"] = j["files"][1]["slices"][0]["key"];
         },
         "key 'param/a[4:10]' appears twice in rank_00001.safetensors"},
        {[](nlohmann::json& j) { j["state"] = 3; }, "state must be an object"},
    };
    for (const auto& [edit, expected] : cases) {
        nlohmann::json j = manifest_to_json(m);
        edit(j);
        try {
            (void)manifest_from_json(j, "m.json");
            ADD_FAILURE() << "accepted: " << j.dump();
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
                << e.what() << "\nexpected: " << expected;
            EXPECT_EQ(std::string(e.what()).rfind("m.json: ", 0), 0u) << e.what();
        }
    }
    // The unchanged manifest still loads (so each case above failed for its own edit).
    EXPECT_NO_THROW((void)manifest_from_json(manifest_to_json(m), "m.json"));
}

// A manifest that parses but disagrees with the shard it names: the slice's key holds another
// number of values, or another dtype, or does not exist. read() must refuse, not copy.
TEST(CheckpointTest, ReadRefusesKeysThatDisagreeWithTheManifest) {
    std::vector<float> a, b;
    TempDir d;
    const Manifest m       = write_two_ranks(d.str(), a, b);
    const std::string path = d / "manifest.json";
    std::vector<float> out(10);
    auto read_error = [&](auto edit) -> std::string {
        nlohmann::json j = manifest_to_json(m);
        edit(j);
        testing::write_file(path, j.dump());
        try {
            CheckpointReader r(d.str());
            r.read("param/a", 0, 10, out.data());
        } catch (const InputError& e) {
            return e.what();
        }
        return "";
    };
    // rank 0 claims [0, 3) of a where its key holds 4 values; rank 1 claims [3, 10).
    std::string e = read_error([](nlohmann::json& j) {
        j["files"][0]["slices"][0]["end"]   = 3;
        j["files"][1]["slices"][0]["begin"] = 3;
    });
    EXPECT_NE(e.find("param/a[0:4] does not hold 3 F32 or BF16 values"), std::string::npos) << e;
    e = read_error([](nlohmann::json& j) { j["files"][1]["slices"][0]["key"] = "param/a[4:11]"; });
    EXPECT_NE(e.find("rank_00001.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("param/a[4:11]"), std::string::npos) << e;
    // An F16 tensor where the manifest names a slice (F32 or BF16 only).
    const uint16_t f16[6] = {};
    const TensorRef t[]   = {{"param/a[4:10]", DType::F16, {6}, f16}};
    write_safetensors(d / "f16.safetensors", t);
    e = read_error([&](nlohmann::json& j) {
        j["files"][1]["name"]  = "f16.safetensors";
        j["files"][1]["bytes"] = fs::file_size(d / "f16.safetensors");
        j["files"][1]["xxh64"] = fmt::format("{:016x}", file_xxh64(d / "f16.safetensors"));
        j["files"][1]["slices"].erase(1);
    });
    EXPECT_NE(e.find("does not hold 6 F32 or BF16 values"), std::string::npos) << e;
}

// A tensor whose slices are F32 and BF16 (bf16 AdamW moments: precision.moments) reads as floats
// (BF16 widened, exact) and as bf16 (F32 rounded to nearest even), across the slice boundary.
TEST(CheckpointTest, Bf16SlicesReadWidenedFloatSlicesReadRounded) {
    TempDir d;
    // 1 + 2^-8 lies halfway between the bf16 values 1 and 1 + 2^-7: to even, 1 (0x3f80)
    const float f[5] = {1.0f, 1.00390625f, 3.14159f, -2.5f, 1e-3f};
    const float g[4] = {0.5f, -7.0f, 1e10f, 3e-5f};
    uint16_t g16[4]  = {};
    for (int i = 0; i < 4; ++i) g16[i] = bf16_from_float(g[i]);
    const Slice slices[] = {{"adam_m/x", {9}, 0, 5, f, DType::F32},
                            {"adam_m/x", {9}, 5, 9, g16, DType::BF16}};
    Manifest m;
    m.files.push_back(write_slices(d.str(), "rank_00000.safetensors", slices));
    write_manifest(d.str(), m);
    const CheckpointReader r(d.str());
    float out[9];
    r.read("adam_m/x", 0, 9, out);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], f[i]) << i;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[5 + i], bf16_to_float(g16[i])) << i;
    uint16_t out16[9];
    r.read_bf16("adam_m/x", 0, 9, out16);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out16[i], bf16_from_float(f[i])) << i;
    EXPECT_EQ(out16[1], 0x3f80);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out16[5 + i], g16[i]) << i;
    // a range across the boundary, at an odd offset
    uint16_t mid[4];
    r.read_bf16("adam_m/x", 3, 7, mid);
    EXPECT_EQ(mid[0], bf16_from_float(f[3]));
    EXPECT_EQ(mid[3], g16[1]);
}

TEST(CheckpointTest, ListCommitPrune) {
    TempDir root;
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
    EXPECT_THROW(commit(root / "step_00000040", step_dir(root.str(), 30)),
                 InputError);  // never overwrites
    prune(root.str(), 2);
    all = list_complete(root.str());
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(fs::path(all[1]).filename(), "step_00000020");
    EXPECT_FALSE(fs::exists(root / "step_00000010"));
}

}  // namespace
}  // namespace bagualu::io::ckpt

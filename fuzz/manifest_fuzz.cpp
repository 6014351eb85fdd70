// libFuzzer entry point for the checkpoint manifest reader. Each input is used twice: parsed as
// JSON and handed to manifest_from_json (whatever it accepts must survive a round trip through
// manifest_to_json), and written as manifest.json into a directory holding two small real shard
// files, which CheckpointReader then opens and reads every slice of. Any crash, sanitizer report
// or exception other than InputError is a bug. Build and run: see fuzz/README.md.
//
// The shards are deterministic (so are their sizes and hashes); fuzz/corpus/manifest/ holds a
// manifest naming them. BGL_FUZZ_WRITE_SEED=<path> writes that manifest again at start-up.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint/checkpoint.h"
#include "io/safetensors.h"

namespace ckpt = bagualu::io::ckpt;

namespace {

std::string g_dir;  // the checkpoint directory the reader half works in

void remove_dir() {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
}

// rank_00000: slices of a [2, 3] tensor and a scalar; rank_00001: the rest of the [2, 3] tensor
// as F32 and one BF16 tensor (which the reader must refuse to read as F32 slices).
void write_shards() {
    static const float a[6] = {1, 2, 3, 4, 5, 6};
    static const float s[1] = {7};
    const ckpt::Slice r0[]  = {{"param/a", {2, 3}, 0, 2, a}, {"param/s", {}, 0, 1, s}};
    const ckpt::Slice r1[]  = {{"param/a", {2, 3}, 2, 6, a + 2}};
    ckpt::Manifest m;
    m.step        = 1;
    m.config_toml = "[model]\n";
    m.ranks       = 2;
    m.files.push_back(ckpt::write_slices(g_dir, "rank_00000.safetensors", r0));
    m.files.push_back(ckpt::write_slices(g_dir, "rank_00001.safetensors", r1));
    const uint16_t bf16[2]           = {0x3f80, 0x4000};
    const bagualu::io::TensorRef t[] = {{"param/b[0:2]", bagualu::io::DType::BF16, {2}, bf16}};
    bagualu::io::write_safetensors(g_dir + "/bf16.safetensors", t);
    m.state["sampler"] = {{"epoch", 0}, {"position", 3}};
    if (const char* seed = std::getenv("BGL_FUZZ_WRITE_SEED")) {
        std::ofstream(seed) << ckpt::manifest_to_json(m).dump(1) << "\n";
    }
}

void read_everything(const ckpt::CheckpointReader& r) {
    std::vector<float> out;
    for (const ckpt::FileRecord& f : r.manifest().files) {
        for (const ckpt::SliceRecord& s : f.slices) {
            (void)r.has(s.tensor);
            const auto& shape = r.shape(s.tensor);
            int64_t numel     = 1;
            for (int64_t d : shape) numel *= d;  // validated: at most 2^50
            try {
                if (s.end - s.begin <= 4096) {
                    out.assign(static_cast<size_t>(s.end - s.begin), 0.0f);
                    r.read(s.tensor, s.begin, s.end, out.data());
                }
                if (numel <= 4096) {
                    out.assign(static_cast<size_t>(numel), 0.0f);
                    r.read(s.tensor, 0, numel, out.data());
                }
            } catch (const bagualu::InputError&) {
            }
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "bagualu-manifest-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mkdtemp");
        std::abort();
    }
    g_dir = tmpl;
    std::atexit(remove_dir);
    write_shards();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);

    // 1. The parser alone, on any JSON document.
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) {
        try {
            const ckpt::Manifest m = ckpt::manifest_from_json(j, "fuzz.json");
            // What was accepted is written back and must be accepted again, unchanged.
            const nlohmann::json again = ckpt::manifest_to_json(m);
            const ckpt::Manifest m2    = ckpt::manifest_from_json(again, "fuzz.json (round trip)");
            if (ckpt::manifest_to_json(m2) != again) std::abort();
        } catch (const bagualu::InputError&) {
        }
    }

    // 2. The reader, on a directory whose manifest is these bytes.
    {
        std::ofstream out(g_dir + "/" + ckpt::kManifestName, std::ios::binary | std::ios::trunc);
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
    }
    for (bool verify : {true, false}) {
        try {
            const ckpt::CheckpointReader r(g_dir, verify);
            read_everything(r);
        } catch (const bagualu::InputError&) {
        }
    }
    return 0;
}

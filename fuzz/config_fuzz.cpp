// libFuzzer entry point for the run configuration: the input is a TOML file followed by
// `--set` overrides, separated by NUL bytes ("<toml>\0<section.key=value>\0..."). The TOML part
// is written to a scratch file and loaded with load_config(path, overrides) as `bagualu train
// --config FILE --set ...` does. Whatever loads must survive to_toml -> config_from_text and
// come back as the same TOML text (what a checkpoint stores and resume reads). Any crash,
// sanitizer report or exception other than InputError is a bug. Build and run: fuzz/README.md.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "scratch_dir.h"

namespace {

std::string g_dir;  // scratch directory holding the config file

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    g_dir = bagualu::fuzz::make_scratch_dir("bagualu-config-fuzz");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string input(reinterpret_cast<const char*>(data), size);
    const size_t nul       = input.find('\0');
    const std::string toml = input.substr(0, nul);
    std::vector<std::string> overrides;
    for (size_t at = nul; at != std::string::npos && at < input.size();) {
        const size_t next = input.find('\0', at + 1);
        overrides.push_back(input.substr(at + 1, next == std::string::npos ? next : next - at - 1));
        at = next;
    }
    const std::string path = g_dir + "/fuzz.toml";
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(toml.data(), static_cast<std::streamsize>(toml.size()));
    }
    try {
        const bagualu::TrainConfig cfg = bagualu::load_config(path, overrides);
        const std::string text         = bagualu::to_toml(cfg);
        // A resolved config must load again (resume reads it from the checkpoint), unchanged.
        const bagualu::TrainConfig again = bagualu::config_from_text(text, "fuzz (round trip)");
        if (bagualu::to_toml(again) != text) {
            std::fprintf(stderr, "round trip changed the config:\n%s\n---\n%s\n", text.c_str(),
                         bagualu::to_toml(again).c_str());
            std::abort();
        }
    } catch (const bagualu::InputError&) {
    }
    return 0;
}

// libFuzzer entry point for llm.c token shards (src/data/token_file*, token_shards*): the input
// is the whole file. It is checked in memory (check_token_header, check_token_ids), written to a
// scratch file and read whole (read_token_file) and memory-mapped (TokenShards::open, every
// window read), against a uint16 and a uint32 vocabulary. Both readers must agree on what they
// accept. Any crash, sanitizer report or exception other than InputError is a bug.
// Build and run: fuzz/README.md.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_file.h"
#include "data/token_shards.h"
#include "scratch_dir.h"

namespace data = bagualu::data;

namespace {

std::string g_dir;  // scratch directory holding the shard

constexpr int kSeqLen = 4;

// Loads `path` both ways; returns whether each accepted it.
void load_both(const std::string& path, int vocab_size) {
    bool whole = false, mapped = false;
    try {
        const data::TokenFile f = data::read_token_file(path, vocab_size);
        for (int32_t t : f.tokens) {
            if (t < 0 || t >= vocab_size) std::abort();  // the reader promised ids < vocab_size
        }
        whole = true;
    } catch (const bagualu::InputError&) {
    }
    try {
        const auto shards = data::TokenShards::open(path, "data.train", vocab_size, kSeqLen);
        std::vector<int32_t> window(kSeqLen + 1);
        for (int64_t w = 0; w < shards.num_windows(); ++w) {
            shards.read_window(w, window.data());
            for (int32_t t : window) {
                if (t < 0 || t >= vocab_size) std::abort();
            }
        }
        mapped = true;
    } catch (const bagualu::InputError&) {
    }
    // The mapped reader also refuses files with no window (fewer than T + 1 tokens).
    if (mapped && !whole) {
        std::fprintf(stderr, "TokenShards accepted a file read_token_file refused\n");
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    g_dir = bagualu::fuzz::make_scratch_dir("bagualu-shard-fuzz");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
    const char* p = reinterpret_cast<const char*>(bytes);
    for (int vocab : {1000, 70000}) {
        try {
            const data::TokenFileLayout l =
                data::check_token_header("fuzz.bin", p, static_cast<int64_t>(size));
            data::check_token_ids("fuzz.bin", p + data::kTokenFileHeaderBytes, l, vocab);
        } catch (const bagualu::InputError&) {
        }
    }
    const std::string path = g_dir + "/fuzz.bin";
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(p, static_cast<std::streamsize>(size));
    }
    load_both(path, 1000);
    load_both(path, 70000);
    return 0;
}

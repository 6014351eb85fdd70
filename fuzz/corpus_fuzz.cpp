// libFuzzer entry point for the corpus reader (src/data/corpus.cpp, fortunes.cpp): the input is
// a corpus file, written under three names and read by read_corpus_entries as JSON Lines
// (`.jsonl`), plain or fortune text (`.txt`) and, gzipped or not, as whatever its bytes are
// (`.gz`: inflated when they start with gzip's magic). Entries must be non-blank and free of NUL;
// the text reader's must be UTF-8. Any crash, sanitizer report or exception other than
// InputError is a bug. Build and run: fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/corpus.h"
#include "data/fortunes.h"
#include "scratch_dir.h"

namespace data = bagualu::data;

namespace {

std::string g_dir;

bool blank(const std::string& s) { return s.find_first_not_of(" \t\n\r\v\f") == std::string::npos; }

void read_as(const std::string& name, const uint8_t* bytes, size_t size, bool text) {
    const std::string path = g_dir + "/" + name;
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes), static_cast<std::streamsize>(size));
    }
    try {
        for (const std::string& e : data::read_corpus_entries({path}, "text")) {
            if (e.empty() || blank(e) || e.find('\0') != std::string::npos) std::abort();
            if (text && !data::is_utf8_text(e)) std::abort();
        }
    } catch (const bagualu::InputError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    g_dir = bagualu::fuzz::make_scratch_dir("bagualu-corpus-fuzz");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
    read_as("fuzz.jsonl", bytes, size, false);
    read_as("fuzz.txt", bytes, size, true);
    read_as("fuzz.gz", bytes, size, false);
    return 0;
}

// A small deterministic mixed corpus for tokenizer and prepare tests: English sentences,
// Chinese lines, and ASCII art with indentation, runs of spaces and blank lines.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bagualu::data::testing {

inline std::vector<std::string> small_corpus(int n_entries) {
    static const char* const kWords[] = {
        "the",  "quick", "brown", "fox",    "jumps",  "over",  "lazy",  "dog",  "a",
        "man",  "who",   "knows", "little", "is",     "never", "wrong", "time", "flies",
        "like", "an",    "arrow", "fruit",  "banana", "42",    "1999",  "code", "works"};
    static const char* const kHan[] = {"春", "眠", "不", "觉", "晓", "处", "闻", "啼",
                                       "鸟", "夜", "来", "风", "雨", "声", "花", "落",
                                       "知", "多", "少", "，", "。", "山", "水", "月"};
    static const char* const kArt[] = {
        "   /\\_/\\\n  ( o.o )\n   > ^ <",
        "  +-----+\n  |     |\n  +-----+\n\n    ||",
        "*    *    *\n  *    *\n\n      ~~~~",
    };
    uint64_t state = 12345;
    auto next      = [&state](uint64_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return (state >> 33) % n;
    };
    std::vector<std::string> entries;
    for (int i = 0; i < n_entries; ++i) {
        std::string e;
        switch (i % 4) {
            case 0:
            case 1: {
                const uint64_t n_lines = 1 + next(3);
                for (uint64_t l = 0; l < n_lines; ++l) {
                    if (l > 0) e += '\n';
                    const uint64_t n_words = 3 + next(8);
                    for (uint64_t w = 0; w < n_words; ++w) {
                        if (w > 0) e += next(5) == 0 ? "  " : " ";
                        e += kWords[next(std::size(kWords))];
                    }
                    e += '.';
                }
                break;
            }
            case 2: {
                for (int l = 0; l < 2; ++l) {
                    if (l > 0) e += '\n';
                    for (uint64_t c = 0; c < 5 + next(4); ++c) e += kHan[next(std::size(kHan))];
                }
                e += "\n    -- 古诗";
                break;
            }
            default:
                e = kArt[next(std::size(kArt))];
                e += "\n   -- art #" + std::to_string(i);
        }
        entries.push_back(e);
    }
    return entries;
}

}  // namespace bagualu::data::testing

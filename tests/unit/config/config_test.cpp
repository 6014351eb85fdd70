// Tests for --set overrides (config/config.h): a value that is not TOML is taken as a string,
// but only when it is valid UTF-8 like the rest of a TOML document; otherwise to_toml would
// write it and read it back as other bytes (found by fuzz/config_fuzz).
#include "config/config.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace bagualu {
namespace {

std::string error_of(const std::string& item) {
    try {
        (void)default_config({item});
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(ConfigOverride, BareWordsAreStringsAndRoundTrip) {
    for (const std::string word : {"runs/x", "pò#1", "人生", "a\xf0\x9f\x98\x80z"}) {
        const TrainConfig cfg = default_config({"train.run_dir=" + word});
        EXPECT_EQ(cfg.train.run_dir, word);
        EXPECT_EQ(config_from_text(to_toml(cfg), "rt").train.run_dir, word);
    }
}

TEST(ConfigOverride, ValuesThatAreNotUtf8AreInputErrors) {
    // a lone lead byte, a stray continuation byte, an overlong '/', a surrogate, beyond U+10FFFF
    for (const std::string bad :
         {"p\xf2###", "a\x80", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
        const std::string e = error_of("train.run_dir=" + bad);
        EXPECT_NE(e.find("the value is not valid UTF-8"), std::string::npos) << e;
        EXPECT_EQ(e.rfind("--set train.run_dir=", 0), 0u) << e;
    }
}

}  // namespace
}  // namespace bagualu

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

// Seeds are uint64: one from 2^63 up, beyond TOML's signed integers, is given as digits (bare
// in --set, quoted in a file) and written so by to_toml; anything else says what is expected.
TEST(ConfigOverride, SeedsTakeEveryUint64AndRoundTrip) {
    const TrainConfig cfg =
        default_config({"train.seed=18446744073709551615", "sample.seed=\"9223372036854775808\""});
    EXPECT_EQ(cfg.train.seed, 18446744073709551615u);
    EXPECT_EQ(cfg.sample.seed, 9223372036854775808u);
    const TrainConfig back = config_from_text(to_toml(cfg), "rt");
    EXPECT_EQ(back.train.seed, 18446744073709551615u);
    EXPECT_EQ(back.sample.seed, 9223372036854775808u);
    EXPECT_EQ(config_from_text(to_toml(default_config({"train.seed=7"})), "rt").train.seed, 7u);
    EXPECT_TRUE(differing_keys(cfg, back, "train").empty());
    for (const std::string bad :
         {"-1", "18446744073709551616", "1.5", "\"12x\"", "\"-3\"", "true"}) {
        const std::string e = error_of("sample.seed=" + bad);
        EXPECT_NE(e.find("sample.seed: expected an integer from 0 to 18446744073709551615"),
                  std::string::npos)
            << bad << ": " << e;
    }
}

}  // namespace
}  // namespace bagualu

// Tests for --set overrides (config/config.h): a value that is not TOML is taken as a string,
// but only when it is valid UTF-8 like the rest of a TOML document; otherwise to_toml would
// write it and read it back as other bytes (found by fuzz/config_fuzz).
#include "config/config.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

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

// data.readers: "auto" (the default) or a count from 0 (every rank reads), in a file or --set,
// written back as given; anything else says what is expected. auto resolves to one reader a node
// of consecutive ranks where there are several nodes, else every rank.
TEST(ConfigOverride, ReadersTakeAutoOrACount) {
    EXPECT_TRUE(default_config({}).data.readers.automatic());
    for (const auto& [item, n] :
         std::vector<std::pair<std::string, int>>{{"data.readers=auto", ReaderCount::kAuto},
                                                  {"data.readers=\"auto\"", ReaderCount::kAuto},
                                                  {"data.readers=0", 0},
                                                  {"data.readers=12", 12}}) {
        const TrainConfig cfg = default_config({item});
        EXPECT_EQ(cfg.data.readers.n, n) << item;
        const TrainConfig back = config_from_text(to_toml(cfg), "rt");
        EXPECT_EQ(back.data.readers, cfg.data.readers) << item;
        EXPECT_TRUE(differing_keys(cfg, back, "data").empty()) << item;
    }
    EXPECT_NE(to_toml(default_config({})).find("readers = 'auto'"), std::string::npos);
    for (const std::string bad : {"-1", "nodes", "1.5", "true", "16777217"}) {
        const std::string e = error_of("data.readers=" + bad);
        EXPECT_NE(e.find("data.readers"), std::string::npos) << bad << ": " << e;
        EXPECT_NE(e.find("auto"), std::string::npos) << bad << ": " << e;
    }
    const ReaderCount automatic, three{3}, none{0};
    EXPECT_EQ(automatic.resolve(1), 0);
    EXPECT_EQ(automatic.resolve(0), 0);
    EXPECT_EQ(automatic.resolve(4), 4);
    EXPECT_EQ(three.resolve(4), 3);
    EXPECT_EQ(none.resolve(4), 0);
}

// data.blend and data.blend_weights: arrays that round-trip through TOML; one weight a split,
// each > 0 and finite, else one error naming the key.
TEST(ConfigOverride, BlendsTakeOneWeightASplit) {
    const TrainConfig cfg =
        default_config({"data.blend=[\"a/*.bin\", \"b\"]", "data.blend_weights=[0.7, 3]"});
    ASSERT_EQ(cfg.data.blend.size(), 2u);
    EXPECT_EQ(cfg.data.blend[1], "b");
    EXPECT_EQ(cfg.data.blend_weights, (std::vector<double>{0.7, 3.0}));
    const TrainConfig back = config_from_text(to_toml(cfg), "rt");
    EXPECT_EQ(back.data.blend, cfg.data.blend);
    EXPECT_EQ(back.data.blend_weights, cfg.data.blend_weights);
    EXPECT_TRUE(differing_keys(cfg, back, "data").empty());
    const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
        {{"data.blend=[\"a\", \"b\"]", "data.blend_weights=[1]"},
         "data.blend_weights holds 1 weight(s) for the 2 split(s) of data.blend"},
        {{"data.blend_weights=[1]"}, "holds 1 weight(s) for the 0 split(s)"},
        {{"data.blend=[\"a\"]", "data.blend_weights=[0]"},
         "data.blend_weights[0] = 0: must be > 0"},
        {{"data.blend=[\"a\", \"\"]", "data.blend_weights=[1, 1]"},
         "data.blend[1] must not be empty"},
        {{"data.blend=[\"a\"]", "data.blend_weights=[\"x\"]"},
         "data.blend_weights: expected an array of numbers"},
        {{"data.blend=[\"a\"]", "data.blend_weights=[inf]"}, "expected a finite number"},
    };
    for (const auto& [items, needle] : bad) {
        std::string e;
        try {
            (void)default_config(items);
        } catch (const InputError& x) {
            e = x.what();
        }
        EXPECT_NE(e.find(needle), std::string::npos) << needle << ": " << e;
    }
}

}  // namespace
}  // namespace bagualu

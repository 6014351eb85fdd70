// fortune(6) text: separators, ANSI escapes, plain text, UTF-8, and a pass over the real
// corpus in /usr/share/games/fortunes when it is installed (files and folders: corpus_test.cpp).
#include "data/fortunes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "data/corpus.h"
#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::TempDir;

using Entries = std::vector<std::string>;

TEST(Fortunes, SplitsOnPercentLines) {
    EXPECT_EQ(split_fortune_text("one\nline two\n%\n  indented\n    art  \n%\n%\n\n\nlast\n"),
              (Entries{"one\nline two", "  indented\n    art", "last"}));
}

TEST(Fortunes, PercentInsideTextIsNotASeparator) {
    EXPECT_EQ(split_fortune_text("100% sure\n%\n%d is a format\n"),
              (Entries{"100% sure", "%d is a format"}));
}

TEST(Fortunes, CrlfSeparators) {
    EXPECT_EQ(split_fortune_text("a\r\n%\r\nb\r\n"), (Entries{"a", "b"}));
}

TEST(Fortunes, KeepsInnerBlankLinesAndSpaces) {
    EXPECT_EQ(split_fortune_text("\n\ntitle\n\n  body   x\n\t\n%\n"),
              (Entries{"title\n\n  body   x"}));
}

TEST(Fortunes, PlainTextSplitsOnBlankLines) {
    EXPECT_EQ(split_fortune_text("para one\nstill one\n\n  \npara two\n\n\n"),
              (Entries{"para one\nstill one", "para two"}));
}

TEST(Fortunes, StripsAnsiEscapes) {
    EXPECT_EQ(strip_ansi_escapes("\x1b[33m    -- Debian \x1b[32m《行为准则》\x1b[m第一条\x1b[;m"),
              "    -- Debian 《行为准则》第一条");
    EXPECT_EQ(strip_ansi_escapes("\x1b[1;32mgreen\x1b[0m"), "green");
    // Malformed: the sequence ends at the next ESC, which starts its own sequence.
    EXPECT_EQ(strip_ansi_escapes("a\x1b[;\x1b[34;1mmb"), "amb");
    EXPECT_EQ(strip_ansi_escapes("lone \x1b esc"), "lone  esc");
    EXPECT_EQ(strip_ansi_escapes("tail \x1b["), "tail ");
}

TEST(Fortunes, Utf8Check) {
    EXPECT_TRUE(is_utf8_text("plain ascii\n\tand \b controls"));
    EXPECT_TRUE(is_utf8_text("汉字 é 𝄞"));
    EXPECT_FALSE(is_utf8_text(std::string("nul\0byte", 8)));
    EXPECT_FALSE(is_utf8_text("\xff\xfe"));
    EXPECT_FALSE(is_utf8_text("\xe6\xb1"));      // truncated sequence
    EXPECT_FALSE(is_utf8_text("\xc0\xaf"));      // overlong '/'
    EXPECT_FALSE(is_utf8_text("\xed\xa0\x80"));  // surrogate
}

TEST(Fortunes, RealCorpus) {
    const std::string root = "/usr/share/games/fortunes";
    if (!std::filesystem::is_directory(root)) GTEST_SKIP() << root << " not installed";
    const Entries entries = read_corpus_entries({root});
    EXPECT_GT(entries.size(), 10000u);
    EXPECT_LT(entries.size(), 100000u);
    bool latin = false, cjk = false;
    for (const std::string& e : entries) {
        ASSERT_FALSE(e.empty());
        ASSERT_EQ(e.find('\x1b'), std::string::npos) << e;
        ASSERT_FALSE(e.back() == ' ' || e.back() == '\n') << e;
        latin = latin || e.find(" the ") != std::string::npos;
        cjk   = cjk || e.find("的") != std::string::npos;
    }
    EXPECT_TRUE(latin);
    EXPECT_TRUE(cjk);
}

}  // namespace
}  // namespace bagualu::data

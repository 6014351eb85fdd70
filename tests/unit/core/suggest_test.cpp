// "Did you mean": edit distance with adjacent swaps, and the nearest name within a third of the
// typed word's length.
#include "core/suggest.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace bagualu {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
    EXPECT_EQ(edit_distance("", ""), 0u);
    EXPECT_EQ(edit_distance("steps", "steps"), 0u);
    EXPECT_EQ(edit_distance("", "abc"), 3u);
    EXPECT_EQ(edit_distance("stepz", "steps"), 1u);      // substitution
    EXPECT_EQ(edit_distance("step", "steps"), 1u);       // insertion
    EXPECT_EQ(edit_distance("d_modle", "d_model"), 1u);  // adjacent swap, one edit
    EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
    EXPECT_EQ(edit_distance("ab", "ba"), edit_distance("ba", "ab"));
}

TEST(NearestName, OnlyWithinAThirdOfTheWord) {
    const std::set<std::string> keys{"model.d_model", "model.d_ff", "train.steps", "train.seed"};
    EXPECT_EQ(nearest_name("model.d_modle", keys), "model.d_model");
    EXPECT_EQ(nearest_name("train.stepz", keys), "train.steps");
    EXPECT_EQ(nearest_name("train.step", keys), "train.steps");
    EXPECT_EQ(nearest_name("parallel.ep", keys), "");  // another name, not a typo
    EXPECT_EQ(nearest_name("ab", std::set<std::string>{"xy"}), "");
    EXPECT_EQ(nearest_name("x", std::set<std::string>{}), "");
    // a name far longer than any candidate is none of them (and builds no table)
    EXPECT_EQ(nearest_name(std::string(1 << 20, 'a'), keys), "");
    EXPECT_EQ(nearest_name("model.d_model" + std::string(3, 'x'), keys), "model.d_model");
}

}  // namespace
}  // namespace bagualu

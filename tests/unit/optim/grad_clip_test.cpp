// Global-norm clipping (optim/grad_clip.h): the norm adds the common squares once and the own
// squares over the group; the clip factor is max_norm / norm only above a positive limit.
#include "optim/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace bagualu::optim {
namespace {

TEST(GradClip, GlobalNormAddsCommonAndOwnSquares) {
    EXPECT_EQ(global_norm(9.0, 16.0, nullptr), 5.0);
    EXPECT_EQ(global_norm(0.0, 2.25, nullptr), 1.5);
    // a one-rank group: its all-reduce is the identity (dist::make_local_comm)
    const auto one = dist::make_local_comm();
    EXPECT_EQ(global_norm(9.0, 16.0, one.get()), 5.0);
    EXPECT_TRUE(std::isnan(global_norm(0.0, std::nan(""), nullptr)));
    EXPECT_TRUE(std::isinf(global_norm(std::numeric_limits<double>::infinity(), 1.0, nullptr)));
}

TEST(GradClip, FactorOnlyAboveAPositiveLimit) {
    EXPECT_EQ(clip_factor(4.0, 1.0), 0.25f);
    EXPECT_EQ(clip_factor(3.0, 1.0), static_cast<float>(1.0 / 3.0));
    EXPECT_EQ(clip_factor(1.0, 1.0), 1.0f);  // at the limit: untouched
    EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);
    EXPECT_EQ(clip_factor(100.0, 0.0), 1.0f);  // train.grad_clip = 0 disables clipping
    EXPECT_EQ(clip_factor(0.0, 1.0), 1.0f);
}

}  // namespace
}  // namespace bagualu::optim

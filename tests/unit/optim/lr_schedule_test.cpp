// The learning-rate schedule (optim/lr_schedule.h): linear warm-up to lr, cosine decay that ends
// at min_lr on the last step, and a constant lr when there is nothing to decay over. The end
// points are exact: cos(0) = 1 and cos(M_PI) rounds to -1 in double.
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

namespace bagualu::optim {
namespace {

TEST(LrSchedule, WarmsUpLinearlyThenDecaysToMinLr) {
    const int64_t total = 101, warmup = 10;  // 91 decay steps: step 55 is halfway
    const double lr = 1e-3, min_lr = 1e-4;
    EXPECT_DOUBLE_EQ(lr_at(0, total, warmup, lr, min_lr), lr / 10);
    EXPECT_DOUBLE_EQ(lr_at(4, total, warmup, lr, min_lr), lr / 2);
    EXPECT_DOUBLE_EQ(lr_at(9, total, warmup, lr, min_lr), lr);
    EXPECT_EQ(lr_at(10, total, warmup, lr, min_lr), lr);             // decay starts at cos(0)
    EXPECT_EQ(lr_at(total - 1, total, warmup, lr, min_lr), min_lr);  // and ends at cos(pi)
    // halfway through the decay: the mean of lr and min_lr, to rounding (cos(pi/2) is 6e-17,
    // not 0; the products round at 1e-19 here)
    EXPECT_NEAR(lr_at(10 + 45, total, warmup, lr, min_lr), (lr + min_lr) / 2, 1e-18);
    for (int64_t s = warmup; s + 1 < total; ++s) {
        EXPECT_GE(lr_at(s, total, warmup, lr, min_lr), lr_at(s + 1, total, warmup, lr, min_lr))
            << "step " << s;
    }
}

TEST(LrSchedule, ConstantWithoutStepsToDecayOver) {
    EXPECT_EQ(lr_at(0, 1, 0, 3e-4, 0), 3e-4);     // one step, no warm-up
    EXPECT_EQ(lr_at(5, 6, 5, 3e-4, 1e-5), 3e-4);  // the step after warm-up is the last
}

}  // namespace
}  // namespace bagualu::optim

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

TEST(LrSchedule, CosineIsTheDefault) {
    for (int64_t s = 0; s < 101; ++s) {
        EXPECT_EQ(lr_at(s, 101, 10, 1e-3, 1e-4),
                  lr_at(s, 101, 10, 1e-3, 1e-4, LrSchedule::cosine, 0));
    }
}

TEST(LrSchedule, LinearFallsAlongAStraightLine) {
    const int64_t total = 101, warmup = 10;  // 91 decay steps, 90 intervals
    const double lr = 1e-3, min_lr = 1e-4;
    const auto at = [&](int64_t s) {
        return lr_at(s, total, warmup, lr, min_lr, LrSchedule::linear);
    };
    EXPECT_DOUBLE_EQ(at(4), lr / 2);  // the same warm-up
    EXPECT_EQ(at(10), lr);
    EXPECT_EQ(at(total - 1), min_lr);
    EXPECT_NEAR(at(10 + 45), (lr + min_lr) / 2, 1e-18);
    EXPECT_NEAR(at(10 + 30), lr - (lr - min_lr) / 3, 1e-18);
    for (int64_t s = warmup; s + 2 < total; ++s)  // equal steps down
        EXPECT_NEAR(at(s) - at(s + 1), (lr - min_lr) / 90, 1e-18) << "step " << s;
}

TEST(LrSchedule, ConstantKeepsLrAfterTheWarmUp) {
    EXPECT_DOUBLE_EQ(lr_at(1, 100, 4, 1e-3, 1e-4, LrSchedule::constant), 5e-4);
    for (int64_t s = 3; s < 100; ++s)
        EXPECT_EQ(lr_at(s, 100, 4, 1e-3, 1e-4, LrSchedule::constant), 1e-3);
}

// warmup-stable-decay: lr until the last decay_steps steps, then a straight line to min_lr
TEST(LrSchedule, WsdHoldsLrThenDecaysOverItsLastSteps) {
    const int64_t total = 100, warmup = 10, decay = 21;  // the decay: steps 79 .. 99
    const double lr = 1e-3, min_lr = 1e-5;
    const auto at = [&](int64_t s) {
        return lr_at(s, total, warmup, lr, min_lr, LrSchedule::wsd, decay);
    };
    EXPECT_DOUBLE_EQ(at(0), lr / 10);
    for (int64_t s = warmup; s <= 79; ++s) EXPECT_EQ(at(s), lr) << "step " << s;
    EXPECT_LT(at(80), lr);
    EXPECT_NEAR(at(89), (lr + min_lr) / 2, 1e-18);
    EXPECT_EQ(at(99), min_lr);
    // a decay over every step after the warm-up is the linear schedule
    for (int64_t s = 0; s < total; ++s) {
        EXPECT_EQ(lr_at(s, total, warmup, lr, min_lr, LrSchedule::wsd, total - warmup),
                  lr_at(s, total, warmup, lr, min_lr, LrSchedule::linear))
            << "step " << s;
    }
    EXPECT_EQ(lr_at(99, 100, 10, lr, min_lr, LrSchedule::wsd, 1), lr);  // nothing to decay over
}

}  // namespace
}  // namespace bagualu::optim

// Dynamic loss scaling (optim/loss_scale.h): the scale backs off on an overflow, grows after its
// window of clean steps, an overflow restarts the window, and a disabled scaler stays at 1.
#include "optim/loss_scale.h"

#include <gtest/gtest.h>

#include "config/config.h"

namespace bagualu::optim {
namespace {

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterWindow) {
    PrecisionSection p;
    p.loss_scale        = 1024;
    p.loss_scale_window = 3;
    LossScaler s(p, true);
    EXPECT_EQ(s.scale(), 1024);
    s.update(true);
    EXPECT_EQ(s.scale(), 512);
    s.update(false);
    s.update(false);
    EXPECT_EQ(s.scale(), 512);
    s.update(false);
    EXPECT_EQ(s.scale(), 1024);
    s.update(false);
    s.update(true);  // an overflow restarts the window
    s.update(false);
    s.update(false);
    EXPECT_EQ(s.scale(), 512);
    LossScaler off(p, false);
    off.update(true);
    EXPECT_EQ(off.scale(), 1);
}

}  // namespace
}  // namespace bagualu::optim

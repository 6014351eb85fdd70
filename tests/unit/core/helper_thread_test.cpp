// HelperThread runs jobs in submission order on another thread, wait() sees their effects and
// rethrows their exceptions, and a full queue blocks instead of losing jobs.
#include "core/helper_thread.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

namespace bagualu {
namespace {

TEST(HelperThreadTest, RunsJobsInOrderOnAnotherThread) {
    HelperThread h;
    std::vector<int> order;
    std::thread::id where;
    auto a = [&] {
        order.push_back(1);
        where = std::this_thread::get_id();
    };
    auto b = [&] { order.push_back(2); };
    h.submit(a);
    const auto t = h.submit(b);
    h.wait(t);
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
    EXPECT_NE(where, std::this_thread::get_id());
    EXPECT_TRUE(h.done(t));
}

TEST(HelperThreadTest, WaitRethrowsTheJobsException) {
    HelperThread h;
    auto bad     = [] { throw std::runtime_error("disk full"); };
    const auto t = h.submit(bad);
    EXPECT_THROW(h.wait(t), std::runtime_error);
    int x     = 0;
    auto good = [&] { x = 7; };
    h.wait(h.submit(good));  // the thread survives a failed job
    EXPECT_EQ(x, 7);
}

TEST(HelperThreadTest, MoreJobsThanCapacityAllRun) {
    HelperThread h;
    int count                 = 0;
    auto inc                  = [&] { ++count; };
    HelperThread::Ticket last = 0;
    for (int i = 0; i < 5 * HelperThread::kCapacity; ++i) last = h.submit(inc);
    h.wait(last);
    EXPECT_EQ(count, 5 * HelperThread::kCapacity);
}

}  // namespace
}  // namespace bagualu

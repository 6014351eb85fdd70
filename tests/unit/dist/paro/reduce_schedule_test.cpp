// ReduceSchedule (dist/paro/reduce_schedule.h): units run in descending ready point, inline without
// begin() and on the helper thread after it; a unit never starts on the helper before backward
// reported its ready point, and finish() waits for every unit.
#include "dist/paro/reduce_schedule.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace bagualu::dist::paro {
namespace {

struct Log {
    std::mutex mutex;
    std::vector<size_t> order;
    std::vector<bool> on_helper;
    void add(size_t u, bool h) {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(u);
        on_helper.push_back(h);
    }
};

TEST(ReduceSchedule, InlineWithoutBeginInDescendingReadyPoint) {
    HelperThread helper;
    Log log;
    ReduceSchedule s({10, 30, 0, 20, 30}, &helper, [&](size_t u, bool h) { log.add(u, h); });
    s.finish();
    EXPECT_EQ(log.order, (std::vector<size_t>{1, 4, 3, 0, 2}));  // ties keep the unit order
    for (const bool h : log.on_helper) EXPECT_FALSE(h);
}

TEST(ReduceSchedule, NoHelperRunsInlineEvenAfterBegin) {
    Log log;
    ReduceSchedule s({0, 8}, nullptr, [&](size_t u, bool h) { log.add(u, h); });
    EXPECT_FALSE(s.overlapped());
    s.begin();
    s.grads_ready(0);
    EXPECT_TRUE(log.order.empty());
    s.finish();
    EXPECT_EQ(log.order, (std::vector<size_t>{1, 0}));
    for (const bool h : log.on_helper) EXPECT_FALSE(h);
}

TEST(ReduceSchedule, HelperRunsUnitsOnlyOnceTheirGradientsAreFinal) {
    HelperThread helper;
    Log log;
    std::atomic<size_t> frontier{100};  // what "backward" has finished: [frontier, end)
    std::atomic<int> early{0};
    const std::vector<size_t> ready = {0, 40, 80, 60};
    const std::thread::id main      = std::this_thread::get_id();
    ReduceSchedule s(ready, &helper, [&](size_t u, bool h) {
        if (ready[u] < frontier.load()) ++early;
        EXPECT_NE(std::this_thread::get_id(), main);
        log.add(u, h);
    });
    for (int round = 0; round < 3; ++round) {  // the schedule is reused step after step
        log.order.clear();
        log.on_helper.clear();
        frontier = 100;
        s.begin();
        for (const size_t f : {90, 70, 50, 30, 10, 0}) {
            frontier = static_cast<size_t>(f);
            s.grads_ready(static_cast<size_t>(f));
            std::this_thread::yield();
        }
        s.finish();
        EXPECT_EQ(early.load(), 0);
        EXPECT_EQ(log.order, (std::vector<size_t>{2, 3, 1, 0}));
        for (const bool h : log.on_helper) EXPECT_TRUE(h);
    }
}

TEST(ReduceSchedule, FinishRethrowsAUnitsError) {
    HelperThread helper;
    ReduceSchedule s({0}, &helper, [](size_t, bool) { throw std::runtime_error("boom"); });
    s.begin();
    s.grads_ready(0);
    EXPECT_THROW(s.finish(), std::runtime_error);
}

}  // namespace
}  // namespace bagualu::dist::paro

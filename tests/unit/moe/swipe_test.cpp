// SWIPE properties over many random and adversarial routings (uniform, everything to one expert,
// everything to one worker, Zipf), with W workers simulated in one process exactly as the
// router does: after every round each expert (so each worker) receives exactly its capacity,
// every slot has one expert, requests within capacity keep their expert, the number moved is
// the minimum sum_e max(0, requests_e - capacity_e), and repeated runs agree; with the step rule
// (model.swipe_balance = "step") the same with each round's room for the capacity, and exactly
// K capacities at every expert after the last round.
#include "moe/swipe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"

namespace bagualu::moe {
namespace {

enum class Pattern { uniform, one_expert, one_worker, zipf };

// preference: (W * n, E), each row a permutation, best first.
std::vector<int32_t> make_preferences(Pattern pat, int W, int n, int E, uint64_t seed) {
    Rng rng(seed);
    const int G = E / W;
    std::vector<int32_t> pref(static_cast<size_t>(W) * n * E);
    for (int64_t t = 0; t < static_cast<int64_t>(W) * n; ++t) {
        std::vector<int32_t> p(static_cast<size_t>(E));
        std::iota(p.begin(), p.end(), 0);
        for (int i = E - 1; i > 0; --i)
            std::swap(p[static_cast<size_t>(i)], p[rng.below(static_cast<uint64_t>(i + 1))]);
        if (pat == Pattern::one_expert) {
            std::iota(p.begin(), p.end(), 0);  // everybody ranks 0, 1, 2, ...
        } else if (pat == Pattern::one_worker) {
            // the experts of the last worker first, in random order
            std::stable_partition(p.begin(), p.end(), [&](int32_t e) { return e / G == W - 1; });
        } else if (pat == Pattern::zipf) {
            double z = 0;
            for (int e = 0; e < E; ++e) z += 1.0 / std::pow(e + 1, 1.2);
            double u  = rng.uniform() * z;
            int first = 0;
            while (first < E - 1 && (u -= 1.0 / std::pow(first + 1, 1.2)) > 0) ++first;
            std::rotate(p.begin(), std::find(p.begin(), p.end(), first),
                        std::find(p.begin(), p.end(), first) + 1);
        }
        std::copy(p.begin(), p.end(), pref.begin() + t * E);
    }
    return pref;
}

struct Result {
    std::vector<int32_t> expert_idx;  // (W n, K)
    std::vector<uint8_t> reassigned;
};

// Runs K rounds for W workers of n tokens each; checks every round's invariants on the way.
// by_step: the step rule (model.swipe_balance = "step"): each expert's room in a round is its
// K rounds' capacity less what it took in the earlier ones, and the step, not each round, ends
// with exactly K capacity_e slots at every expert.
Result run_swipe(const std::vector<int32_t>& pref, int W, int n, int E, int K,
                 bool by_step = false) {
    const int64_t NT = static_cast<int64_t>(W) * n;
    Result r{std::vector<int32_t>(static_cast<size_t>(NT * K)),
             std::vector<uint8_t>(static_cast<size_t>(NT * K))};
    std::vector<int64_t> received(static_cast<size_t>(E), 0), room;
    for (int k = 0; k < K; ++k) {
        std::vector<int64_t> counts(static_cast<size_t>(W * E)), shares(static_cast<size_t>(W), n);
        for (int w = 0; w < W; ++w) {
            swipe_request(r.expert_idx.data() + static_cast<int64_t>(w) * n * K,
                          pref.data() + static_cast<int64_t>(w) * n * E, n, E, K, k);
            swipe_counts(counts.data() + w * E,
                         r.expert_idx.data() + static_cast<int64_t>(w) * n * K, n, E, K, k);
        }
        std::vector<int32_t> request(static_cast<size_t>(NT));
        for (int64_t t = 0; t < NT; ++t)
            request[static_cast<size_t>(t)] = r.expert_idx[static_cast<size_t>(t * K + k)];
        if (by_step) {
            room = swipe_capacity(shares, W, E);
            for (int e = 0; e < E; ++e)
                room[static_cast<size_t>(e)] =
                    K * room[static_cast<size_t>(e)] - received[static_cast<size_t>(e)];
        }
        const SwipePlan plan = swipe_plan(counts, shares, W, E, room);
        // what an expert may keep this round
        const std::vector<int64_t>& limit = by_step ? room : plan.capacity;
        int64_t moved                     = 0;
        for (int w = 0; w < W; ++w) {
            moved += swipe_assign(r.expert_idx.data() + static_cast<int64_t>(w) * n * K,
                                  r.reassigned.data() + static_cast<int64_t>(w) * n * K,
                                  pref.data() + static_cast<int64_t>(w) * n * E,
                                  plan.kept.data() + w * E, plan.quota.data() + w * E, n, E, K, k);
        }
        // exactly the capacity at every expert, hence every worker receives what it sends
        std::vector<int64_t> got(static_cast<size_t>(E), 0), requested(static_cast<size_t>(E), 0);
        for (int64_t t = 0; t < NT; ++t) {
            const int32_t e = r.expert_idx[static_cast<size_t>(t * K + k)];
            EXPECT_TRUE(e >= 0 && e < E);
            ++got[static_cast<size_t>(e)];
            ++requested[static_cast<size_t>(request[static_cast<size_t>(t)])];
        }
        int64_t minimum = 0;
        for (int e = 0; e < E; ++e) {
            received[static_cast<size_t>(e)] += got[static_cast<size_t>(e)];
            // the round rule: exactly the capacity at every expert in every round; the step
            // rule: never beyond the room, and exactly K capacities after the last round
            if (!by_step) {
                EXPECT_EQ(got[static_cast<size_t>(e)], plan.capacity[static_cast<size_t>(e)])
                    << "expert " << e << " round " << k;
            } else {
                EXPECT_LE(got[static_cast<size_t>(e)], room[static_cast<size_t>(e)]);
                if (k == K - 1) {
                    EXPECT_EQ(received[static_cast<size_t>(e)],
                              K * plan.capacity[static_cast<size_t>(e)])
                        << "expert " << e;
                }
            }
            minimum += std::max<int64_t>(
                0, requested[static_cast<size_t>(e)] - limit[static_cast<size_t>(e)]);
        }
        for (int w = 0; w < W && (!by_step || k == K - 1); ++w) {
            int64_t in = 0;
            for (int j = 0; j < E / W; ++j)
                in += (by_step ? received : got)[static_cast<size_t>(w * (E / W) + j)];
            EXPECT_EQ(in, by_step ? int64_t{K} * n : n) << "worker " << w;
        }
        EXPECT_EQ(moved, minimum);
        EXPECT_EQ(plan.reassigned, minimum);
        // requests within capacity keep their expert: the first capacity_e in global order
        std::vector<int64_t> seen(static_cast<size_t>(E), 0);
        for (int64_t t = 0; t < NT; ++t) {
            const int32_t e = request[static_cast<size_t>(t)];
            const bool kept = seen[static_cast<size_t>(e)]++ < limit[static_cast<size_t>(e)];
            EXPECT_EQ(kept, r.expert_idx[static_cast<size_t>(t * K + k)] == e) << "token " << t;
            EXPECT_EQ(kept, r.reassigned[static_cast<size_t>(t * K + k)] == 0) << "token " << t;
        }
    }
    return r;
}

TEST(SwipeTest, PropertiesOverManyRoutings) {
    int cases = 0;
    for (Pattern pat :
         {Pattern::uniform, Pattern::one_expert, Pattern::one_worker, Pattern::zipf}) {
        for (auto [W, E, K, n] : std::vector<std::array<int, 4>>{{1, 8, 2, 64},
                                                                 {2, 8, 2, 50},
                                                                 {4, 8, 2, 33},
                                                                 {8, 8, 1, 17},
                                                                 {4, 4, 3, 40},
                                                                 {2, 6, 2, 7},
                                                                 {3, 12, 4, 29}}) {
            for (uint64_t seed = 1; seed <= 6; ++seed) {
                const auto pref =
                    make_preferences(pat, W, n, E, seed * 131 + static_cast<uint64_t>(W));
                const Result a = run_swipe(pref, W, n, E, K);
                const Result b = run_swipe(pref, W, n, E, K);
                EXPECT_EQ(a.expert_idx, b.expert_idx);
                const Result c = run_swipe(pref, W, n, E, K, true);
                const Result d = run_swipe(pref, W, n, E, K, true);
                EXPECT_EQ(c.expert_idx, d.expert_idx);
                if (K == 1) {
                    EXPECT_EQ(a.expert_idx, c.expert_idx);  // one round: the same rule
                }
                ++cases;
            }
        }
    }
    EXPECT_EQ(cases, 4 * 7 * 6);
}

TEST(SwipeTest, EverythingToOneExpertMovesAllButItsCapacity) {
    const int W = 4, E = 8, n = 16, K = 1;
    const auto pref = make_preferences(Pattern::one_expert, W, n, E, 3);
    std::vector<int64_t> counts(W * E, 0), shares(W, n);
    for (int w = 0; w < W; ++w) counts[static_cast<size_t>(w * E)] = n;
    const SwipePlan plan = swipe_plan(counts, shares, W, E);
    EXPECT_EQ(plan.capacity[0], n / 2);
    EXPECT_EQ(plan.reassigned, W * n - n / 2);
    EXPECT_EQ(plan.kept[0], n / 2);  // worker 0's first tokens stay; nobody else's
    for (int w = 1; w < W; ++w) EXPECT_EQ(plan.kept[static_cast<size_t>(w * E)], 0);
    const Result r = run_swipe(pref, W, n, E, K);
    // the moved tokens go to their best experts with room: expert 1 fills first
    EXPECT_EQ(r.expert_idx[static_cast<size_t>(n / 2)], 1);
}

// The step rule moves only what the step cannot hold: top-2 of 4 experts, first choices all on
// expert 0 and second choices spread. The round rule moves 6 of expert 0's 8 first choices
// (capacity 2 a round); the step rule keeps 4 (its whole step's share), and the second round
// fills the rest of the step's shares.
TEST(SwipeTest, StepRuleKeepsFirstChoicesUpToTheStepsShare) {
    const int W = 1, E = 4, n = 8, K = 2;
    std::vector<int32_t> pref;
    for (int t = 0; t < n; ++t) {
        // expert 0 first, then 1 + t % 3, then the others in order
        std::vector<int32_t> p = {0, 1 + t % 3};
        for (int32_t e = 1; e < E; ++e) {
            if (e != p[1]) p.push_back(e);
        }
        pref.insert(pref.end(), p.begin(), p.end());
    }
    const Result round = run_swipe(pref, W, n, E, K), step = run_swipe(pref, W, n, E, K, true);
    const auto moved = [&](const Result& r, int k) {
        int m = 0;
        for (int t = 0; t < n; ++t) m += r.reassigned[static_cast<size_t>(t * K + k)];
        return m;
    };
    EXPECT_EQ(moved(round, 0), 6);
    EXPECT_EQ(moved(step, 0), 4);
    // the first 4 tokens keep expert 0 first under the step rule, 2 under the round rule
    for (int t = 0; t < 4; ++t) EXPECT_EQ(step.expert_idx[static_cast<size_t>(t * K)], 0) << t;
    EXPECT_NE(round.expert_idx[2 * K], 0);
}

TEST(SwipeTest, UnequalSharesStillFillEveryWorkerExactly) {
    const int W = 2, E = 4;
    std::vector<int64_t> counts = {7, 0, 0, 0, 0, 0, 5, 0}, shares = {7, 5};
    const SwipePlan plan = swipe_plan(counts, shares, W, E);
    EXPECT_EQ(plan.capacity, (std::vector<int64_t>{4, 3, 3, 2}));
    EXPECT_EQ(plan.reassigned, 3 + 2);
    // worker 0 keeps 4 at expert 0 and moves 3 to expert 1; worker 1 keeps 3 at expert 2,
    // moves 2 to expert 3
    EXPECT_EQ(plan.quota, (std::vector<int64_t>{0, 3, 0, 0, 0, 0, 0, 2}));
}

}  // namespace
}  // namespace bagualu::moe

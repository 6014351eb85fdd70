// SWIPE load balancing (BaGuaLu): after it, every worker receives exactly as many (token, slot)
// pairs as it sends, no token is dropped, and only the overflow of over-subscribed experts moves.
// Pure functions of the gathered per-worker counts and each token's own ranking of the experts:
// no communication here (the router allgathers the counts of a round around these calls).
// docs/model.md ("Gates", swipe) states the rule; one call of each step per top-k round k.
// W workers, E experts (G = E/W per worker: worker w holds experts [w G, (w+1) G)), K = top_k.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace bagualu::moe {

// The decision of one round for all W workers, computed identically on every worker.
//   capacity[e] = n_w / G + (j < n_w mod G)     e = w G + j, n_w = tokens worker w sends
//   kept[w, e]  = clamp(capacity[e] - sum_{v < w} counts[v, e], 0, counts[w, e])
//                 (an expert keeps the first capacity[e] requests in worker order)
//   spare[e]    = capacity[e] - sum_w kept[w, e]
//   quota[w, e] = dropped tokens of w that go to e: the dropped tokens of workers 0, 1, ...
//                 fill the spare slots of experts 0, 1, ... in that order
// With room (model.swipe_balance = "step"), expert e keeps up to room[e] requests instead of
// capacity[e], where room[e] = K capacity[e] - the slots e took in the step's earlier rounds:
// an expert may take its whole step's share in any round, so a round moves only what the step
// as a whole cannot hold, and the last round (room summing to its requests) evens out the step.
// Rounds before it have more room than requests; the dropped tokens then fill the spare slots
// in the same order, leaving the rest.
struct SwipePlan {
    std::vector<int64_t> capacity;  // [E]
    std::vector<int64_t> kept;      // [W * E]
    std::vector<int64_t> quota;     // [W * E]
    int64_t reassigned = 0;         // sum of quota = sum_e max(0, requests_e - capacity_e)
};

// counts: (W, E) requests of each worker per expert this round; shares: (W) tokens each worker
// sends, equal to the row sums of counts. E must be a multiple of W. room: empty (the round
// rule), or (E) with sum room >= sum shares (the step rule, above).
SwipePlan swipe_plan(std::span<const int64_t> counts, std::span<const int64_t> shares, int W, int E,
                     std::span<const int64_t> room = {});

// capacity[e] of the rule above for workers sending shares (W) tokens: (E).
std::vector<int64_t> swipe_capacity(std::span<const int64_t> shares, int W, int E);

// The slots each expert took in a round under plan p: kept plus the quota of every worker.
// received: (E), added to.
void swipe_add_received(int64_t* received, const SwipePlan& p, int W, int E);

// Round k's request of each of n tokens: its best-ranked expert not already among its experts
// of rounds < k. preference: (n, E) every expert, best first. expert_idx: (n, K); column k is
// written, columns < k are read.
void swipe_request(int32_t* expert_idx, const int32_t* preference, int n, int E, int K, int k);

// counts: (E), overwritten with the requests of column k of expert_idx.
void swipe_counts(int64_t* counts, const int32_t* expert_idx, int n, int E, int K, int k);

// Applies the plan to one worker's n tokens in round k. In token order, the first kept_w[e]
// requests for e stay; every other token takes, from this worker's remaining quota, the expert
// it ranks highest among those it does not already use (or, if every expert with quota left is
// already one of its own, the lowest such id). kept_w, quota_w: (E), worker w's rows of the plan.
// reassigned: (n, K); column k set to 1 for moved tokens, 0 otherwise. Returns how many moved.
int64_t swipe_assign(int32_t* expert_idx, uint8_t* reassigned, const int32_t* preference,
                     const int64_t* kept_w, const int64_t* quota_w, int n, int E, int K, int k);

}  // namespace bagualu::moe

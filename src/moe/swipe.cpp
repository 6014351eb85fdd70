// SWIPE plan and per-worker assignment: see swipe.h for the rule.
#include "moe/swipe.h"

#include <algorithm>

#include "core/error.h"

namespace bagualu::moe {

SwipePlan swipe_plan(std::span<const int64_t> counts, std::span<const int64_t> shares, int W, int E,
                     std::span<const int64_t> room) {
    BGL_CHECK(W > 0 && E % W == 0, "{} experts over {} workers", E, W);
    BGL_CHECK(counts.size() == static_cast<size_t>(W) * static_cast<size_t>(E) &&
                  shares.size() == static_cast<size_t>(W),
              "swipe_plan: counts {} / shares {} for W = {}, E = {}", counts.size(), shares.size(),
              W, E);
    const auto at = [E](int w, int e) {
        return static_cast<size_t>(w) * static_cast<size_t>(E) + static_cast<size_t>(e);
    };
    SwipePlan p;
    p.kept.assign(counts.size(), 0);
    p.quota.assign(counts.size(), 0);
    for (int w = 0; w < W; ++w) {
        int64_t sent = 0;
        for (int e = 0; e < E; ++e) sent += counts[at(w, e)];
        BGL_CHECK(sent == shares[static_cast<size_t>(w)],
                  "worker {} requests {} experts for {} tokens", w, sent,
                  shares[static_cast<size_t>(w)]);
    }
    p.capacity = swipe_capacity(shares, W, E);
    BGL_CHECK(room.empty() || room.size() == static_cast<size_t>(E),
              "swipe_plan: room of {} for E = {}", room.size(), E);
    // [E] room left after the kept requests
    std::vector<int64_t> spare =
        room.empty() ? p.capacity : std::vector<int64_t>(room.begin(), room.end());
    int64_t total_spare = 0, total_shares = 0;
    for (int64_t s : spare) total_spare += s;
    for (int64_t s : shares) total_shares += s;
    BGL_CHECK(total_spare >= total_shares, "swipe_plan: room for {} slots, {} requests",
              total_spare, total_shares);
    std::vector<int64_t> dropped(static_cast<size_t>(W), 0);
    for (int e = 0; e < E; ++e) {
        for (int w = 0; w < W; ++w) {
            const int64_t keep =
                std::clamp<int64_t>(spare[static_cast<size_t>(e)], 0, counts[at(w, e)]);
            p.kept[at(w, e)] = keep;
            spare[static_cast<size_t>(e)] -= keep;
            dropped[static_cast<size_t>(w)] += counts[at(w, e)] - keep;
        }
    }
    int e = 0;
    for (int w = 0; w < W; ++w) {
        int64_t need = dropped[static_cast<size_t>(w)];
        while (need > 0) {
            while (spare[static_cast<size_t>(e)] == 0) ++e;  // total spare >= total dropped
            const int64_t take = std::min(need, spare[static_cast<size_t>(e)]);
            p.quota[at(w, e)] += take;
            spare[static_cast<size_t>(e)] -= take;
            need -= take;
            p.reassigned += take;
        }
    }
    return p;
}

std::vector<int64_t> swipe_capacity(std::span<const int64_t> shares, int W, int E) {
    BGL_CHECK(W > 0 && E % W == 0 && shares.size() == static_cast<size_t>(W),
              "swipe_capacity: {} shares, W = {}, E = {}", shares.size(), W, E);
    const int G = E / W;
    std::vector<int64_t> capacity(static_cast<size_t>(E));
    for (int w = 0; w < W; ++w) {
        const int64_t n = shares[static_cast<size_t>(w)];
        for (int j = 0; j < G; ++j)
            capacity[static_cast<size_t>(w * G + j)] = n / G + (j < n % G ? 1 : 0);
    }
    return capacity;
}

void swipe_add_received(int64_t* received, const SwipePlan& p, int W, int E) {
    for (int w = 0; w < W; ++w) {
        for (int e = 0; e < E; ++e) {
            const size_t i =
                static_cast<size_t>(w) * static_cast<size_t>(E) + static_cast<size_t>(e);
            received[e] += p.kept[i] + p.quota[i];
        }
    }
}

static bool uses(const int32_t* row, int k, int32_t e) {
    for (int j = 0; j < k; ++j) {
        if (row[j] == e) return true;
    }
    return false;
}

void swipe_request(int32_t* expert_idx, const int32_t* preference, int n, int E, int K, int k) {
    for (int64_t t = 0; t < n; ++t) {
        int32_t* row        = expert_idx + t * K;
        const int32_t* pref = preference + t * E;
        int r               = 0;
        while (uses(row, k, pref[r])) ++r;  // k < K <= E, so some expert is unused
        row[k] = pref[r];
    }
}

void swipe_counts(int64_t* counts, const int32_t* expert_idx, int n, int E, int K, int k) {
    std::fill(counts, counts + E, 0);
    for (int64_t t = 0; t < n; ++t) ++counts[expert_idx[t * K + k]];
}

int64_t swipe_assign(int32_t* expert_idx, uint8_t* reassigned, const int32_t* preference,
                     const int64_t* kept_w, const int64_t* quota_w, int n, int E, int K, int k) {
    std::vector<int64_t> keep(kept_w, kept_w + E), quota(quota_w, quota_w + E);
    int64_t moved = 0;
    for (int64_t t = 0; t < n; ++t) {
        int32_t* row    = expert_idx + t * K;
        const int32_t e = row[k];
        if (keep[static_cast<size_t>(e)] > 0) {
            --keep[static_cast<size_t>(e)];
            reassigned[t * K + k] = 0;
            continue;
        }
        const int32_t* pref = preference + t * E;
        int32_t target      = -1;
        for (int r = 0; r < E && target < 0; ++r) {
            if (quota[static_cast<size_t>(pref[r])] > 0 && !uses(row, k, pref[r])) target = pref[r];
        }
        for (int32_t x = 0; x < E && target < 0; ++x) {
            if (quota[static_cast<size_t>(x)] > 0) target = x;
        }
        BGL_CHECK(target >= 0,
                  "swipe: no quota left for a dropped token (plan and counts disagree)");
        --quota[static_cast<size_t>(target)];
        row[k]                = target;
        reassigned[t * K + k] = 1;
        ++moved;
    }
    return moved;
}

}  // namespace bagualu::moe

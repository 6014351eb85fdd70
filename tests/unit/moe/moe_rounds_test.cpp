// Bounded MoE memory (moe_layer.h, token_dispatcher.h): the cut of the experts' rows into rounds
// covers every row once, in order, in pieces that start on weight-gradient blocks and fit the
// budget; and the layer gives bitwise the same outputs and gradients for every row budget, from
// the smallest (one block per round, many rounds) to unbounded, on every packed GEMM path, with
// routing forced to one expert, Zipf-skewed and as the gate chooses.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../kernels/gemm_paths.h"
#include "core/rng.h"
#include "kernels/grouped_gemm.h"
#include "moe/moe_layer.h"
#include "moe/token_dispatcher.h"

namespace bagualu::moe {
namespace {

using kernels::gemm::Path;

TEST(RowRoundsTest, PiecesCoverEveryRowOnceOnBlocksWithinTheBudget) {
    Rng rng(11);
    for (int trial = 0; trial < 200; ++trial) {
        const int El         = 1 + static_cast<int>(rng.below(6));
        const int64_t block  = 1 + static_cast<int64_t>(rng.below(40));
        const int64_t budget = block + static_cast<int64_t>(rng.below(100));
        std::vector<int64_t> totals(static_cast<size_t>(El));
        int64_t sum = 0;
        for (auto& t : totals) {
            t = rng.below(4) == 0 ? 0 : static_cast<int64_t>(rng.below(500));
            sum += t;
        }
        RowRounds rr;
        rr.reset(totals.data(), El, budget, block);
        std::vector<int64_t> next(static_cast<size_t>(El), 0);
        for (int r = 0; r < rr.rounds(); ++r) {
            rr.set_round(r);
            int64_t rows = 0;
            for (int e = 0; e < El; ++e) {
                EXPECT_EQ(rr.lo(e), next[static_cast<size_t>(e)]) << "contiguous, in order";
                if (rr.hi(e) > rr.lo(e)) {
                    EXPECT_EQ(rr.lo(e) % block, 0) << "a piece starts on a block";
                }
                EXPECT_LE(rr.hi(e), totals[static_cast<size_t>(e)]);
                rows += rr.hi(e) - rr.lo(e);
                next[static_cast<size_t>(e)] = rr.hi(e);
            }
            EXPECT_LE(rows, budget);
            EXPECT_TRUE(rows > 0 || sum == 0) << "every round moves rows";
        }
        EXPECT_EQ(next, totals);
        if (sum <= budget) {
            EXPECT_EQ(rr.rounds(), 1);
        }
        // a round is at least a block or the rest of an expert: no more rounds than that allows
        EXPECT_LE(rr.rounds(), 1 + sum / block + El);
    }
}

TEST(RowRoundsTest, BudgetSizing) {
    // max_tokens 512, K = 2: balanced load 1024 rows per rank
    EXPECT_EQ(moe_rows_budget(512, 2, 4, 0.0), 4096);  // unbounded: every row of the group
    EXPECT_EQ(moe_rows_budget(512, 2, 4, 2.0), 2048);
    EXPECT_EQ(moe_rows_budget(512, 2, 4, 1.0), 1024);  // SWIPE's exact load in training
    EXPECT_EQ(moe_rows_budget(512, 2, 4, 1e-6), kernels::kMaxTnDepthBlock);  // one block
    EXPECT_EQ(moe_rows_budget(512, 2, 4, 100.0), 4096);                      // never above all
    EXPECT_EQ(moe_rows_budget(16, 2, 2, 1e-6), 64);    // all rows below one block: all of them
    EXPECT_EQ(moe_rows_budget(512, 2, 1, 2.0), 1024);  // one rank receives what it sends
}

struct LayerResult {
    std::vector<float> out, dinp, dgate, dfc_w, dfc_b, dproj_w, dproj_b;
    int rounds = 0;
};

constexpr int kC = 24, kF = 40, kE = 4, kK = 2, kN = 700;

LayerResult run_layer(double rows_budget, RouteOverride route, const ExpertPrecision& prec) {
    Rng rng(3);
    auto fill = [&](std::vector<float>& v, size_t n, double s) {
        v.resize(n);
        for (auto& x : v) x = static_cast<float>(s * rng.normal());
    };
    std::vector<float> gate_w, fc_w, fc_b, proj_w, proj_b, inp, dout;
    fill(gate_w, kE * kC, 1.0);
    fill(fc_w, kE * kF * kC, 0.3);
    fill(fc_b, kE * kF, 0.1);
    fill(proj_w, kE * kC * kF, 0.3);
    fill(proj_b, kE * kC, 0.1);
    fill(inp, kN * kC, 1.0);
    fill(dout, kN * kC, 1.0);
    LayerResult r;
    // gradients start nonzero: they accumulate (+=), and the rounds must add as one call does
    fill(r.dgate, kE * kC, 0.01);
    fill(r.dfc_w, kE * kF * kC, 0.01);
    fill(r.dfc_b, kE * kF, 0.01);
    fill(r.dproj_w, kE * kC * kF, 0.01);
    fill(r.dproj_b, kE * kC, 0.01);
    MoEWeights w;
    w.gate_w  = gate_w.data();
    w.experts = {fc_w.data(), fc_b.data(), proj_w.data(), proj_b.data(), kF * kC, kF, kC * kF, kC};
    MoEGrads g;
    g.gate_w  = r.dgate.data();
    g.experts = {r.dfc_w.data(),   r.dfc_b.data(),
                 r.dproj_w.data(), r.dproj_b.data(),
                 kF * kC,          kF,
                 kC * kF,          kC};
    MoEShape s{kC, kF, kE, kK, 0.01};
    s.rows_budget         = rows_budget;
    s.gate.route_override = route;
    s.prec                = prec;
    MoELayer layer(s, kN);
    layer.set_routing_context({7, 3, true});
    r.out.resize(kN * kC);
    r.dinp.resize(kN * kC);
    layer.forward(r.out.data(), inp.data(), w, kN);
    layer.backward(r.dinp.data(), g, dout.data(), inp.data(), w, 1.0);
    r.rounds = layer.rounds();
    return r;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

TEST(MoERoundsTest, EveryBudgetGivesBitwiseTheSameOutputsAndGradients) {
    kernels::testing::PathGuard guard;
    const ExpertPrecision bf16{Dtype::bfloat16, Dtype::bfloat16, false};
    for (Path path : kernels::testing::supported_paths()) {
        if (path == Path::ref || path == Path::openblas) continue;  // no exact depth split there
        kernels::gemm::set_active_path(path);
        for (RouteOverride route :
             {RouteOverride::one_expert, RouteOverride::zipf, RouteOverride::none}) {
            for (const ExpertPrecision& prec : {ExpertPrecision{}, bf16}) {
                const LayerResult ref = run_layer(0.0, route, prec);
                EXPECT_EQ(ref.rounds, 1);
                // 1e-6: one weight-gradient block per round; 0.2: 280 rows, not a multiple
                // of any block; 0.6: 840 rows
                for (double budget : {1e-6, 0.2, 0.6}) {
                    const std::string what = std::string(kernels::gemm::path_name(path)) +
                                             " route " + std::to_string(int(route)) + " prec " +
                                             std::to_string(int(prec.gemm)) + " budget " +
                                             std::to_string(budget);
                    const LayerResult got = run_layer(budget, route, prec);
                    if (route == RouteOverride::one_expert) {
                        // 700 rows on each of experts 0 and 1 cannot fit in 280 or 256 rows
                        EXPECT_GT(got.rounds, budget < 0.5 ? 2 : 1) << what;
                    }
                    expect_bitwise(got.out, ref.out, what + " out");
                    expect_bitwise(got.dinp, ref.dinp, what + " dinp");
                    expect_bitwise(got.dgate, ref.dgate, what + " dgate");
                    expect_bitwise(got.dfc_w, ref.dfc_w, what + " dfc_w");
                    expect_bitwise(got.dfc_b, ref.dfc_b, what + " dfc_b");
                    expect_bitwise(got.dproj_w, ref.dproj_w, what + " dproj_w");
                    expect_bitwise(got.dproj_b, ref.dproj_b, what + " dproj_b");
                }
            }
        }
    }
}

TEST(MoERoundsTest, RouteOverrideForcesTheChoice) {
    for (RouteOverride route : {RouteOverride::one_expert, RouteOverride::one_rank}) {
        MoEShape s{kC, kF, kE, kK, 0.0};
        s.gate.route_override = route;
        MoELayer layer(s, kN);
        Rng rng(4);
        std::vector<float> gate_w(kE * kC), inp(kN * kC), out(kN * kC), zeros(kE * kF * kC, 0.0f);
        for (auto& x : gate_w) x = static_cast<float>(rng.normal());
        for (auto& x : inp) x = static_cast<float>(rng.normal());
        MoEWeights w;
        w.gate_w  = gate_w.data();
        w.experts = {zeros.data(), zeros.data(), zeros.data(), zeros.data(), 0, 0, 0, 0};
        layer.forward(out.data(), inp.data(), w, kN);
        // one rank holds all 4 experts here, so one_rank spreads over them: 2 slots of 700
        // tokens over max(El, K) = 4 experts
        for (int e = 0; e < kE; ++e) {
            const int want = route == RouteOverride::one_expert ? (e < kK ? kN : 0) : kN * kK / kE;
            EXPECT_EQ(layer.tokens_per_expert()[e], want) << "expert " << e;
        }
        for (int i = 0; i < kN * kK; ++i) {
            EXPECT_GT(layer.probs()[i], 0.0f);  // the gate's weights, not forced
        }
    }
}

TEST(MoERoundsTest, ZipfSkewsTowardsTheFirstExperts) {
    MoEShape s{kC, kF, kE, 1, 0.0};
    s.gate.route_override = RouteOverride::zipf;
    MoELayer layer(s, kN);
    std::vector<float> gate_w(kE * kC, 0.0f), inp(kN * kC, 1.0f), out(kN * kC), zeros(kE * kF * kC);
    MoEWeights w;
    w.gate_w  = gate_w.data();
    w.experts = {zeros.data(), zeros.data(), zeros.data(), zeros.data(), 0, 0, 0, 0};
    layer.set_routing_context({1, 0, true});
    layer.forward(out.data(), inp.data(), w, kN);
    // P(e) = (1/(e+1)) / H_4 with H_4 = 25/12: 0.48, 0.24, 0.16, 0.12 of 700 tokens; 5 sigma
    // of a binomial (at most 5 * sqrt(700 * 0.25) = 66 tokens) apart from each other
    const int32_t* tpe = layer.tokens_per_expert();
    EXPECT_NEAR(tpe[0], 336, 66);
    EXPECT_NEAR(tpe[1], 168, 55);
    EXPECT_GT(tpe[0], tpe[2]);
    EXPECT_GT(tpe[1], tpe[3]);
}

}  // namespace
}  // namespace bagualu::moe

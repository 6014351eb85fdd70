// MoE layer: each token's output is the sum over its selected experts of gate weight times that
// expert's MLP applied alone (computed here in double, without the layer's permutation), and
// the routing keeps every (token, slot) exactly once.
#include "moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "moe/dispatch.h"
#include "moe/gate.h"

namespace bagualu::moe {
namespace {

double gelu(double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(MoELayerTest, OutputIsGateWeightedSumOfSelectedExperts) {
    const int C = 12, F = 20, E = 5, K = 2, N = 37;
    Rng rng(5);
    auto fill = [&](std::vector<float>& v, size_t n, double s) {
        v.resize(n);
        for (auto& x : v) x = static_cast<float>(s * rng.normal());
    };
    std::vector<float> gate_w, fc_w, fc_b, proj_w, proj_b, inp;
    fill(gate_w, E * C, 1.0);
    fill(fc_w, E * F * C, 0.3);
    fill(fc_b, E * F, 0.1);
    fill(proj_w, E * C * F, 0.3);
    fill(proj_b, E * C, 0.1);
    fill(inp, N * C, 1.0);
    MoEWeights w;
    w.gate_w                = gate_w.data();
    w.experts.fc_w          = fc_w.data();
    w.experts.fc_b          = fc_b.data();
    w.experts.proj_w        = proj_w.data();
    w.experts.proj_b        = proj_b.data();
    w.experts.fc_w_stride   = F * C;
    w.experts.fc_b_stride   = F;
    w.experts.proj_w_stride = C * F;
    w.experts.proj_b_stride = C;
    MoELayer layer(MoEShape{C, F, E, K, 0.0}, N);
    std::vector<float> out(N * C);
    layer.forward(out.data(), inp.data(), w, N);

    for (int t = 0; t < N; ++t) {
        const float* x = inp.data() + t * C;
        // logits and the top-k, recomputed independently
        std::vector<double> logit(E);
        for (int e = 0; e < E; ++e) {
            for (int c = 0; c < C; ++c) logit[e] += double(gate_w[e * C + c]) * x[c];
        }
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
        double z = 0;
        for (int k = 0; k < K; ++k) z += std::exp(logit[order[k]] - logit[order[0]]);
        std::vector<double> expect(C, 0.0);
        for (int k = 0; k < K; ++k) {
            const int e     = order[k];
            const double pk = std::exp(logit[e] - logit[order[0]]) / z;
            EXPECT_EQ(layer.expert_idx()[t * K + k], e);
            EXPECT_NEAR(layer.probs()[t * K + k], pk, 1e-6);
            std::vector<double> h(F);
            for (int f = 0; f < F; ++f) {
                double a = fc_b[e * F + f];
                for (int c = 0; c < C; ++c) a += double(fc_w[(e * F + f) * C + c]) * x[c];
                h[f] = gelu(a);
            }
            for (int c = 0; c < C; ++c) {
                double a = proj_b[e * C + c];
                for (int f = 0; f < F; ++f) a += double(proj_w[(e * C + c) * F + f]) * h[f];
                expect[c] += pk * a;
            }
        }
        for (int c = 0; c < C; ++c) {
            // float32 GEMMs of length <= 20 against a double reference: 1e-4 relative is ample
            EXPECT_NEAR(out[t * C + c], expect[c], 1e-4 * (1 + std::fabs(expect[c])))
                << "token " << t;
        }
    }
    int total = 0;
    for (int e = 0; e < E; ++e) total += layer.tokens_per_expert()[e];
    EXPECT_EQ(total, N * K);
}

TEST(MoEDispatchTest, EverySlotPlacedOnceAndCombineOfIdentityIsIdentity) {
    const int N = 50, E = 6, K = 3, C = 4;
    Rng rng(8);
    std::vector<int32_t> idx(N * K), tpe(E, 0);
    for (int t = 0; t < N; ++t) {
        std::vector<int> e(E);
        std::iota(e.begin(), e.end(), 0);
        for (int i = E - 1; i > 0; --i) std::swap(e[i], e[rng.below(i + 1)]);
        for (int k = 0; k < K; ++k) {
            idx[t * K + k] = e[k];
            ++tpe[e[k]];
        }
    }
    tpe[0] = 0;  // an expert with no tokens
    for (int t = 0; t < N; ++t) {
        for (int k = 0; k < K; ++k) {
            if (idx[t * K + k] == 0) idx[t * K + k] = 1;
        }
    }
    std::fill(tpe.begin(), tpe.end(), 0);
    for (int32_t e : idx) ++tpe[e];
    std::vector<int32_t> row_of(N * K), token_of_row(N * K), offsets(E + 1);
    build_routing(row_of.data(), token_of_row.data(), offsets.data(), idx.data(), tpe.data(), N, E,
                  K);
    std::vector<int> seen(N * K, 0);
    for (int i = 0; i < N * K; ++i) {
        ++seen[row_of[i]];
        EXPECT_EQ(token_of_row[row_of[i]], i / K);
        const int e = idx[i];
        EXPECT_GE(row_of[i], offsets[e]);
        EXPECT_LT(row_of[i], offsets[e + 1]);
    }
    for (int s : seen) EXPECT_EQ(s, 1);
    // permute then combine with weights summing to 1 gives back the input
    std::vector<float> x(N * C), xp(N * K * C), out(N * C), probs(N * K, 1.0f / K);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    permute_forward(xp.data(), x.data(), token_of_row.data(), N * K, C);
    unpermute_forward(out.data(), xp.data(), probs.data(), row_of.data(), N, K, C);
    for (int i = 0; i < N * C; ++i) EXPECT_NEAR(out[i], x[i], 1e-6);
}

TEST(TopKGateTest, AuxLossMatchesDefinition) {
    const int N = 9, E = 4, K = 2;
    Rng rng(3);
    std::vector<float> logits(N * E), probs(N * K), sm(N * E);
    for (auto& v : logits) v = static_cast<float>(rng.normal());
    std::vector<int32_t> idx(N * K), tpe(E);
    topk_gate_forward(probs.data(), idx.data(), sm.data(), tpe.data(), logits.data(), N, E, K);
    std::vector<double> psum(E), f(E);
    std::vector<int64_t> tpe64(tpe.begin(), tpe.end());
    gate_prob_sums(psum.data(), sm.data(), N, E);
    const double aux = aux_loss(f.data(), tpe64.data(), psum.data(), N, E, K, 0.5);
    double expect    = 0;
    for (int e = 0; e < E; ++e) {
        double P = 0;
        for (int t = 0; t < N; ++t) {
            double z = 0;
            for (int j = 0; j < E; ++j) z += std::exp(double(logits[t * E + j]));
            P += std::exp(double(logits[t * E + e])) / z / N;
        }
        expect += double(tpe[e]) / (N * K) * P;
    }
    EXPECT_NEAR(aux, 0.5 * E * expect, 1e-6);
}

}  // namespace
}  // namespace bagualu::moe

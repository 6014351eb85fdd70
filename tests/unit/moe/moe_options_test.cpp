// Shared experts (docs/model.md, "Shared experts"): the MoE output is the routed output plus
// every shared expert's FFN of each token, their tensors sit in the layout where the tensor
// table says, and the whole model's gradient matches central differences with them on. The
// router z-loss and sigmoid scores: values against the definitions and gradients by central
// differences.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "../../common/tiny_model.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "moe/moe_layer.h"

namespace bagualu::moe {
namespace {

std::vector<float> normal(size_t n, Rng& rng, double sd = 1.0) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(sd * rng.normal());
    return v;
}

// Gate and expert weights of one MoE layer without shared experts, N(0, 1).
struct RandomMoE {
    std::vector<float> gate, fc_w, fc_b, pw, pb;
    MoEWeights w;
    RandomMoE(Rng& rng, int C, int F, int E)
        : gate(normal(size_t(E) * C, rng)),
          fc_w(normal(size_t(E) * F * C, rng)),
          fc_b(normal(size_t(E) * F, rng)),
          pw(normal(size_t(E) * C * F, rng)),
          pb(normal(size_t(E) * C, rng)) {
        w.gate_w  = gate.data();
        w.experts = {fc_w.data(),   fc_b.data(), pw.data(),     pb.data(),
                     size_t(F) * C, size_t(F),   size_t(C) * F, size_t(C)};
    }
};

// The gradient slots of a layer with r's shapes: the gate's in g (sized by the caller), the
// experts' in e, sized here.
MoEGrads grads_into(const RandomMoE& r, int C, int F, std::vector<float>& g,
                    std::vector<float>& e) {
    e.assign(r.fc_w.size() + r.fc_b.size() + r.pw.size() + r.pb.size(), 0.0f);
    MoEGrads d;
    d.gate_w  = g.data();
    float* p  = e.data();
    d.experts = {p,
                 p + r.fc_w.size(),
                 p + r.fc_w.size() + r.fc_b.size(),
                 p + r.fc_w.size() + r.fc_b.size() + r.pw.size(),
                 size_t(F) * C,
                 size_t(F),
                 size_t(C) * F,
                 size_t(C)};
    return d;
}

// y (C) += W2 gelu(W1 x + b1) + b2 in double: W1 (F, C), W2 (C, F).
void ffn_reference(std::vector<double>& y, const float* x, const float* w1, const float* b1,
                   const float* w2, const float* b2, int C, int F) {
    for (int c = 0; c < C; ++c) y[static_cast<size_t>(c)] += b2[c];
    for (int f = 0; f < F; ++f) {
        double h = b1[f];
        for (int c = 0; c < C; ++c) h += double(w1[f * C + c]) * x[c];
        const double g =
            0.5 * h * (1 + std::tanh(std::sqrt(2 / M_PI) * (h + 0.044715 * h * h * h)));
        for (int c = 0; c < C; ++c) y[static_cast<size_t>(c)] += double(w2[c * F + f]) * g;
    }
}

TEST(SharedExpertsTest, OutputIsRoutedOutputPlusEverySharedExpert) {
    const int N = 7, C = 8, F = 12, E = 4, K = 2, S = 3, FS = 10;
    Rng rng(5);
    MoEShape with{C, F, E, K, 0.0};
    with.n_shared = S;
    with.FS       = FS;
    MoEShape without{C, F, E, K, 0.0};
    MoELayer a(with, N), b(without, N);
    const auto gate = normal(size_t(E) * C, rng), inp = normal(size_t(N) * C, rng);
    const auto fc_w = normal(size_t(E) * F * C, rng, 0.3), fc_b = normal(size_t(E) * F, rng, 0.1);
    const auto pw = normal(size_t(E) * C * F, rng, 0.3), pb = normal(size_t(E) * C, rng, 0.1);
    const auto sfw = normal(size_t(S) * FS * C, rng, 0.3), sfb = normal(size_t(S) * FS, rng, 0.1);
    const auto spw = normal(size_t(S) * C * FS, rng, 0.3), spb = normal(size_t(S) * C, rng, 0.1);
    MoEWeights w;
    w.gate_w  = gate.data();
    w.experts = {fc_w.data(),   fc_b.data(), pw.data(),     pb.data(),
                 size_t(F) * C, size_t(F),   size_t(C) * F, size_t(C)};
    w.shared  = {sfw.data(),     sfb.data(), spw.data(),     spb.data(),
                 size_t(FS) * C, size_t(FS), size_t(C) * FS, size_t(C)};
    std::vector<float> ya(size_t(N) * C), yb(size_t(N) * C);
    a.forward(ya.data(), inp.data(), w, N);
    b.forward(yb.data(), inp.data(), w, N);
    for (int t = 0; t < N; ++t) {
        std::vector<double> ref(size_t(C), 0.0);
        for (int c = 0; c < C; ++c) ref[size_t(c)] = yb[size_t(t) * C + c];
        for (int i = 0; i < S; ++i) {
            ffn_reference(ref, inp.data() + t * C, sfw.data() + size_t(i) * FS * C,
                          sfb.data() + i * FS, spw.data() + size_t(i) * C * FS, spb.data() + i * C,
                          C, FS);
        }
        // float32 GEMMs of length 8-12 on O(1) values against a double reference:
        // a few float ulps of O(10) sums
        for (int c = 0; c < C; ++c) {
            EXPECT_NEAR(ya[size_t(t) * C + c], ref[size_t(c)],
                        1e-4 * (1 + std::abs(ref[size_t(c)])))
                << "token " << t << " channel " << c;
        }
    }
}

TEST(SharedExpertsTest, LayoutHoldsEverySharedExpertOnEveryRank) {
    ModelConfig m      = testing::tiny_moe_config();
    m.n_shared_experts = 2;
    m.shared_d_ff      = 20;
    for (const auto& [ep, rank] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{4, 3}}) {
        const model::ParamLayout L = model::make_layout(m, ep, rank);
        for (int i = 0; i < 2; ++i) {
            const std::string p       = "h.1.moe.shared." + std::to_string(i) + ".";
            const model::ParamSpec* s = L.find(p + "c_fc.weight");
            ASSERT_NE(s, nullptr) << p << " ep " << ep;
            EXPECT_EQ(s->shape, (std::vector<int64_t>{20, 16}));
            EXPECT_FALSE(s->expert);
            EXPECT_TRUE(s->decay);
            EXPECT_FALSE(L.find(p + "c_fc.bias")->decay);
            EXPECT_EQ(L.find(p + "c_proj.weight")->shape, (std::vector<int64_t>{16, 20}));
        }
        EXPECT_EQ(L.find("h.0.moe.shared.0.c_fc.weight"), nullptr);  // block 0 is dense
        EXPECT_EQ(L.find("h.1.moe.shared.2.c_fc.weight"), nullptr);
        std::vector<float> params(L.total_floats());
        const auto t = model::resolve<float>(L, m, params.data(), ep, rank);
        EXPECT_EQ(t.blocks[1].shared.proj_w + t.blocks[1].shared.proj_w_stride,
                  params.data() + L.find("h.1.moe.shared.1.c_proj.weight")->offset);
    }
    // without shared experts the layout is the one without the keys, tensor for tensor
    ModelConfig off            = testing::tiny_moe_config();
    off.shared_d_ff            = 20;
    const model::ParamLayout a = model::make_layout(off),
                             b = model::make_layout(testing::tiny_moe_config());
    ASSERT_EQ(a.specs().size(), b.specs().size());
    for (size_t i = 0; i < a.specs().size(); ++i) EXPECT_EQ(a.spec(i).name, b.spec(i).name);
}

// The whole model's gradient (loss + aux) along each tensor's gradient against central
// differences in double; returns how many tensors whose name holds `part` were checked.
int expect_gradient_matches(const ModelConfig& m, const std::string& part,
                            const model::PrecisionPolicy& prec = {}) {
    const int B = 2, T = 12, K = m.top_k;
    model::GPT gpt(m, B, nullptr, 1, prec);
    model::init_params(gpt.params(), gpt.layout(), m, 7);
    Rng rng(99);
    for (size_t i = 0; i < gpt.n_floats(); ++i)
        gpt.params()[i] += static_cast<float>(0.1 * rng.normal());
    std::vector<int32_t> x(B * T), y(B * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(61));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(61));
    auto objective = [&] { return gpt.forward(x.data(), y.data(), B, T) + gpt.aux_loss(); };
    objective();
    gpt.zero_grad();
    gpt.backward(1.0f);
    const std::vector<float> grad(gpt.grads(), gpt.grads() + gpt.n_floats());
    auto routing = [&] {
        const auto& layer = gpt.moe_layers()[0];
        return std::vector<int32_t>(layer->expert_idx(), layer->expert_idx() + B * T * K);
    };
    const std::vector<int32_t> base = routing();
    int checked = 0, named = 0, skipped = 0;
    for (const model::ParamSpec& s : gpt.layout().specs()) {
        double gnorm = 0;
        for (size_t i = 0; i < s.numel; ++i)
            gnorm += double(grad[s.offset + i]) * grad[s.offset + i];
        gnorm = std::sqrt(gnorm);
        if (gnorm < 1e-3) continue;
        std::vector<float> saved(gpt.params() + s.offset, gpt.params() + s.offset + s.numel);
        bool crossed = false;
        auto shift   = [&](double t) {
            for (size_t i = 0; i < s.numel; ++i)
                gpt.params()[s.offset + i] =
                    saved[i] + static_cast<float>(t * grad[s.offset + i] / gnorm);
            const double v = objective();
            crossed        = crossed || routing() != base;
            return v;
        };
        // central differences in double along the gradient; a step that changes the routing
        // leaves the piece the derivative lives on: retried at a quarter, else skipped
        double h = 1e-2, num = 0;
        for (int attempt = 0; attempt < 2; ++attempt, h /= 4) {
            crossed = false;
            num     = (shift(h) - shift(-h)) / (2 * h);
            if (!crossed) break;
        }
        std::copy(saved.begin(), saved.end(), gpt.params() + s.offset);
        if (crossed) {
            ++skipped;
            continue;
        }
        // float32 forward: ~1e-6 relative noise in the loss, so 2e-4 absolute at h = 1e-2
        EXPECT_NEAR(gnorm, num, 2e-4 * 1e-2 / h + 2e-2 * gnorm) << s.name << " along its gradient";
        ++checked;
        named += s.name.find(part) != std::string::npos ? 1 : 0;
    }
    EXPECT_LE(skipped, 3);
    EXPECT_GT(checked, 20);
    return named;
}

TEST(SharedExpertsTest, FullGradientMatchesCentralDifferences) {
    ModelConfig m      = testing::tiny_moe_config();
    m.n_shared_experts = 2;
    m.shared_d_ff      = 20;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.shared."), 8) << "every shared-expert tensor";
}

// z-loss = coef * mean_t (logsumexp_e g[t, e])^2 over the layer's tokens (docs/model.md)
TEST(RouterZLossTest, ValueMatchesDefinition) {
    const int N = 9, C = 8, F = 12, E = 5, K = 2;
    Rng rng(11);
    MoEShape z{C, F, E, K, 0.0};
    z.gate.z_loss_coef = 0.25;
    MoEShape off{C, F, E, K, 0.0};
    MoELayer a(z, N), b(off, N);
    const RandomMoE r(rng, C, F, E);
    const std::vector<float>& gate = r.gate;
    const MoEWeights& w            = r.w;
    const auto inp                 = normal(size_t(N) * C, rng);
    std::vector<float> ya(size_t(N) * C), yb(size_t(N) * C);
    const double za = a.forward(ya.data(), inp.data(), w, N),
                 zb = b.forward(yb.data(), inp.data(), w, N);
    EXPECT_EQ(zb, 0.0);
    EXPECT_EQ(ya, yb) << "the z-loss changes no routing or output";
    double ref = 0;
    for (int t = 0; t < N; ++t) {
        double sum = 0;
        for (int e = 0; e < E; ++e) {
            double g = 0;
            for (int c = 0; c < C; ++c)
                g += double(gate[size_t(e) * C + c]) * inp[size_t(t) * C + c];
            sum += std::exp(g);
        }
        ref += std::log(sum) * std::log(sum);
    }
    ref *= 0.25 / N;
    // float32 logits of length-8 dot products: ~1e-6 relative in each logit
    EXPECT_NEAR(za, ref, 1e-5 * ref);
}

TEST(RouterZLossTest, FullGradientMatchesCentralDifferences) {
    ModelConfig m        = testing::tiny_moe_config();
    m.aux_loss_coef      = 0;  // the z-loss alone on the gate
    m.router_z_loss_coef = 0.5;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "the gate weight";
}

// precision.router = "fp64": the gate's logits and gradients with double sums. Same routing as
// float32 on generic inputs, weights and input gradients within float32's GEMM error of them,
// and the model's gradient matches central differences with it on.
TEST(RouterFp64Test, RoutesAsFloat32AndGradientMatches) {
    const int N = 11, C = 16, F = 12, E = 6, K = 2;
    Rng rng(17);
    MoEShape s32{C, F, E, K, 0.01};
    MoEShape s64  = s32;
    s64.gate.fp64 = true;
    MoELayer a(s32, N), b(s64, N);
    const RandomMoE r(rng, C, F, E);
    const auto inp = normal(size_t(N) * C, rng), dout = normal(size_t(N) * C, rng);
    std::vector<float> ya(size_t(N) * C), yb(ya.size());
    const double auxa = a.forward(ya.data(), inp.data(), r.w, N);
    const double auxb = b.forward(yb.data(), inp.data(), r.w, N);
    EXPECT_EQ(std::vector<int32_t>(a.expert_idx(), a.expert_idx() + N * K),
              std::vector<int32_t>(b.expert_idx(), b.expert_idx() + N * K));
    // length-16 float32 dot products of N(0, 1) values: logits within ~1e-6 of the double ones
    EXPECT_NEAR(auxa, auxb, 1e-6 * auxa);
    for (int i = 0; i < N * K; ++i) EXPECT_NEAR(a.probs()[i], b.probs()[i], 1e-5) << i;
    std::vector<float> dga(size_t(E) * C), dgb(dga.size()), dxa(inp.size()), dxb(inp.size());
    std::vector<float> ea, eb;  // the experts' gradients (grads_into)
    MoEGrads ga = grads_into(r, C, F, dga, ea), gb = grads_into(r, C, F, dgb, eb);
    a.backward(dxa.data(), ga, dout.data(), inp.data(), r.w, 1.0);
    b.backward(dxb.data(), gb, dout.data(), inp.data(), r.w, 1.0);
    bool differ = false;
    for (size_t i = 0; i < dga.size(); ++i) {
        EXPECT_NEAR(dga[i], dgb[i], 1e-4 * (1 + std::fabs(dga[i]))) << i;
        differ = differ || dga[i] != dgb[i];
    }
    EXPECT_TRUE(differ) << "the fp64 path ran";
    for (size_t i = 0; i < dxa.size(); ++i)
        EXPECT_NEAR(dxa[i], dxb[i], 1e-4 * (1 + std::fabs(dxa[i])));

    ModelConfig m = testing::tiny_moe_config();
    model::PrecisionPolicy prec;
    prec.router = RouterPrecision::fp64;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate.", prec), 1) << "the gate weight";
}

// precision.router = "half": the gate's products take operands rounded to the half type, with
// float32 accumulation. Forward: the logits are those of a float32 router fed the rounded input
// and weight (the same products; float32 sums in another order where the CPU multiplies in
// 16 bits), and differ from the unrounded ones. Backward rounds the logits' gradient as well:
// the gate's gradient within the half type's relative precision of the float32 router's, and
// not equal to it. The float32 gate weight itself is never rounded. bf16 on 16-bit copies (the
// default) and, where gemm_bf16 only widens, on the rounded floats (kernels::bf16_float_operands).
TEST(RouterHalfTest, ProductsOfRoundedOperands) {
    const int N = 13, C = 32, F = 12, E = 8, K = 2;
    const std::pair<Dtype, bool> cases[] = {
        {Dtype::bfloat16, false}, {Dtype::bfloat16, true}, {Dtype::float16, false}};
    for (const auto& [d, copies] : cases) {
        SCOPED_TRACE(std::string(dtype_name(d)) + (copies ? ", 16-bit copies" : ""));
        kernels::bf16_float_operands(!copies);
        Rng rng(23);
        MoEShape sh{C, F, E, K, 0.01}, s32{C, F, E, K, 0.01};
        sh.gate.half = d;
        MoELayer h(sh, N), r(s32, N), f(s32, N);
        RandomMoE w(rng, C, F, E);
        const std::vector<float> gate0 = w.gate;
        const auto inp = normal(size_t(N) * C, rng), dout = normal(size_t(N) * C, rng);
        std::vector<float> inp_r = inp;
        RandomMoE wr             = w;  // its weights rounded, pointing at its own vectors
        wr.w.gate_w              = wr.gate.data();
        wr.w.experts             = {wr.fc_w.data(), wr.fc_b.data(), wr.pw.data(),  wr.pb.data(),
                                    size_t(F) * C,  size_t(F),      size_t(C) * F, size_t(C)};
        for (float& x : inp_r) x = round_to(d, x);
        for (float& x : wr.gate) x = round_to(d, x);
        std::vector<float> yh(inp.size()), yr(inp.size()), yf(inp.size());
        h.forward(yh.data(), inp.data(), w.w, N);
        r.forward(yr.data(), inp_r.data(), wr.w, N);
        f.forward(yf.data(), inp.data(), w.w, N);
        double most_from_unrounded = 0;
        for (int i = 0; i < N * K; ++i) {
            ASSERT_EQ(h.expert_idx()[i], r.expert_idx()[i]) << i;
            // weights of logits that are length-32 float32 sums of exact products: ~1e-6
            EXPECT_NEAR(h.probs()[i], r.probs()[i], 1e-5) << i;
            if (h.expert_idx()[i] == f.expert_idx()[i])
                most_from_unrounded =
                    std::max<double>(most_from_unrounded, std::fabs(h.probs()[i] - f.probs()[i]));
        }
        EXPECT_GT(most_from_unrounded, 1e-4) << "the operands were rounded";

        std::vector<float> dgh(size_t(E) * C), dgf(dgh.size()), dxh(inp.size()), dxf(inp.size());
        std::vector<float> eh, ef;
        MoEGrads gh = grads_into(w, C, F, dgh, eh), gf = grads_into(w, C, F, dgf, ef);
        h.backward(dxh.data(), gh, dout.data(), inp.data(), w.w, 1.0);
        f.backward(dxf.data(), gf, dout.data(), inp.data(), w.w, 1.0);
        double scale = 0, err = 0;
        for (size_t i = 0; i < dgh.size(); ++i) {
            scale = std::max<double>(scale, std::fabs(dgf[i]));
            err   = std::max<double>(err, std::fabs(dgh[i] - dgf[i]));
        }
        // operands with 8 (bf16) or 11 (fp16) significant bits, sums of 13 products: a few
        // 2^-8 of the largest element at most; and the rounding shows
        EXPECT_LT(err, 0.05 * scale);
        EXPECT_GT(err, 0.0);
        EXPECT_EQ(w.gate, gate0) << "the float32 weight is not rounded";
        kernels::bf16_float_operands(false);
    }
}

// model.product_keys: expert a E2 + b's logit is u_a . x + v_b . x. Against a flat gate whose
// row a E2 + b is u_a + v_b: the same routing, the weights within float32 rounding of the two
// sums, and the key rows' gradients the row and column sums of the flat gate's (its row
// gradients summed over b for u_a, over a for v_b), within float32 summation error. The model's
// gradient matches central differences with it on, with softmax and sigmoid scores.
TEST(ProductKeyGateTest, IsTheFlatGateOfSummedRowsAndGradientMatches) {
    const int N = 17, C = 16, F = 12, E1 = 2, E2 = 3, E = E1 * E2, G = E1 + E2, K = 2;
    Rng rng(31);
    MoEShape spk{C, F, E, K, 0.01}, sflat{C, F, E, K, 0.01};
    spk.gate.product_keys = E1;
    MoELayer pk(spk, N), flat(sflat, N);
    RandomMoE w(rng, C, F, E);
    const std::vector<float> keys = normal(size_t(G) * C, rng);
    std::vector<float> rows(size_t(E) * C);
    for (int a = 0; a < E1; ++a)
        for (int b = 0; b < E2; ++b)
            for (int c = 0; c < C; ++c)
                rows[size_t(a * E2 + b) * C + c] =
                    keys[size_t(a) * C + c] + keys[size_t(E1 + b) * C + c];
    MoEWeights wpk = w.w, wflat = w.w;
    wpk.gate_w     = keys.data();
    wflat.gate_w   = rows.data();
    const auto inp = normal(size_t(N) * C, rng), dout = normal(size_t(N) * C, rng);
    std::vector<float> y1(inp.size()), y2(inp.size());
    const double aux1 = pk.forward(y1.data(), inp.data(), wpk, N);
    const double aux2 = flat.forward(y2.data(), inp.data(), wflat, N);
    EXPECT_EQ(std::vector<int32_t>(pk.expert_idx(), pk.expert_idx() + N * K),
              std::vector<int32_t>(flat.expert_idx(), flat.expert_idx() + N * K));
    // logits of 16 products each way, summed in another order: ~1e-6 relative
    EXPECT_NEAR(aux1, aux2, 1e-5 * aux2);
    for (int i = 0; i < N * K; ++i) EXPECT_NEAR(pk.probs()[i], flat.probs()[i], 1e-5) << i;

    std::vector<float> dg1(size_t(G) * C), dg2(size_t(E) * C), dx1(inp.size()), dx2(inp.size());
    std::vector<float> e1, e2;
    MoEGrads g1 = grads_into(w, C, F, dg1, e1), g2 = grads_into(w, C, F, dg2, e2);
    pk.backward(dx1.data(), g1, dout.data(), inp.data(), wpk, 1.0);
    flat.backward(dx2.data(), g2, dout.data(), inp.data(), wflat, 1.0);
    for (int c = 0; c < C; ++c) {
        for (int a = 0; a < E1; ++a) {
            double s = 0;
            for (int b = 0; b < E2; ++b) s += dg2[size_t(a * E2 + b) * C + c];
            EXPECT_NEAR(dg1[size_t(a) * C + c], s, 1e-4 * (1 + std::fabs(s))) << "u" << a;
        }
        for (int b = 0; b < E2; ++b) {
            double s = 0;
            for (int a = 0; a < E1; ++a) s += dg2[size_t(a * E2 + b) * C + c];
            EXPECT_NEAR(dg1[size_t(E1 + b) * C + c], s, 1e-4 * (1 + std::fabs(s))) << "v" << b;
        }
    }
    for (size_t i = 0; i < dx1.size(); ++i)
        EXPECT_NEAR(dx1[i], dx2[i], 1e-4 * (1 + std::fabs(dx2[i]))) << i;

    ModelConfig m  = testing::tiny_moe_config();
    m.product_keys = 2;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "the gate's key rows";
    // the tiny model (4 experts: keys of 2 x 2, top-2): larger ones change their routing within
    // every step the check can take, with a flat gate as well
    m.router_score = RouterScore::sigmoid;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "sigmoid scores";
}

// sigmoid scores: the top-K of g, weights sigmoid(g) normalised over the K (docs/model.md)
TEST(RouterSigmoidTest, WeightsAreSigmoidScoresNormalisedOverTheChosen) {
    const int N = 9, C = 8, F = 12, E = 6, K = 3;
    Rng rng(13);
    MoEShape sig{C, F, E, K, 0.0};
    sig.gate.score = RouterScore::sigmoid;
    MoEShape soft{C, F, E, K, 0.0};
    MoELayer a(sig, N), b(soft, N);
    const RandomMoE r(rng, C, F, E);
    const std::vector<float>& gate = r.gate;
    const MoEWeights& w            = r.w;
    const auto inp                 = normal(size_t(N) * C, rng);
    std::vector<float> ya(size_t(N) * C), yb(size_t(N) * C);
    a.forward(ya.data(), inp.data(), w, N);
    b.forward(yb.data(), inp.data(), w, N);
    for (int t = 0; t < N; ++t) {
        double sum = 0;
        for (int k = 0; k < K; ++k) {
            // the same experts as softmax scoring: sigmoid is monotonic
            ASSERT_EQ(a.expert_idx()[t * K + k], b.expert_idx()[t * K + k]) << t;
            const int e = a.expert_idx()[t * K + k];
            double g    = 0;
            for (int c = 0; c < C; ++c)
                g += double(gate[size_t(e) * C + c]) * inp[size_t(t) * C + c];
            sum += 1 / (1 + std::exp(-g));
        }
        for (int k = 0; k < K; ++k) {
            const int e = a.expert_idx()[t * K + k];
            double g    = 0;
            for (int c = 0; c < C; ++c)
                g += double(gate[size_t(e) * C + c]) * inp[size_t(t) * C + c];
            // float32 logits (length-8 dot products) and weights: a few float ulps
            EXPECT_NEAR(a.probs()[t * K + k], 1 / (1 + std::exp(-g)) / sum, 1e-6) << t << " " << k;
        }
    }
}

TEST(RouterSigmoidTest, FullGradientMatchesCentralDifferences) {
    ModelConfig m  = testing::tiny_moe_config();
    m.router_score = RouterScore::sigmoid;
    m.top_k        = 3;  // normalising over more than the pair of top-2
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "the gate weight";
}

// The per-sequence balancing loss (docs/model.md): coef E times the mean over sequences of
// sum_e f[s, e] P[s, e], f the sequence's share of top-k choices, P its mean router probability;
// per micro-batch on one rank it is the global loss.
TEST(BalanceScopeTest, PerSequenceValueMatchesDefinition) {
    const int T = 4, S = 3, N = S * T, C = 8, F = 12, E = 5, K = 2;
    const double coef = 0.1;
    Rng rng(17);
    MoEShape seq{C, F, E, K, coef};
    seq.gate.balance_scope = BalanceScope::sequence;
    MoEShape mb{C, F, E, K, coef};
    mb.gate.balance_scope = BalanceScope::micro_batch;
    MoEShape glob{C, F, E, K, coef};
    MoELayer a(seq, N), b(mb, N), c(glob, N);
    a.set_seq_len(T);
    const RandomMoE r(rng, C, F, E);
    const std::vector<float>& gate = r.gate;
    const MoEWeights& w            = r.w;
    const auto inp                 = normal(size_t(N) * C, rng);
    std::vector<float> ya(size_t(N) * C), yb(ya.size()), yc(ya.size());
    const double aux_seq = a.forward(ya.data(), inp.data(), w, N);
    const double aux_mb  = b.forward(yb.data(), inp.data(), w, N),
                 aux_gl  = c.forward(yc.data(), inp.data(), w, N);
    EXPECT_EQ(ya, yc) << "the scope changes no routing or output";
    // one rank: its micro-batch is all the tokens (the same sum in double, another order)
    EXPECT_NEAR(aux_mb, aux_gl, 1e-12 * aux_gl);
    double ref = 0, ref_all = 0;
    std::vector<double> f_all(size_t(E), 0.0), p_all(size_t(E), 0.0);
    for (int s = 0; s < S; ++s) {
        std::vector<double> f(size_t(E), 0.0), p(size_t(E), 0.0);
        for (int t = s * T; t < (s + 1) * T; ++t) {
            std::vector<double> g(static_cast<size_t>(E), 0.0);
            double mx = -1e300, sum = 0;
            for (int e = 0; e < E; ++e) {
                for (int cc = 0; cc < C; ++cc)
                    g[size_t(e)] += double(gate[size_t(e) * C + cc]) * inp[size_t(t) * C + cc];
                mx = std::max(mx, g[size_t(e)]);
            }
            for (int e = 0; e < E; ++e) sum += std::exp(g[size_t(e)] - mx);
            for (int e = 0; e < E; ++e) p[size_t(e)] += std::exp(g[size_t(e)] - mx) / sum / T;
            for (int k = 0; k < K; ++k) f[size_t(a.expert_idx()[t * K + k])] += 1.0 / (T * K);
        }
        for (int e = 0; e < E; ++e) {
            ref += f[size_t(e)] * p[size_t(e)];
            f_all[size_t(e)] += f[size_t(e)] / S;
            p_all[size_t(e)] += p[size_t(e)] / S;
        }
    }
    ref *= coef * E / S;
    for (int e = 0; e < E; ++e) ref_all += f_all[size_t(e)] * p_all[size_t(e)];
    ref_all *= coef * E;
    // float32 logits of length-8 dot products: ~1e-6 relative in the probabilities
    EXPECT_NEAR(aux_seq, ref, 1e-6 * ref);
    EXPECT_NEAR(aux_gl, ref_all, 1e-6 * ref_all);
    EXPECT_GT(std::abs(aux_seq - aux_gl), 1e-4 * ref) << "the test tells the two apart";
}

TEST(BalanceScopeTest, PerSequenceGradientMatchesCentralDifferences) {
    ModelConfig m        = testing::tiny_moe_config();
    m.aux_loss_coef      = 0.5;  // large, so the gate's gradient is mostly the balancing loss
    m.balance_loss_scope = BalanceScope::sequence;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "the gate weight";
}

TEST(BalanceScopeTest, PerMicroBatchGradientMatchesCentralDifferences) {
    ModelConfig m        = testing::tiny_moe_config();
    m.aux_loss_coef      = 0.5;
    m.balance_loss_scope = BalanceScope::micro_batch;
    EXPECT_EQ(expect_gradient_matches(m, ".moe.gate."), 1) << "the gate weight";
}

}  // namespace
}  // namespace bagualu::moe

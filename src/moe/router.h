// The router of an MoE layer: router logits -> (probs, expert_idx) for every gate of
// docs/model.md ("Gates"): topk, switch, gshard, noisy, swipe; their aux losses; backward.
// Owns the communication of routing (capacity queues and SWIPE counts are allgathered, the
// aux-loss and load statistics all-reduced over every rank), so the routing of a P-rank run is
// that of one process holding the same global micro-batch. Randomness (jitter, noise, random
// routing) is a pure function of (seed, micro-step, layer, global token index).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/enums.h"
#include "core/buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "dist/parallel.h"
#include "moe/balance_bias.h"

namespace bagualu::moe {

using bagualu::GateKind;       // config/enums.h: model.gate
using bagualu::RouteOverride;  // config/enums.h: model.route_override

// For tests and benchmarks (model.route_override): the routing choice forced, the gate's
// probabilities over the forced experts computed as usual (so gradients flow). Token t is the
// global token index. SWIPE in training re-chooses its tokens, so it overrides this.
//   one_expert: slot k -> expert k (every token on the same K experts)
//   one_rank:   slot k -> expert (t + k) mod max(El, K), El = E / EP: the experts of EP rank 0
//   zipf:       K distinct experts drawn, without replacement, with P(e) ~ 1 / (e + 1)

struct GateConfig {
    GateKind kind                = GateKind::topk;
    double capacity_factor       = 1.0;  // switch, gshard: capacity = ceil(cf * N_total * K / E)
    double jitter                = 0.0;  // router input times U[1 - jitter, 1 + jitter] in training
    int virtual_workers          = 1;    // swipe: workers simulated by each rank of the EP group
    SwipeBalance swipe_balance   = SwipeBalance::step;  // swipe: over the step or per round
    int layer                    = 0;  // index of the MoE layer: a randomness stream
    RouteOverride route_override = RouteOverride::none;
    double z_loss_coef           = 0.0;  // router z-loss: coef * mean_t (logsumexp_e g[t, e])^2
    RouterScore score            = RouterScore::softmax;  // sigmoid: topk and swipe only
    bool balance_bias            = false;  // add the per-expert bias to the choice (balance_bias.h)
    // The tokens the balancing loss is over: the micro-step's on all ranks (global), this
    // rank's (micro_batch) or each sequence's, averaged (docs/model.md). Not the noisy gate.
    BalanceScope balance_scope = BalanceScope::global;
    // precision.router = "fp64": the logits and their gradients with every product and sum in
    // double (kernels/mixed.h linear_*_f64), rounded to float once; float32 GEMMs otherwise.
    bool fp64 = false;
    // precision.router = "half" in a mixed-precision run: the half type the logits' products
    // round their operands to (input, weight and, in backward, the logits' gradient), with
    // float32 accumulation (kernels/mixed.h linear_*_half); float32 otherwise.
    Dtype half = Dtype::float32;
    // Node-limited routing (model.route_nodes, route_groups): the choice keeps to the token's
    // route_nodes best of route_groups expert groups (gate.h limit_to_groups). 0 = unlimited.
    int route_nodes  = 0;
    int route_groups = 0;
    // model.product_keys: the gate weight holds product_keys + E / product_keys key rows and
    // the logits are sums of two keys' scores (gate.h expand_product_keys). 0 = a row per expert.
    int product_keys = 0;
};

// Set by the trainer before each forward; the default routes as at inference (no randomness,
// no capacity, no SWIPE: every gate is plain top-k there).
struct RoutingContext {
    uint64_t seed = 0;
    int64_t step  = 0;  // micro-step counter, the same on every rank
    bool training = false;
    // Where this rank's tokens sit among the micro-step's tokens over all ranks: the index of
    // its first and their total. -1 and 0: every rank holds the same N (rank x N, P x N).
    int64_t token0 = -1;
    int64_t tokens = 0;
};

// Routing statistics of the last forward, over all ranks.
struct RoutingStats {
    std::vector<int64_t> tokens_per_expert;  // [E] rows each expert computed (after capacity/SWIPE)
    std::vector<int64_t> topk_per_expert;    // [E] top-k choices of each expert (before them)
    int64_t slots       = 0;                 // N_total * K
    int64_t dropped     = 0;                 // slots dropped by capacity or random routing
    int64_t reassigned  = 0;                 // slots moved by SWIPE
    double entropy      = 0;                 // mean over tokens of H(softmax(g[t, :])), nats
    double balance_loss = 0;                 // the balancing loss forward returned (times aux_coef)
    double z_loss       = 0;                 // the z-loss it returned (times z_loss_coef)
};

// The router's working buffers that no layer needs from its forward to its backward: the
// logits of the softmax-scored gates (whose backward reads only the softmax; the sigmoid and
// noisy gates keep theirs per layer), the choice scores and ranking (forward; the noisy gate
// keeps its ranking, which its backward reads, per layer) and the logits' gradients. The MoE
// layers of a model share one set (MoEScratch, moe_layer.h), so that what grows with N x E is
// kept once, not per layer.
struct RouterScratch {
    Buffer<float> logits;                 // (N, E) the softmax gates' logits (forward only)
    Buffer<float> biased, limited;        // (N, E) choice scores: + bias, limited to groups
    Buffer<int32_t> preference;           // (N, R) best experts first (not the noisy gate)
    Buffer<float> dlogits;                // (N, E)
    Buffer<float> dnoise_logits, dnoisy;  // (N, E) noisy gate
    Buffer<float> dx_noise;               // (N, C) noisy gate
    Buffer<float> x_half,
        w_half;          // (N, C), (G, C) rounded operands (GateConfig::half, float products)
    Buffer<float> keys;  // (N, G) product keys' scores forward, their gradient backward
};

// What a router keeps from its forward to its backward that grows with N x E: per layer, or
// one set for the layers of a model when each layer's forward runs again right before its
// backward (train.recompute; moe_layer.h MoEBuffers). The rest of the router's state (the
// routing, its weights and statistics, which the trainer reads after forward) stays per layer.
struct RouterKept {
    Buffer<float> logits;   // (N, E) the sigmoid and noisy gates' clean logits
    Buffer<float> softmax;  // (N, E) the softmax of the clean logits
    Buffer<float> noise_logits, eps, noisy_logits, load_prob;  // (N, E) noisy gate
};

// A buffer several layers of one shape share (RouterScratch, MoEScratch): the first layer
// allocates its n elements, every other checks that it needs the same n.
template <typename T>
void size_shared(Buffer<T>& b, size_t n, const char* what) {
    if (b.size() == 0) {
        b = Buffer<T>(n);
        return;
    }
    BGL_CHECK(b.size() == n, "layers sharing buffers differ in shape: {} holds {}, needs {}", what,
              b.size(), n);
}

// Uniform in [0, 1) for one (token, index) of a stream; a counter-based hash (splitmix64).
double routing_uniform(uint64_t seed, int64_t step, int layer, int stream, int64_t token,
                       int64_t index);

class Router {
   public:
    // C model width, E experts, K = top_k. par: nullptr for one process. scratch, kept: shared
    // with the other layers' routers (sized by the first), or nullptr for the router's own;
    // share `kept` only between layers whose forward runs again before their backward.
    Router(int C, int E, int K, double aux_coef, const GateConfig& gate, int max_tokens,
           dist::ParallelContext* par, std::shared_ptr<RouterScratch> scratch = nullptr,
           std::shared_ptr<RouterKept> kept = nullptr);
    // Not copied or moved: logits_ and preference_ may refer to the router's own buffers.
    Router(const Router&)            = delete;
    Router& operator=(const Router&) = delete;

    void set_context(const RoutingContext& ctx) { ctx_ = ctx; }
    // Tokens per sequence of the following forwards (the per-sequence balancing loss needs it;
    // N must be a multiple of it). The model sets it before each forward.
    void set_seq_len(int T) { seq_len_ = T; }
    // inp: (N, C). gate_w, noise_w: (E, C); noise_w only for the noisy gate. Returns the aux loss
    // (already times aux_coef) plus the z-loss (already times z_loss_coef).
    double forward(const float* inp, const float* gate_w, const float* noise_w, int N);
    // dinp: (N, C), overwritten (=). dgate_w, dnoise_w: +=. dprobs: (N, K), zero for dropped
    // slots. daux: d loss / d aux.
    void backward(float* dinp, float* dgate_w, float* dnoise_w, const float* dprobs,
                  const float* inp, const float* gate_w, const float* noise_w, double daux);

    // After forward: (N, K) expert of each slot (-1: dropped) and its weight.
    const int32_t* expert_idx() const { return expert_idx_.data(); }
    const float* probs() const { return probs_.data(); }
    // (E) rows this rank sends to each global expert.
    const int32_t* tokens_per_expert() const { return tokens_per_expert_.data(); }
    const RoutingStats& stats() const { return stats_; }
    // The per-expert bias of the choice, used when GateConfig::balance_bias is set; the trainer
    // feeds it stats().topk_per_expert once per micro-batch and updates it once per step.
    BalanceBias& balance_bias() { return bias_; }
    const BalanceBias& balance_bias() const { return bias_; }

   private:
    // The gate's (and the noisy gate's noise) linear layer, in the arithmetic of gate_.fp64 /
    // gate_.half (backward rounds dout in place under half).
    // rows: the weight's (E, or the product keys' rows_).
    void gate_linear_forward(float* out, const float* x, const float* w, int N, int rows) const;
    void gate_linear_backward(float* dx, float* dw, float* dout, const float* x, const float* w,
                              int N, int rows) const;
    // gate_.half on float products: x (N, C) and w (rows, C) rounded into the shared scratch,
    // the pointers moved to the copies.
    void round_operands(const float*& x, const float*& w, int N, int rows) const;
    void swipe_rounds(int N);
    // selected_, expert_idx_ (N, K) <- the forced choice of gate_.route_override.
    void override_routes(int N, int64_t tok0);
    void capacity_rounds(int N);
    void sequence_fractions(int N);
    // The balancing loss from the statistics summed over ranks (forward's last step).
    double balance_loss(const std::vector<double>& s, std::vector<int64_t>& topk_counts);
    double scoped_balance_sum(int N, const std::vector<int64_t>& topk_counts,
                              const double* prob_sums);

    int C_, E_, K_;
    double aux_coef_;
    GateConfig gate_;
    dist::ParallelContext* par_;
    int rows_;  // of the gate weight: E, or the product keys' E1 + E2
    RoutingContext ctx_;
    int n_           = 0;
    int64_t n_total_ = 0;
    bool jittered_ = false, noisy_ = false;
    RoutingStats stats_;
    BalanceBias bias_;
    std::shared_ptr<RouterScratch> scr_;
    std::shared_ptr<RouterKept> kept_;
    Buffer<int32_t> own_preference_;  // the noisy gate's ranking, read by its backward
    // saved for backward
    Buffer<float> x_jit_, jit_;  // (N, C) jittered input and its factors
    Buffer<float>& logits_;  // (N, E) clean logits: kept (sigmoid, noisy gates) or the scratch's
    Buffer<float>& softmax_full_ = kept_->softmax;       // (N, E) their softmax
    Buffer<float>& noise_logits_ = kept_->noise_logits;  // (N, E), noisy gate
    Buffer<float>& eps_          = kept_->eps;
    Buffer<float>& noisy_logits_ = kept_->noisy_logits;
    Buffer<float>& load_prob_    = kept_->load_prob;
    Buffer<int32_t>& preference_;  // (N, R) best experts first: own_preference_ or scratch
    Buffer<float>& biased_  = scr_->biased;   // (N, E) route + bias: the scores the choice ranks
    Buffer<float>& limited_ = scr_->limited;  // (N, E) the choice scores limited to groups
    Buffer<int32_t> load_pref_;  // (N, R) noisy gate with bias: the unbiased ranking its load uses
    Buffer<int32_t> selected_, expert_idx_;  // (N, K) weighted experts / routing
    Buffer<uint8_t> reassigned_;             // (N, K)
    Buffer<float> probs_;                    // (N, K)
    Buffer<int32_t> tokens_per_expert_;      // (E)
    std::vector<double> f_;  // [E] (per-sequence loss: [N / T, E], a row per sequence)
    std::vector<double> dimportance_, dload_;  // [E]
    int seq_len_ = 0;
    // step scratch, sized once so a step allocates nothing
    Buffer<double> entropy_;            // (N) router entropy per token
    Buffer<double> lse_;                // (N) logsumexp of the clean logits, z-loss only
    std::vector<int64_t> topk_counts_;  // [E] top-k choices per expert, before capacity/SWIPE
    std::vector<double> stat_sums_;     // [5E + 5] statistics summed over ranks
    // backward scratch
    Buffer<float>& dlogits_       = scr_->dlogits;
    Buffer<float>& dnoise_logits_ = scr_->dnoise_logits;
    Buffer<float>& dnoisy_        = scr_->dnoisy;
    Buffer<float>& dx_noise_      = scr_->dx_noise;
    Buffer<float> dprobs_aux_;
};

}  // namespace bagualu::moe

// Router: gate selection, deterministic randomness, capacity and SWIPE rounds with their
// collectives, routing statistics and the backward of every gate (router.h, docs/model.md).
#include "moe/router.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "moe/gate.h"
#include "moe/noisy_gate.h"
#include "moe/swipe.h"

namespace bagualu::moe {

namespace {
// randomness streams
constexpr int kJitterStream = 1, kNoiseStream = 2, kSecondExpertStream = 3, kZipfStream = 4;
}  // namespace

double routing_uniform(uint64_t seed, int64_t step, int layer, int stream, int64_t token,
                       int64_t index) {
    uint64_t x = seed;
    uint64_t h = splitmix64(x);
    for (uint64_t key : {static_cast<uint64_t>(step),
                         static_cast<uint64_t>(layer) << 8 | static_cast<uint64_t>(stream),
                         static_cast<uint64_t>(token), static_cast<uint64_t>(index)}) {
        x = h ^ key;
        h = splitmix64(x);
    }
    return static_cast<double>(h >> 11) * 0x1.0p-53;
}

Router::Router(int C, int E, int K, double aux_coef, const GateConfig& gate, int max_tokens,
               dist::ParallelContext* par, std::shared_ptr<RouterScratch> scratch,
               std::shared_ptr<RouterKept> kept)
    : C_(C),
      E_(E),
      K_(K),
      aux_coef_(aux_coef),
      gate_(gate),
      par_(par),
      rows_(gate_weight_rows(E, gate.product_keys)),
      bias_(E),
      scr_(scratch ? std::move(scratch) : std::make_shared<RouterScratch>()),
      kept_(kept ? std::move(kept) : std::make_shared<RouterKept>()),
      logits_(gate.kind == GateKind::noisy || gate.score == RouterScore::sigmoid ? kept_->logits
                                                                                 : scr_->logits),
      preference_(gate.kind == GateKind::noisy ? own_preference_ : scr_->preference) {
    const size_t N = static_cast<size_t>(max_tokens), Es = static_cast<size_t>(E),
                 Ks = static_cast<size_t>(K), Cs = static_cast<size_t>(C);
    noisy_ = gate.kind == GateKind::noisy;
    if (gate.jitter > 0) {
        x_jit_ = Buffer<float>(N * Cs);
        jit_   = Buffer<float>(N * Cs);
    }
    RouterKept& kp = *kept_;  // sized as the shared scratch below
    size_shared(kp.softmax, N * Es, "softmax");
    // the ranking's columns: every expert for SWIPE (it may move a token anywhere), K + 1 for the
    // noisy gate's load, K otherwise (forward's R at most)
    const size_t R = gate.kind == GateKind::swipe ? Es : noisy_ ? std::min(Ks + 1, Es) : Ks;
    if (noisy_) {
        size_shared(kp.noise_logits, N * Es, "noise_logits");
        size_shared(kp.eps, N * Es, "eps");
        size_shared(kp.noisy_logits, N * Es, "noisy_logits");
        size_shared(kp.load_prob, N * Es, "load_prob");
        own_preference_ = Buffer<int32_t>(N * R);
        if (gate.balance_bias) load_pref_ = Buffer<int32_t>(N * R);
    }
    // the shared scratch: sized by the first router, every other one of the same shape
    RouterScratch& sc = *scr_;
    size_shared(sc.dlogits, N * Es, "dlogits");
    if (&logits_ == &kp.logits) {
        size_shared(kp.logits, N * Es, "kept logits");
    } else {
        size_shared(sc.logits, N * Es, "logits");
    }
    if (!noisy_) size_shared(sc.preference, N * R, "preference");
    if (gate.balance_bias) size_shared(sc.biased, N * Es, "biased");
    if (gate.route_nodes > 0) size_shared(sc.limited, N * Es, "limited");
    if (gate.half != Dtype::float32) {
        size_shared(sc.x_half, N * Cs, "x_half");
        // the gate's rows (the noisy gate, whose noise weight has E, has no product keys)
        size_shared(sc.w_half, Cs * static_cast<size_t>(rows_), "w_half");
    }
    if (gate.product_keys > 0) size_shared(sc.keys, N * static_cast<size_t>(rows_), "keys");
    if (noisy_) {
        size_shared(sc.dnoise_logits, N * Es, "dnoise_logits");
        size_shared(sc.dnoisy, N * Es, "dnoisy");
        size_shared(sc.dx_noise, N * Cs, "dx_noise");
    }
    selected_          = Buffer<int32_t>(N * Ks);
    expert_idx_        = Buffer<int32_t>(N * Ks);
    reassigned_        = Buffer<uint8_t>(N * Ks);
    probs_             = Buffer<float>(N * Ks);
    tokens_per_expert_ = Buffer<int32_t>(Es);
    dprobs_aux_        = Buffer<float>(N * Ks);
    f_.resize(Es);
    entropy_ = Buffer<double>(N);
    topk_counts_.resize(Es);
    stat_sums_.resize(5 * Es + 5);
    if (gate.z_loss_coef > 0) lse_ = Buffer<double>(N);
    dimportance_.resize(Es);
    dload_.resize(Es);
    stats_.tokens_per_expert.resize(Es);
    stats_.topk_per_expert.resize(Es);
    if (gate.kind == GateKind::swipe) {
        const int workers = (par ? par->ep_size() : 1) * gate.virtual_workers;
        BGL_CHECK(E % workers == 0, "swipe: {} experts over {} workers", E, workers);
    }
}

// Capacity gates: queues over the global micro-batch (rank-major token order), round by round.
void Router::capacity_rounds(int N) {
    const int P = par_ ? par_->size() : 1, rank = par_ ? par_->rank() : 0;
    const size_t KE = static_cast<size_t>(K_) * static_cast<size_t>(E_);
    std::vector<int64_t> mine(KE, 0), all(KE * static_cast<size_t>(P));
    for (int64_t t = 0; t < N; ++t) {
        for (int k = 0; k < K_; ++k) {
            const int32_t e = expert_idx_[t * K_ + k];
            if (e >= 0) ++mine[static_cast<size_t>(k * E_ + e)];
        }
    }
    if (P > 1) {
        par_->world().allgather(mine.data(), sizeof(int64_t) * KE, all.data());
    } else {
        all = mine;
    }
    std::vector<int64_t> ahead(KE, 0);  // [K][E]
    for (int k = 0; k < K_; ++k) {
        for (int e = 0; e < E_; ++e) {
            int64_t a = 0;
            for (int r = 0; r < P; ++r) {
                for (int j = 0; j < k; ++j)
                    a += all[static_cast<size_t>(r) * KE + static_cast<size_t>(j * E_ + e)];
                if (r < rank)
                    a += all[static_cast<size_t>(r) * KE + static_cast<size_t>(k * E_ + e)];
            }
            ahead[static_cast<size_t>(k * E_ + e)] = a;
        }
    }
    const int64_t capacity = static_cast<int64_t>(
        std::ceil(gate_.capacity_factor * static_cast<double>(n_total_ * K_) / E_));
    stats_.dropped += capacity_drop(expert_idx_.data(), ahead.data(), capacity, N, E_, K_);
}

// SWIPE: K rounds; per round, the counts of the EP group's workers are allgathered and every
// rank applies the same plan (swipe.h) to its own workers' tokens.
void Router::swipe_rounds(int N) {
    const int ep = par_ ? par_->ep_size() : 1, ep_rank = par_ ? par_->ep_rank() : 0;
    const int vw = gate_.virtual_workers, W = ep * vw, E1 = E_ + 1;
    std::vector<int64_t> mine(static_cast<size_t>(vw * E1)), all(static_cast<size_t>(W * E1));
    std::vector<int64_t> counts(static_cast<size_t>(W * E_)), shares(static_cast<size_t>(W));
    auto begin = [&](int v) { return static_cast<int64_t>(v) * N / vw; };
    // the step rule: each expert's room is its K rounds' capacity less what it took so far
    const bool by_step = gate_.swipe_balance == SwipeBalance::step;
    std::vector<int64_t> received(static_cast<size_t>(E_), 0), room;
    for (int k = 0; k < K_; ++k) {
        swipe_request(expert_idx_.data(), preference_.data(), N, E_, K_, k);
        for (int v = 0; v < vw; ++v) {
            const int64_t b = begin(v), n = begin(v + 1) - b;
            swipe_counts(mine.data() + v * E1, expert_idx_.data() + b * K_, static_cast<int>(n), E_,
                         K_, k);
            mine[static_cast<size_t>(v * E1 + E_)] = n;
        }
        if (ep > 1) {
            par_->ep().allgather(mine.data(), sizeof(int64_t) * mine.size(), all.data());
        } else {
            all = mine;
        }
        for (int w = 0; w < W; ++w) {
            std::copy_n(all.begin() + w * E1, E_, counts.begin() + w * E_);
            shares[static_cast<size_t>(w)] = all[static_cast<size_t>(w * E1 + E_)];
        }
        if (by_step) {
            room = swipe_capacity(shares, W, E_);
            for (int e = 0; e < E_; ++e) room[e] = K_ * room[e] - received[e];
        }
        const SwipePlan plan = swipe_plan(counts, shares, W, E_, room);
        if (by_step) swipe_add_received(received.data(), plan, W, E_);
        for (int v = 0; v < vw; ++v) {
            const int64_t b = begin(v), n = begin(v + 1) - b;
            const size_t w = static_cast<size_t>(ep_rank * vw + v) * static_cast<size_t>(E_);
            stats_.reassigned +=
                swipe_assign(expert_idx_.data() + b * K_, reassigned_.data() + b * K_,
                             preference_.data() + b * E_, plan.kept.data() + w,
                             plan.quota.data() + w, static_cast<int>(n), E_, K_, k);
        }
    }
}

void Router::override_routes(int N, int64_t tok0) {
    const int El = E_ / (par_ ? par_->ep_size() : 1), span = std::max(El, K_);
    std::vector<double> w(static_cast<size_t>(E_));
    for (int64_t t = 0; t < N; ++t) {
        int32_t* sel = selected_.data() + t * K_;
        if (gate_.route_override == RouteOverride::one_expert) {
            for (int k = 0; k < K_; ++k) sel[k] = k;
        } else if (gate_.route_override == RouteOverride::one_rank) {
            for (int k = 0; k < K_; ++k) sel[k] = static_cast<int32_t>((tok0 + t + k) % span);
        } else {
            for (int e = 0; e < E_; ++e) w[static_cast<size_t>(e)] = 1.0 / (e + 1);
            for (int k = 0; k < K_; ++k) {
                double total = 0;
                for (double x : w) total += x;
                double u = total * routing_uniform(ctx_.seed, ctx_.step, gate_.layer, kZipfStream,
                                                   tok0 + t, k);
                int e    = 0;
                auto at  = [&](int i) -> double& { return w[static_cast<size_t>(i)]; };
                while (e < E_ - 1 && (at(e) == 0 || u >= at(e))) {
                    u -= at(e);
                    ++e;
                }
                while (at(e) == 0) --e;  // rounding at the end of the range
                sel[k] = e;
                at(e)  = 0;
            }
        }
        for (int k = 0; k < K_; ++k) expert_idx_[t * K_ + k] = sel[k];
    }
}

// Per-sequence loss: f_ (N / T, E) <- each sequence's top-k choices, f[s, e] = c[s, e] / (T K).
void Router::sequence_fractions(int N) {
    const int T = seq_len_;
    BGL_CHECK(T > 0 && N % T == 0, "per-sequence balancing loss over {} tokens of sequences of {}",
              N, T);
    const int S = N / T;
    f_.assign(static_cast<size_t>(S) * static_cast<size_t>(E_), 0.0);
    const double unit = 1.0 / (static_cast<double>(T) * K_);
    for (int64_t t = 0; t < N; ++t) {
        double* f = f_.data() + (t / T) * E_;
        for (int k = 0; k < K_; ++k) f[selected_[t * K_ + k]] += unit;
    }
}

// This rank's part of a scoped balancing loss (aux_loss's form, coef and E included):
// micro_batch: its loss over its own N tokens (f_ <- its f); sequence: the sum of its sequences'
// losses, each over the T tokens of the sequence with f_'s row for it. global: 0 (the loss is
// formed from the sums over all ranks).
double Router::scoped_balance_sum(int N, const std::vector<int64_t>& topk_counts,
                                  const double* prob_sums) {
    if (gate_.balance_scope == BalanceScope::micro_batch) {
        return aux_loss(f_.data(), topk_counts.data(), prob_sums, N, E_, K_, aux_coef_);
    }
    double sum = 0;
    if (gate_.balance_scope == BalanceScope::sequence) {
        const int T = seq_len_;
        std::vector<double> p(static_cast<size_t>(E_));
        for (int s0 = 0; s0 < N; s0 += T) {
            gate_prob_sums(p.data(), softmax_full_.data() + static_cast<int64_t>(s0) * E_, T, E_);
            const double* f = f_.data() + (s0 / T) * E_;
            double fp       = 0;
            for (int e = 0; e < E_; ++e) fp += f[e] * p[static_cast<size_t>(e)] / T;
            sum += aux_coef_ * E_ * fp;
        }
    }
    return sum;
}

void Router::round_operands(const float*& x, const float*& w, int N, int rows) const {
    kernels::round_copy(scr_->x_half.data(), x, static_cast<size_t>(N) * C_, gate_.half);
    kernels::round_copy(scr_->w_half.data(), w, static_cast<size_t>(C_) * rows, gate_.half);
    x = scr_->x_half.data();
    w = scr_->w_half.data();
}

void Router::gate_linear_forward(float* out, const float* x, const float* w, int N,
                                 int rows) const {
    if (gate_.fp64) {
        kernels::linear_forward_f64(out, x, w, nullptr, N, C_, rows);
    } else if (gate_.half != Dtype::float32) {
        // the half product with float32 accumulation on the operands rounded: by its own 16-bit
        // conversion, or into the shared scratch (the weight stays float32: the optimizer's)
        if (!kernels::half_products_convert(gate_.half)) round_operands(x, w, N, rows);
        kernels::linear_forward_half(gate_.half, out, x, w, nullptr, N, C_, rows);
    } else {
        kernels::linear_forward(out, x, w, nullptr, N, C_, rows);
    }
}

void Router::gate_linear_backward(float* dx, float* dw, float* dout, const float* x, const float* w,
                                  int N, int rows) const {
    if (gate_.fp64) {
        kernels::linear_backward_f64(dx, dw, nullptr, dout, x, w, N, C_, rows);
    } else if (gate_.half != Dtype::float32) {
        // as forward; without the 16-bit conversion the logits' gradient is rounded in place
        // (nothing reads it after this), the input and weight again into the scratch (another
        // layer's forward may have used it since)
        if (!kernels::half_products_convert(gate_.half)) {
            kernels::round_inplace(dout, static_cast<size_t>(N) * rows, gate_.half);
            round_operands(x, w, N, rows);
        }
        kernels::linear_backward_half(gate_.half, dx, dw, nullptr, dout, x, w, N, C_, rows);
    } else {
        kernels::linear_backward(dx, dw, nullptr, dout, x, w, N, C_, rows);
    }
}

double Router::forward(const float* inp, const float* gate_w, const float* noise_w, int N) {
    n_          = N;
    const int P = par_ ? par_->size() : 1, rank = par_ ? par_->rank() : 0;
    // global index of this rank's token 0, and the tokens of all ranks
    const int64_t tok0 = ctx_.token0 >= 0 ? ctx_.token0 : static_cast<int64_t>(rank) * N;
    const bool train   = ctx_.training;
    n_total_           = ctx_.tokens > 0 ? ctx_.tokens : static_cast<int64_t>(N) * P;
    stats_.dropped = stats_.reassigned = 0;

    // router input, jittered in training
    const float* x = inp;
    jittered_      = train && gate_.jitter > 0;
    if (jittered_) {
        for (int64_t t = 0; t < N; ++t) {
            for (int c = 0; c < C_; ++c) {
                const double u =
                    routing_uniform(ctx_.seed, ctx_.step, gate_.layer, kJitterStream, tok0 + t, c);
                jit_[t * C_ + c] = static_cast<float>(1.0 - gate_.jitter + 2.0 * gate_.jitter * u);
                x_jit_[t * C_ + c] = inp[t * C_ + c] * jit_[t * C_ + c];
            }
        }
        x = x_jit_.data();
    }
    if (gate_.product_keys > 0) {  // the keys' scores, then every expert's sum of two
        gate_linear_forward(scr_->keys.data(), x, gate_w, N, rows_);
        expand_product_keys(logits_.data(), scr_->keys.data(), N, gate_.product_keys,
                            E_ / gate_.product_keys);
    } else {
        gate_linear_forward(logits_.data(), x, gate_w, N, E_);
    }
    const double entropy =
        softmax_rows(softmax_full_.data(), entropy_.data(), logits_.data(), N, E_);
    const float* route = logits_.data();  // the logits top-k and the weights use
    if (noisy_) {
        gate_linear_forward(noise_logits_.data(), x, noise_w, N, E_);
        for (int64_t t = 0; t < N; ++t) {
            for (int e = 0; e < E_; ++e) {
                double z = 0;
                if (train) {  // Box-Muller from two uniforms of this (token, expert)
                    const double u1 =
                        std::max(1e-300, routing_uniform(ctx_.seed, ctx_.step, gate_.layer,
                                                         kNoiseStream, tok0 + t, 2 * e));
                    const double u2 = routing_uniform(ctx_.seed, ctx_.step, gate_.layer,
                                                      kNoiseStream, tok0 + t, 2 * e + 1);
                    z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
                }
                eps_[t * E_ + e] = static_cast<float>(z);
            }
        }
        noisy_logits_forward(noisy_logits_.data(), logits_.data(), noise_logits_.data(),
                             eps_.data(), N, E_);
        route = noisy_logits_.data();
    }

    // selection: the top-R of each token (R = E for SWIPE, which may move tokens anywhere)
    const bool swipe = train && gate_.kind == GateKind::swipe;
    const int R      = swipe ? E_ : (noisy_ ? std::min(K_ + 1, E_) : K_);
    // The choice ranks route + bias when the balancing bias is on; the weights below read route.
    // With node-limited routing, the choice ranks those scores kept to the token's best groups.
    const int32_t* load_pref = preference_.data();  // the noisy gate's load: unbiased ranking
    if (gate_.balance_bias && noisy_) {
        rank_experts(load_pref_.data(), route, N, E_, R);
        load_pref = load_pref_.data();
    }
    const float* choice =
        choice_scores(route, gate_.balance_bias ? bias_.values() : nullptr, biased_.data(),
                      limited_.data(), N, E_, gate_.route_groups, gate_.route_nodes, K_);
    rank_experts(preference_.data(), choice, N, E_, R);
    std::vector<int64_t>& topk_counts = topk_counts_;
    std::fill(topk_counts.begin(), topk_counts.end(), 0);
    for (int64_t t = 0; t < N; ++t) {
        for (int k = 0; k < K_; ++k) {
            const int32_t e         = preference_[t * R + k];
            selected_[t * K_ + k]   = e;
            expert_idx_[t * K_ + k] = e;
            reassigned_[t * K_ + k] = 0;
            ++topk_counts[static_cast<size_t>(e)];
        }
    }
    if (gate_.route_override != RouteOverride::none) {
        override_routes(N, tok0);
        std::fill(topk_counts.begin(), topk_counts.end(), 0);
        for (int64_t i = 0; i < static_cast<int64_t>(N) * K_; ++i)
            ++topk_counts[static_cast<size_t>(selected_[i])];
    }
    if (gate_.balance_scope == BalanceScope::sequence && aux_coef_ > 0 && !noisy_) {
        sequence_fractions(N);  // of the top-k choice, before SWIPE or capacity
    }
    if (swipe) {
        swipe_rounds(N);
        std::copy_n(expert_idx_.data(), static_cast<size_t>(N) * K_, selected_.data());
    }
    selected_weights(probs_.data(), selected_.data(), route, softmax_full_.data(), N, E_, K_,
                     gate_.kind, gate_.score);
    if (train && gate_.kind == GateKind::gshard) {
        // the second expert is kept with probability min(1, 2 p2), p2 its normalised weight
        for (int64_t t = 0; t < N; ++t) {
            const double u = routing_uniform(ctx_.seed, ctx_.step, gate_.layer, kSecondExpertStream,
                                             tok0 + t, 0);
            if (u >= 2.0 * probs_[t * K_ + 1]) {
                expert_idx_[t * K_ + 1] = -1;
                ++stats_.dropped;
            }
        }
    }
    if (train && (gate_.kind == GateKind::switch_top1 || gate_.kind == GateKind::gshard)) {
        capacity_rounds(N);
    }
    std::fill(tokens_per_expert_.data(), tokens_per_expert_.data() + E_, 0);
    for (int64_t i = 0; i < static_cast<int64_t>(N) * K_; ++i) {
        if (expert_idx_[i] >= 0) ++tokens_per_expert_[expert_idx_[i]];
    }

    // statistics over all ranks: [top-k counts | prob sums | load | importance | Load | 3 scalars]
    const size_t Es        = static_cast<size_t>(E_);
    std::vector<double>& s = stat_sums_;
    std::fill(s.begin(), s.end(), 0.0);
    for (int e = 0; e < E_; ++e) {
        s[static_cast<size_t>(e)] = static_cast<double>(topk_counts[static_cast<size_t>(e)]);
        s[2 * Es + static_cast<size_t>(e)] = tokens_per_expert_[e];
    }
    gate_prob_sums(s.data() + Es, softmax_full_.data(), N, E_);
    if (aux_coef_ > 0 && !noisy_) s[5 * Es + 4] = scoped_balance_sum(N, topk_counts, s.data() + Es);
    if (noisy_) {
        for (int64_t t = 0; t < N; ++t) {
            for (int k = 0; k < K_; ++k)
                s[3 * Es + static_cast<size_t>(selected_[t * K_ + k])] += probs_[t * K_ + k];
        }
        load_prob_forward(load_prob_.data(), logits_.data(), noise_logits_.data(),
                          noisy_logits_.data(), load_pref, N, E_, K_);
        for (int64_t t = 0; t < N; ++t) {
            for (int e = 0; e < E_; ++e)
                s[4 * Es + static_cast<size_t>(e)] += load_prob_[t * E_ + e];
        }
    }
    s[5 * Es]     = static_cast<double>(stats_.dropped);
    s[5 * Es + 1] = static_cast<double>(stats_.reassigned);
    s[5 * Es + 2] = entropy;
    if (gate_.z_loss_coef > 0) {
        // sum over tokens of logsumexp_e(g[t, e])^2 (clean logits, in double)
        for (int64_t t = 0; t < N; ++t) {
            const float* g = logits_.data() + t * E_;
            double m = g[0], sum = 0;
            for (int e = 1; e < E_; ++e) m = std::max(m, double(g[e]));
            for (int e = 0; e < E_; ++e) sum += std::exp(double(g[e]) - m);
            lse_[t] = m + std::log(sum);
            s[5 * Es + 3] += lse_[t] * lse_[t];
        }
    }
    // the scoped balancing loss's sum (the last slot) travels only when there is one
    const size_t n_stats = 5 * Es + (gate_.balance_scope == BalanceScope::global ? 4 : 5);
    if (P > 1) par_->world().allreduce_sum(std::span<double>(s.data(), n_stats));
    for (size_t e = 0; e < Es; ++e) {
        stats_.tokens_per_expert[e] = std::llround(s[2 * Es + e]);
        stats_.topk_per_expert[e]   = std::llround(s[e]);
    }
    stats_.slots      = n_total_ * K_;
    stats_.dropped    = std::llround(s[5 * Es]);
    stats_.reassigned = std::llround(s[5 * Es + 1]);
    stats_.entropy    = s[5 * Es + 2] / static_cast<double>(n_total_);

    const double z      = gate_.z_loss_coef > 0
                              ? gate_.z_loss_coef * s[5 * Es + 3] / static_cast<double>(n_total_)
                              : 0.0;
    stats_.z_loss       = z;
    stats_.balance_loss = balance_loss(s, topk_counts);
    return stats_.balance_loss + z;
}

// The balancing loss of the forward from the statistics summed over ranks (times aux_coef).
double Router::balance_loss(const std::vector<double>& s, std::vector<int64_t>& topk_counts) {
    const size_t Es = static_cast<size_t>(E_);
    if (aux_coef_ <= 0) return 0.0;
    if (noisy_) {
        const double imp  = cv_squared(dimportance_.data(), s.data() + 3 * Es, E_);
        const double load = cv_squared(dload_.data(), s.data() + 4 * Es, E_);
        return aux_coef_ * (imp + load);
    }
    if (gate_.balance_scope == BalanceScope::micro_batch) {  // the mean of the ranks' losses
        return s[5 * Es + 4] / (par_ ? par_->size() : 1);
    }
    if (gate_.balance_scope == BalanceScope::sequence) {  // the mean over all sequences
        return s[5 * Es + 4] / static_cast<double>(n_total_ / seq_len_);
    }
    for (size_t e = 0; e < Es; ++e) topk_counts[e] = std::llround(s[e]);
    return aux_loss(f_.data(), topk_counts.data(), s.data() + Es, n_total_, E_, K_, aux_coef_);
}

void Router::backward(float* dinp, float* dgate_w, float* dnoise_w, const float* dprobs,
                      const float* inp, const float* gate_w, const float* noise_w, double daux) {
    const int N = n_;
    // aux is one number over all ranks' tokens; each rank differentiates it w.r.t. its own
    // tokens only. Dense gradients are then averaged over the P ranks, so the partial
    // gradients are scaled by P here to make that average their sum.
    const double daux_local = aux_coef_ > 0 ? daux * (par_ ? par_->size() : 1) : 0.0;
    const float* x          = jittered_ ? x_jit_.data() : inp;
    if (noisy_) {
        // importance: d/dprobs[t,k] += coef * dCV^2/dImportance[selected[t,k]]
        for (int64_t i = 0; i < static_cast<int64_t>(N) * K_; ++i) {
            dprobs_aux_[i] =
                static_cast<float>(dprobs[i] + daux_local * aux_coef_ *
                                                   dimportance_[static_cast<size_t>(selected_[i])]);
        }
        std::fill(dnoisy_.data(), dnoisy_.data() + static_cast<size_t>(N) * E_, 0.0f);
        selected_softmax_backward(dnoisy_.data(), dprobs_aux_.data(), probs_.data(),
                                  selected_.data(), N, E_, K_);
        std::fill(dlogits_.data(), dlogits_.data() + static_cast<size_t>(N) * E_, 0.0f);
        std::fill(dnoise_logits_.data(), dnoise_logits_.data() + static_cast<size_t>(N) * E_, 0.0f);
        noisy_logits_backward(dlogits_.data(), dnoise_logits_.data(), dnoisy_.data(),
                              noise_logits_.data(), eps_.data(), N, E_);
        std::vector<double> dload(dload_);
        for (double& d : dload) d *= daux_local * aux_coef_;
        load_prob_backward(dlogits_.data(), dnoise_logits_.data(), dload.data(), logits_.data(),
                           noise_logits_.data(), eps_.data(), noisy_logits_.data(),
                           gate_.balance_bias ? load_pref_.data() : preference_.data(), N, E_, K_);
    } else {
        if (gate_.balance_scope == BalanceScope::micro_batch) {
            // this rank's own loss, whose mean over ranks is the aux: the ranks' average of
            // dense gradients takes that mean, so no factor P
            aux_loss_backward(dlogits_.data(), softmax_full_.data(), f_.data(), N, N, E_, aux_coef_,
                              aux_coef_ > 0 ? daux : 0.0);
        } else {
            aux_loss_backward(dlogits_.data(), softmax_full_.data(), f_.data(), n_total_, N, E_,
                              aux_coef_, daux_local,
                              gate_.balance_scope == BalanceScope::sequence ? seq_len_ : 0);
        }
        if (gate_.kind == GateKind::switch_top1) {
            full_prob_backward(dlogits_.data(), dprobs, selected_.data(), softmax_full_.data(), N,
                               E_);
        } else if (gate_.score == RouterScore::sigmoid) {
            selected_sigmoid_backward(dlogits_.data(), dprobs, probs_.data(), selected_.data(),
                                      logits_.data(), N, E_, K_);
        } else {
            selected_softmax_backward(dlogits_.data(), dprobs, probs_.data(), selected_.data(), N,
                                      E_, K_);
        }
    }
    if (gate_.z_loss_coef > 0) {
        // d z / d g[t, e] = coef * 2 lse_t softmax(g[t, :])_e / n_total, times daux (and P, as
        // the aux loss: one number over all ranks' tokens)
        const double scale = 2.0 * gate_.z_loss_coef * daux * (par_ ? par_->size() : 1) /
                             static_cast<double>(n_total_);
        for (int64_t t = 0; t < N; ++t) {
            const double a = scale * lse_[t];
            for (int e = 0; e < E_; ++e) {
                dlogits_[t * E_ + e] += static_cast<float>(a * softmax_full_[t * E_ + e]);
            }
        }
    }
    if (gate_.product_keys > 0) {
        reduce_product_keys(scr_->keys.data(), dlogits_.data(), N, gate_.product_keys,
                            E_ / gate_.product_keys);
        gate_linear_backward(dinp, dgate_w, scr_->keys.data(), x, gate_w, N, rows_);
    } else {
        gate_linear_backward(dinp, dgate_w, dlogits_.data(), x, gate_w, N, E_);
    }
    if (noisy_) {
        gate_linear_backward(dx_noise_.data(), dnoise_w, dnoise_logits_.data(), x, noise_w, N, E_);
        for (int64_t i = 0; i < static_cast<int64_t>(N) * C_; ++i) dinp[i] += dx_noise_[i];
    }
    if (jittered_) {
        for (int64_t i = 0; i < static_cast<int64_t>(N) * C_; ++i) dinp[i] *= jit_[i];
    }
}

}  // namespace bagualu::moe

// The counts of footprint.h. Every formula names the code it mirrors.
#include "plan/footprint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "core/buffer.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "data/token_shards.h"
#include "dist/comm/alltoallv.h"
#include "dist/comm/collectives.h"
#include "dist/parallel.h"
#include "dist/paro/grad_sync.h"
#include "dist/paro/shard_map.h"
#include "dist/paro/spaces.h"
#include "kernels/gemm/driver.h"
#include "kernels/mixed.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "moe/moe_layer.h"
#include "moe/router.h"

namespace bagualu::plan {
namespace {

// Bytes of a Buffer<T>(n): rounded up to kAlign.
double buf(double n, double elem) { return std::ceil(n * elem / kAlign) * kAlign; }

int n_moe_layers(const ModelConfig& m) {
    int n = 0;
    for (int l = 0; l < m.n_layer; ++l) n += m.is_moe_block(l) ? 1 : 0;
    return n;
}

// Bytes of one element of a payload of dtype d.
double elem_bytes(Dtype d) { return d == Dtype::float32 ? 4 : 2; }

// ParO's spaces (dist/paro/partitioned_adamw.cpp PartitionedAdamW::PartitionedAdamW): tensors split
// by (half-stored, expert) into [dense, expert] of float32 tensors and, when any tensor is
// half-stored, [dense, expert] of half ones; floats per space, tensor padding included.
struct ParoSpaces {
    double floats[4] = {0, 0, 0, 0};
    bool any_half    = false;
};

ParoSpaces paro_spaces(const ModelConfig& m, int ep, const model::PrecisionPolicy& prec) {
    ParoSpaces sp;
    model::for_each_param_kind(m, ep, [&](const model::ParamSpec& s, uint64_t count) {
        const bool half = prec.master_mode(s) != model::MasterMode::none;
        sp.any_half     = sp.any_half || half;
        sp.floats[(half ? 2 : 0) + (s.expert ? 1 : 0)] +=
            static_cast<double>(count * ((s.numel + 15) / 16 * 16));
    });
    return sp;
}

// Rows this rank's experts take per round (moe::moe_rows_budget), the budget MoELayer sizes its
// buffers with: the what-if capacity factor's when one is given, else model.moe_rows_budget's.
double round_rows(const ModelConfig& m, int64_t max_tokens, int ep, double capacity_factor) {
    const double budget = capacity_factor > 0 ? capacity_factor : m.moe_rows_budget;
    return static_cast<double>(moe::moe_rows_budget(max_tokens, m.top_k, ep, budget));
}

}  // namespace

double half_operand_bytes(const TrainConfig& cfg, const Layout& L) {
    const model::PrecisionPolicy& prec = L.policy;
    if (prec.dtype != Dtype::bfloat16) return 0;
    const ModelConfig& m = cfg.model;
    const double C = m.d_model, V = m.vocab_size,
                 N       = static_cast<double>(L.micro_batch) * m.seq_len;
    const double R_round = round_rows(m, static_cast<int64_t>(N), L.ep, L.capacity_factor);
    const bool head16    = model::head_gradient_in_16_bits(prec, cfg.train.fused_head ? 1 : 0);
    double inp = 0, w = 0, dout = 0;
    auto half_linear = [&](model::LayerClass c, double in, double out, double rows) {
        if (prec.gemm_dtype(c) != Dtype::bfloat16) return;
        inp  = std::max(inp, rows * in);
        w    = std::max(w, in * out);
        dout = std::max(dout, rows * out);
    };
    half_linear(model::LayerClass::attention, C, 3 * C, N);
    half_linear(model::LayerClass::attention, C, C, N);
    if (n_moe_layers(m) < m.n_layer) {
        half_linear(model::LayerClass::ffn, C, m.d_ff, N);
        half_linear(model::LayerClass::ffn, m.d_ff, C, N);
    }
    // kernels::grouped_gemm_half: the experts' rows (a round's budget) and local weights
    if (n_moe_layers(m) > 0 && prec.gemm_dtype(model::LayerClass::ffn) == Dtype::bfloat16) {
        const double FE = m.expert_width(), FS = m.shared_width();
        inp  = std::max(inp, R_round * std::max(C, FE));
        w    = std::max(w, static_cast<double>(m.n_experts / L.ep) * FE * C);
        dout = std::max(dout, R_round * std::max(C, FE));  // dy, and the GELU's gradient
        if (m.n_shared_experts > 0) {
            inp  = std::max(inp, N * std::max(C, FS));
            w    = std::max(w, static_cast<double>(m.n_shared_experts) * FS * C);
            dout = std::max(dout, N * std::max(C, FS));
        }
    }
    // the router's products under precision.router = "half" (moe/router.cpp)
    if (n_moe_layers(m) > 0 && prec.router_dtype() == Dtype::bfloat16) {
        const double G = m.gate_rows();  // E, or the product keys' rows
        inp            = std::max(inp, N * C);
        w              = std::max(w, C * G);
        dout           = std::max(dout, N * G);
    }
    // the fused head's GEMMs see one block of rows at a time (model/gpt.h); the head's
    // output gradient takes no 16-bit copy: its 16 bits go over the logits
    // (kernels::crossentropy_linear_backward_half) or are the arena's (the gradient formed
    // in forward, model::head_gradient_in_16_bits, whose ln_f output is kept in 16 bits)
    if (prec.gemm_dtype(model::LayerClass::head) == Dtype::bfloat16) {
        const double rows =
            cfg.train.fused_head ? std::min(N, static_cast<double>(model::fused_head_rows(m))) : N;
        if (!head16) inp = std::max(inp, rows * C);
        w = std::max(w, C * V);
    }
    return 2 * (inp + w + dout);
}

double gemm_packing_bytes(const TrainConfig& cfg, const Layout& L) {
    if (L.caches.l2 == 0) return 0;
    const ModelConfig& m = cfg.model;
    const int N = static_cast<int>(std::min<int64_t>(L.micro_batch * m.seq_len, int64_t{1} << 30));
    const int C = m.d_model;
    kernels::gemm::PackingBound bound;
    // A linear layer of `rows` tokens, in -> out features, its products in d: its forward (rows x
    // out over in), its input gradient (rows x in over out) and its weight gradient (out x in
    // over rows), on the bf16 kernels where its class computes in bf16 (model/precision.h).
    using kernels::gemm::PackDriver;
    const auto linear = [&](int rows, int in, int out, Dtype d, bool grouped) {
        const bool bf16        = d == Dtype::bfloat16;
        const PackDriver fwd   = grouped ? PackDriver::grouped : PackDriver::packed;
        const PackDriver wgrad = grouped ? PackDriver::grouped_tn : PackDriver::packed;
        for (const auto& [M, Nc, K, driver] :
             {std::tuple{rows, out, in, fwd}, std::tuple{rows, in, out, fwd},
              std::tuple{out, in, rows, wgrad}}) {
            bound.join(kernels::gemm::packing_bound(L.gemm_path, L.caches, L.threads, M, Nc, K,
                                                    bf16, driver, L.avx512_bf16));
        }
    };
    const Dtype attn_d = L.policy.gemm_dtype(model::LayerClass::attention);
    const Dtype ffn_d  = L.policy.gemm_dtype(model::LayerClass::ffn);
    const Dtype head_d = L.policy.gemm_dtype(model::LayerClass::head);
    const int n_moe    = n_moe_layers(m);
    const bool dense   = n_moe < m.n_layer;
    const bool moe     = n_moe > 0;
    linear(N, C, 3 * C, attn_d, false);  // q, k, v
    linear(N, C, C, attn_d, false);      // attention projection
    if (dense) {
        linear(N, C, m.d_ff, ffn_d, false);
        linear(N, m.d_ff, C, ffn_d, false);
    }
    if (moe) {
        linear(N, C, m.gate_rows(), L.policy.router_dtype(), false);  // the router
        // the experts on the grouped driver, on up to a round's rows
        // (the grouped products' buffers do not depend on the rows; clamped to an int)
        const int R = static_cast<int>(std::min(round_rows(m, N, L.ep, L.capacity_factor), 1e9));
        linear(R, C, m.expert_width(), ffn_d, true);
        linear(R, m.expert_width(), C, ffn_d, true);
        if (m.n_shared_experts > 0) {  // either driver
            for (const bool grouped : {false, true}) {
                linear(N, C, m.shared_width(), ffn_d, grouped);
                linear(N, m.shared_width(), C, ffn_d, grouped);
            }
        }
    }
    // the LM head (fused: row blocks of at most N rows)
    linear(N, C, m.vocab_size, head_d, false);
    return static_cast<double>(bound.total(L.threads));
}

namespace {

// Windows of T + 1 tokens in a split's shards (a file, glob or directory, token_shards.h) from
// their headers; a file that is absent or not a shard counts 0.
uint64_t shard_windows(const std::string& spec, int T) {
    std::vector<std::string> paths;
    try {
        paths = data::resolve_shard_paths(spec, "data");
    } catch (const InputError&) {
        return 0;
    }
    uint64_t n = 0;
    for (const std::string& path : paths) {
        // a FIFO or device would block the open (the loader refuses them, naming the file)
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec)) continue;
        std::ifstream f(path, std::ios::binary);
        int32_t h[3] = {0, 0, 0};
        if (!f.read(reinterpret_cast<char*>(h), sizeof(h)) || h[0] != data::kTokenFileMagic)
            continue;
        n += static_cast<uint64_t>(data::windows_in(static_cast<uint32_t>(h[2]), T));
    }
    return n;
}

}  // namespace

MoEBytes moe_layer_bytes(const ModelConfig& m, int64_t max_tokens, int ep, double capacity_factor,
                         bool half_act, int a2a_chunks, bool gather_dy, bool y16) {
    // moe/moe_layer.cpp MoELayer::MoELayer and moe/token_dispatcher.cpp
    const double N = static_cast<double>(max_tokens), E = m.n_experts, K = m.top_k, C = m.d_model,
                 F = m.expert_width(), El = E / ep;
    const double R    = round_rows(m, max_tokens, ep, capacity_factor);
    const bool rounds = R < static_cast<double>(moe::max_local_rows(max_tokens, m.top_k, ep));
    const bool pieces = ep > 1 && a2a_chunks > 1;
    MoEBytes b;
    double& a = b.activations;
    double& s = b.layer_buffers;  // moe::MoEBuffers, counted in activations too
    // moe/router.cpp Router::Router: per layer, and its scratch shared by the layers
    const bool noisy = m.gate == moe::GateKind::noisy;
    double& d        = b.scratch;  // moe::MoEScratch, one for all layers
    // moe::RouterKept (softmax; the sigmoid and noisy gates' logits, which their backward reads;
    // the noisy gate's four arrays below): per layer, one set under recompute as MoEBuffers
    s += buf(N * E, 4);  // softmax
    a += buf(N * K, 4);  // probs_
    (noisy || m.router_score == RouterScore::sigmoid ? s : d) += buf(N * E, 4);
    a += buf(N * K, 4) + buf(E, 4);                          // expert_idx_, tokens_per_expert_
    a += 2 * buf(N * K, 4) + buf(N * K, 1);                  // selected_, dprobs_aux_, reassigned_
    a += buf(N, 8);                                          // entropy_
    if (m.router_z_loss_coef > 0) a += buf(N, 8);            // lse_
    if (m.jitter > 0) a += 2 * buf(N * C, 4);                // x_jit_, jit_
    d += buf(N * E, 4);                                      // dlogits
    if (m.product_keys > 0) d += buf(N * m.gate_rows(), 4);  // keys (product-key gate)
    if (m.balance_bias_rate > 0) d += buf(N * E, 4);         // biased
    if (m.route_nodes > 0) d += buf(N * E, 4);               // limited
    if (noisy) {
        const double R1 = std::min(K + 1, E);
        s += 4 * buf(N * E, 4);  // noise logits, eps, noisy logits, load prob
        a += buf(N * R1, 4);     // the ranking
        if (m.balance_bias_rate > 0) a += buf(N * R1, 4);  // load_pref_
        d += 2 * buf(N * E, 4) + buf(N * C, 4);            // dnoise_logits, dnoisy, dx_noise
    } else {
        d += buf(N * (m.gate == moe::GateKind::swipe ? E : K), 4);  // preference
    }
    s += 2 * buf(N * K, 4) + buf(E + 1, 4);  // row_of_, token_of_row_, offsets_
    a += 3 * E * 8;                          // global_tpe_, prob_sum_, f_
    // y_perm_, and x_perm_ with an exchange (with EP 1 the experts read the tokens in place);
    // with EP 1 in one round and bf16 activations y_perm_ is kept in 16 bits (y16_)
    s += (ep == 1 ? 1 : 2) * buf(N * K * C, 4);
    if (y16 && ep == 1 && !rounds) s += buf(N * K * C, 2) - buf(N * K * C, 4);
    const double hb = half_act ? 2 : 4;  // bytes of a kept pre-activation
    s += buf(R * F, hb);                 // h_ or h16_ (backward computes gelu(h) again)
    d += buf(R * F, 4);                  // dh_ (and the GELU outputs within a pass)
    // dy_perm_ and dx_perm_: one (N K, C) array for both (dx_perm_'s rows in dy_perm_'s), but
    // with pieces; with EP 1 in one round on 16-bit products dx_perm_ and probs_of_row_ (N K)
    d += (pieces ? 2 : 1) * buf(N * K * C, 4) + buf(N * K, 4);  // and dprobs_
    if (gather_dy && ep == 1 && !rounds) d += buf(N * K, 4);
    if (ep > 1 || rounds) {
        s += 2 * buf(R * C, 4);  // x_local_, y_local_
        d += 2 * buf(R * C, 4);  // dy_local_, dx_local_
    }
    if (rounds || pieces) a += buf(El * (F + C), 8) + buf(El, 1);  // bias_acc_, had_rows_
    if (rounds) {
        if (ep == 1) a += E * 8 + buf(E + 1, 4) + 3 * El * 8;  // local totals, offsets, rounds
    }
    if (m.n_shared_experts > 0) {
        const double S = m.n_shared_experts, FS = m.shared_width();
        s += buf(N * C, 4) + buf(S * N * FS, hb);  // ys_, hs_ or hs16_
        d += 2 * buf(N * C, 4) + buf(N * FS, 4);   // dys_ dxs_, dhs_
    }
    if (ep > 1) {
        // TokenDispatcher: staging_ (R, C), send_staging_ (N*K, C) when rounds are possible or
        // with pieces; counts_, round_counts_, send_rows_, send_first_ [E], starts_out_/in_
        // [2E], 8 x [EP], offsets, and each peer's rounds (3 x [El]); with pieces, about
        // a2a_chunks plans of 4 x [EP], 3 x [E] and the offsets
        const double staging = R * C;
        b.comm_buffers += buf(staging, 4) + (rounds || pieces ? buf(N * K * C, 4) : 0) + 4 * E * 8 +
                          4 * E * 8 + 8 * ep * 8 + (El + 1) * 4 + ep * 3 * El * 8;
        if (pieces) b.comm_buffers += a2a_chunks * ((4 * ep + 3 * E) * 8 + (El + 1) * 4);
        // send16_, recv16_: as large as the larger staging
        if (half_act) b.comm_buffers += 2 * buf(std::max(R, N * K) * C, 2);
    }
    a += s;
    return b;
}

Footprint footprint(const TrainConfig& cfg, const Layout& L, uint64_t order_bytes,
                    double baseline_bytes) {
    validate_layout(cfg, L.ranks);
    const ModelConfig& m = cfg.model;
    Footprint f;
    f.layout                   = L;
    const model::LayoutSize ls = model::layout_size(m, L.ep);
    f.params_full              = ls.full_params;
    f.rank_floats              = ls.rank_floats();
    f.expert_floats            = ls.expert_floats;
    const double n             = static_cast<double>(ls.rank_floats());
    const double MB = static_cast<double>(L.micro_batch), T = m.seq_len, N = MB * T;
    const double P       = L.ranks;
    const double R_round = round_rows(m, static_cast<int64_t>(N), L.ep, L.capacity_factor);

    // ---- memory (train/trainer.cpp run_training, model/gpt.cpp GPT::GPT) ----
    Memory& mem                        = f.memory;
    mem.baseline                       = baseline_bytes;
    const model::PrecisionPolicy& prec = L.policy;
    const model::ParamLayout lay       = model::make_layout(m, L.ep, 0);
    // dist/paro/spaces.h: the same spaces and shard maps the optimizer builds
    const dist::paro::MemoryFootprint opt = dist::paro::optimizer_footprint(
        lay, prec, L.opt_shards > 1, L.ranks, L.edp(), L.bucket_floats);
    mem.parameters   = buf(n, 4);  // GPT params_ (half values are stored in float arrays)
    mem.gradients    = buf(n, 4);  // GPT grads_
    mem.optimizer    = static_cast<double>(opt.optim_bytes);  // m, v (+ FP32 masters of O2 tensors)
    mem.comm_buffers = static_cast<double>(opt.comm_bytes);   // ParO bucket buffers
    const double C = m.d_model, V = m.vocab_size;
    // the LM head's gradient formed in forward in 16 bits on this machine (model/gpt.h)
    const bool head16 = model::head_gradient_in_16_bits(prec, cfg.train.fused_head ? 1 : 0);
    if (prec.mixed()) {
        // wc_: rounded copies of the float32-stored tensors computed in half, wte_head_ and
        // dround_ below; GPT allocates them only where the products take the rounded floats
        // (fp16) and reads the weights in place where the products round them (bf16:
        // kernels::half_products_convert)
        const bool copies             = !kernels::half_products_convert(prec.dtype);
        const model::ComputeCopies cc = model::plan_compute_copies(lay, prec);
        if (copies) mem.parameters += buf(static_cast<double>(cc.floats), 4);
        // bf16's O2 masters in the parameters (replicated optimizer): rounded copies of the
        // tensors read as floats (biases), made at each forward
        if (model::masters_in_place(prec, L.opt_shards > 1)) {
            mem.parameters += buf(
                static_cast<double>(model::plan_compute_copies(lay, prec, true).kept_floats), 4);
        }
        f.rounded_floats = cc.floats;
        for (const size_t i : cc.half) f.rounded_floats += lay.spec(i).numel;
        const model::ParamSpec* wte = lay.find("wte");
        if (copies && prec.gemm_dtype(model::LayerClass::head) != Dtype::float32 &&
            prec.compute_dtype(*wte) == Dtype::float32) {
            mem.parameters += buf(V * C, 4);  // wte_head_: wte rounded for the LM head
        }
        if (copies) mem.activations += buf(N * C, 4);  // dround_: rounded (N, C) GEMM operand
    }
    mem.activations += half_operand_bytes(cfg, L);  // bf16's 16-bit operand copies
    // Q, K, V and O kept in 16 bits without the bf16 attention core: the float core reads them
    // widened, one block's at a time (kernels::attention_forward_half16 / backward_dout16)
    const bool attn16 = model::attention_in_16_bits(m, prec);
    if (attn16 && kernels::attention_rounds_qkv(prec.gemm_dtype(model::LayerClass::attention),
                                                m.d_model / m.n_head, prec.fp64_sensitive))
        mem.activations += buf(3 * N * C, 4) + buf(N * C, 4);
    // train.recompute (model/gpt.h): block keeps one block's working set; moe and block share
    // one set of MoE buffers between the layers (the routers' (N, E) arrays among them)
    const Recompute rc = cfg.train.recompute;
    mem.activations +=
        static_cast<double>(model::activation_floats(
            m, L.micro_batch, cfg.train.fused_head ? model::fused_head_rows(m) : 0, rc,
            prec.act_dtype(model::LayerClass::ffn), prec.gemm_dtype(model::LayerClass::attention),
            prec.gemm_dtype(model::LayerClass::ffn), attn16, head16)) *
            4 +
        2 * buf(N, 4);  // arena; tokens, targets
    const MoEBytes moe = moe_layer_bytes(m, static_cast<int64_t>(N), L.ep, L.capacity_factor,
                                         prec.act_dtype(model::LayerClass::ffn) != Dtype::float32,
                                         cfg.parallel.a2a_chunks,
                                         prec.gemm_dtype(model::LayerClass::ffn) == Dtype::bfloat16,
                                         prec.act_dtype(model::LayerClass::ffn) == Dtype::bfloat16);
    const int n_moe    = n_moe_layers(m);
    // balanced load N*K rows per rank over the row budget (moe_layer.h): more than one round
    // only when the budget is below it (SWIPE in training keeps it exactly balanced)
    f.moe_rounds = n_moe > 0 ? std::max(1.0, std::ceil(N * m.top_k / R_round)) : 1;
    mem.activations += n_moe * moe.activations + (n_moe > 0 ? moe.scratch : 0);
    // moe::RouterScratch x_half, w_half: precision.router = "half" rounds the gate's input and
    // weight into them (one pair for all the layers)
    if (n_moe > 0 && prec.router_dtype() != Dtype::float32)
        mem.activations += buf(N * C, 4) + buf(C * static_cast<double>(m.gate_rows()), 4);
    if (rc != Recompute::none && n_moe > 1) mem.activations -= (n_moe - 1) * moe.layer_buffers;
    // collectives of the forward: one more for each MoE layer backward runs again
    const double n_fwd = n_moe + model::recomputed(m, rc).moe_layers;
    mem.comm_buffers += n_moe * moe.comm_buffers;
    if (n_moe > 0 && L.a2a_grid > 0) {
        // dist/comm/alltoallv.cpp alltoallv_grid: four grow-only byte buffers of the calling
        // thread (row out and in, column out and in), each up to one call's payload: what a
        // rank sends (N K float32 rows at most) for the first three, the budget's rows received
        // for the last. Hierarchical, the leader holds its node's: the same per rank on the mean
        mem.comm_buffers += (3 * N * m.top_k + R_round) * m.d_model * 4;
    }
    // train/checkpointing.cpp: the snapshot of this rank's pieces (masters, m, v; bf16 moments
    // as 2 bytes each), copied by the step loop and written by the I/O helper; the pieces cover
    // each space's shard (ParO) or an even split of it (replicated)
    if (cfg.checkpoint.every > 0) {
        const double moment_bytes = static_cast<double>(prec.moment_bytes());
        mem.checkpoint            = (4 + 2 * moment_bytes) *
                         static_cast<double>(dist::paro::state_piece_floats(
                             lay, prec, L.opt_shards > 1, L.ranks, L.edp(), L.bucket_floats));
    }
    mem.gemm_packing = gemm_packing_bytes(cfg, L);
    // Data (data/loader.cpp, data/dataset.cpp): the train and val shards are read a window at
    // a time (pread), nothing of them resident; a reader's data order holds a table of 8 bytes a
    // window up to kExactShuffleWindows windows and none beyond (data/sampler.h); the loader of a
    // reader holds two batches of its group's windows (B·(T+1) tokens per rank of the group, G
    // ranks) and, when it scatters, its own received one; the trainer copies one micro-batch of
    // inputs and targets
    {
        const double W = MB * (T + 1) * 4;
        const double G = L.readers > 0 ? std::ceil(P / L.readers) : 1;
        mem.data = static_cast<double>(order_bytes) + 2 * W * G + (G > 1 ? W : 0) + 2 * buf(N, 4);
    }

    // ---- collectives per step ----
    auto add = [&](std::string what, dist::CommKind kind, std::string group, int size, double calls,
                   double bytes) {
        if (calls > 0)
            f.collectives.push_back({std::move(what), kind, std::move(group), size, calls, bytes});
    };
    const double A = static_cast<double>(L.accum), E = m.n_experts, K = m.top_k;
    if (n_moe > 0 && L.ranks > 1) {
        // Router::forward: one allreduce of 5E + 4 doubles (top-k counts, probability sums,
        // loads, importance, load estimates, dropped, reassigned, entropy, z-loss sum), one more
        // with a scoped balancing loss (its sum). The capacity and SWIPE gates exchange counts
        // of their own (below).
        const double stats = 5 * E + (m.balance_loss_scope == BalanceScope::global ? 4 : 5);
        add("moe routing statistics", dist::CommKind::allreduce, "world", L.ranks, n_fwd * A,
            stats * 8 * n_fwd * A);
    }
    // the same as add, for a unit of gradient reduction or the hops of one of our collectives
    auto add_flagged = [&](std::string what, dist::CommKind kind, std::string group, int size,
                           double calls, double bytes, bool reduction, bool hops) {
        if (calls > 0) {
            f.collectives.push_back(
                {std::move(what), kind, std::move(group), size, calls, bytes, reduction, hops});
        }
    };
    const model::PrecisionPolicy& pol = L.policy;
    const int Pi                      = L.ranks;
    // One of our reduce-scatters / all-gathers of a whole array of `bytes` over a group of G
    // ranks on nn nodes of pn, with its sendrecv hops (dist/comm/collectives.cpp): one level
    // (ring or halving/doubling), over nodes one-level the direct exchange (reduce-scatter;
    // the all-gather stays one level), or two-level: inside the node over the whole array,
    // across nodes over the node rank's region (1/pn of it). Each rank sends, on the mean,
    // (G-1)/G of the array in one level; (pn-1)/pn inside and (nn-1)/G across in two.
    // stride: the group's ranks are every stride-th world rank (the expert-data-parallel group)
    auto add_over_nodes = [&](const std::string& what, dist::CommKind kind, const char* group,
                              int G, int nn, int pn, double bytes, bool reduction, double calls,
                              int stride) {
        f.collectives.push_back({what, kind, group, G, calls, calls * bytes, reduction, false, nn,
                                 pn, nn > 1 && L.two_level, false, L.coll_algo, stride});
        const bool gather = kind == dist::CommKind::all_gather;
        // one level's hops and the bytes a rank sends there on the mean
        auto hops = [&](const std::string& w, int p, double array) {
            const dist::CollAlgo a = dist::resolve_algo(L.coll_algo, p, static_cast<size_t>(array));
            const dist::CollTraffic t = dist::coll_traffic(a, p, array, gather);
            add_flagged(w, dist::CommKind::sendrecv, group, p, calls * t.hops,
                        calls * t.mean_sent_bytes, false, true);
        };
        if (nn > 1 && L.two_level) {
            hops(what + " hops (node)", pn, bytes);
            hops(what + " hops (across nodes)", nn, bytes / pn);  // the node rank's region
        } else if (nn > 1 && kind == dist::CommKind::reduce_scatter) {
            add_flagged(what + " hops (direct)", dist::CommKind::sendrecv, group, G,
                        calls * (G - 1), calls * bytes * (G - 1) / G, false, true);
        } else {
            hops(what + " hops", G, bytes);
        }
    };

    // data/loader.cpp DataLoader::next: in a reader group of more than one rank, every
    // micro-batch is scattered from the reader, MB windows of T + 1 int32 to each member
    // (counted on every member). Mean over ranks: only members of such groups scatter.
    if (L.readers > 0 && Pi > 1) {
        double members = 0;
        int largest    = 1;
        for (int r = 0; r < Pi;) {
            const data::ReaderGroup g = data::reader_group(r, Pi, L.readers);
            if (g.size > 1) members += g.size;
            largest = std::max(largest, g.size);
            r += g.size;
        }
        const double share = members / P, window_bytes = MB * (T + 1) * 4;
        add("data scatter", dist::CommKind::scatter, "readers", largest, A * share,
            A * share * window_bytes);
    }
    if (n_moe > 0 && Pi > 1) {
        const moe::GateKind gate = m.gate;
        // moe/router.cpp Router::capacity_rounds (switch, gshard in training): the K x E
        // first-choice counts of every rank, allgathered over the world
        if (gate == moe::GateKind::switch_top1 || gate == moe::GateKind::gshard) {
            add("moe capacity counts", dist::CommKind::allgather, "world", Pi, n_fwd * A,
                K * E * 8 * n_fwd * A);
        }
        // Router::swipe_rounds (swipe in training): K rounds, each an allgather in the EP
        // group of (E + 1) counts per virtual worker
        if (gate == moe::GateKind::swipe && L.ep > 1) {
            const double vw = cfg.parallel.virtual_workers;
            add("moe swipe counts", dist::CommKind::allgather, "ep", L.ep, K * n_fwd * A,
                K * vw * (E + 1) * 8 * n_fwd * A);
        }
    }
    if (n_moe > 0 && L.ep > 1) {
        // TokenDispatcher::dispatch_preprocess: per-expert counts, the all-reduce of the largest
        // receipt and, only with several rounds, each source's start in every expert's rows
        // and the expert's total; then MoELayer's dispatch in forward and in
        // backward with GEMM-dtype payloads (half from FFN level O1), combine in both with
        // activation-dtype payloads (half from O2): N*K rows of C values each, the mean over
        // ranks (slots dropped by a capacity gate are not sent: an upper bound there), one call
        // of each per round; with more than one round backward dispatches the tokens again
        // counts: each peer gets its El experts' counts, E int64 sent per rank in all
        // (a layer backward runs again (train.recompute) counts, dispatches and combines its
        // tokens once more: n_fwd - n_moe extra forwards)
        // (over many ranks Bruck's exchange: log2 EP sendrecv steps of about EP / 2 blocks,
        // dist::use_bruck, timed as those steps)
        const size_t block = static_cast<size_t>(E / L.ep) * sizeof(int64_t);
        if (dist::use_bruck(L.coll_algo, L.ep, block)) {
            const dist::BruckTraffic t = dist::bruck_traffic(L.ep, static_cast<double>(block));
            add("moe expert counts (Bruck)", dist::CommKind::sendrecv, "ep", L.ep,
                t.hops * n_fwd * A, t.sent_bytes * n_fwd * A);
        } else {
            add("moe expert counts", dist::CommKind::alltoallv, "ep", L.ep, n_fwd * A,
                E * 8 * n_fwd * A);
        }
        add("moe largest receipt", dist::CommKind::allreduce, "ep", L.ep, n_fwd * A, 8 * n_fwd * A);
        const double rows = N * K * C * A, Rr = f.moe_rounds, again = Rr > 1 ? 1 : 0;
        // parallel.a2a_chunks: one round cut into pieces, each exchanged alone; the cut needs
        // the row starts too. The pieces follow the routing: a2a_chunks is the count at the
        // balanced load (the bytes do not change)
        const double pieces = Rr == 1 && cfg.parallel.a2a_chunks > 1 ? cfg.parallel.a2a_chunks : 1;
        // moe/moe_layer.cpp: the helper's overlaps (pieces; else the shared experts beside the
        // dispatch of the plain exchange)
        f.a2a_pieces    = pieces;
        f.shared_beside = pieces == 1 && Rr == 1 && !L.node_dedup && m.n_shared_experts > 0 &&
                          cfg.parallel.overlap_shared;
        f.a2a_forward_share = n_fwd / (n_fwd + n_moe);
        const double starts = again + (pieces > 1 ? 1 : 0);
        add("moe row starts", dist::CommKind::alltoallv, "ep", L.ep, starts * n_fwd * A,
            starts * 2 * E * 8 * n_fwd * A);
        const Dtype gd = pol.gemm_dtype(model::LayerClass::ffn),
                    ad = pol.act_dtype(model::LayerClass::ffn);
        // per layer forward: one dispatch and one combine; backward: one of each, and with more
        // than one round the tokens dispatched again
        const double n_disp = n_fwd + (1 + again) * n_moe, n_comb = n_fwd + n_moe;
        // dist/comm/alltoallv.cpp alltoallv_hierarchical, per call: the node's send and receive
        // counts allgathered (EP int64 each), every rank's rows gathered to its node leader,
        // the leaders' exchange (the node's rows), the leader's scatter of what the node
        // receives: summed over ranks, each of the three moves carries every row once
        const auto [an, al] = group_nodes(L.ep, 1, L.ranks_per_node);
        // the direct exchange over P ranks (the EP group, or its nodes' leaders: one rank in
        // `per` calls, calls and bytes the mean over ranks), or with parallel.a2a_grid
        // (dist::alltoallv_grid) over G rows of S: each rank sends G sizes to each of its row,
        // its bytes along the row, and the same bytes again along its column
        auto direct = [&](const std::string& what, const std::string& group, int np, int per,
                          double calls, double bytes) {
            auto push = [&](const std::string& w, const std::string& g, int size, double b,
                            int stride) {
                Collective c{w, dist::CommKind::alltoallv, g, size, calls / per, b};
                c.per_node = per;
                c.leaders  = per > 1 || L.hierarchical_a2a;
                c.stride   = stride;
                f.collectives.push_back(c);
            };
            if (L.a2a_grid <= 1) {
                push(what, group, np, bytes, 1);
                return;
            }
            const int S = L.a2a_grid, G = np / S;
            push(what + " grid sizes", group + " rows", S, calls / per * S * G * 8, 1);
            push(what + " along rows", group + " rows", S, bytes, 1);
            push(what + " along columns", group + " columns", G, bytes, S);
        };
        auto exchange = [&](const std::string& what, double calls, double bytes) {
            if (!L.hierarchical_a2a) {
                direct(what, "ep", L.ep, 1, calls, bytes);
                return;
            }
            add(what + " counts in the node", dist::CommKind::allgather, "ep node", al, 2 * calls,
                2 * calls * L.ep * 8);
            add(what + " gather to the node leader", dist::CommKind::alltoallv, "ep node", al,
                calls, bytes);
            direct(what + " between node leaders", "ep leaders", an, al, calls, bytes);
            add(what + " scatter in the node", dist::CommKind::alltoallv, "ep node", al, calls,
                bytes);
        };
        // a row's share that crosses nodes when the routing spreads evenly over the experts
        const double away = an > 1 ? (an - 1.0) / an : 0.0;
        f.a2a_inter_node_bytes_plain =
            away * (n_disp * rows * elem_bytes(gd) + n_comb * rows * elem_bytes(ad));
        if (L.node_dedup && Rr == 1 && pieces == 1) {
            // moe/node_dispatcher.cpp, per forward: the entry counts (alltoall) and the entries'
            // slots (8K bytes each) over EP, every relay's (source, expert) counts in the node;
            // dispatch: the tokens once per (token, node) over EP (GEMM dtype), their slots' rows
            // in the node; combine: the slots' outputs back in the node (activation dtype), one
            // float32 sum per entry home. Backward: the output gradient per entry (float32) and
            // the slots' rows (GEMM dtype); the input gradients in the node (activation dtype)
            // and C + K floats per entry home. Entries per token: route_nodes of the EP group's
            // nodes (exact for 1: every slot on one node), else the expected distinct nodes of K
            // slots spread evenly.
            const double M = cfg.model.route_nodes > 0 ? std::min<double>(cfg.model.route_nodes, an)
                                                       : an * (1 - std::pow(1 - 1.0 / an, K));
            const double ents = N * M * A, El = static_cast<double>(E) / L.ep;
            add("moe dedup entry counts", dist::CommKind::alltoall, "ep", L.ep, n_fwd * A,
                L.ep * 8 * n_fwd * A);
            exchange("moe dedup slots", n_fwd * A, n_fwd * ents * 8 * K);
            add("moe dedup relay counts", dist::CommKind::alltoallv, "ep node", al, n_fwd * A,
                al * L.ep * El * 8 * n_fwd * A);
            const double g = elem_bytes(gd), a = elem_bytes(ad);
            exchange(fmt::format("moe dedup dispatch ({})", dtype_name(gd)), n_fwd * A,
                     n_fwd * ents * C * g);
            add(fmt::format("moe dedup dispatch in the node ({})", dtype_name(gd)),
                dist::CommKind::alltoallv, "ep node", al, (n_fwd + n_moe) * A,
                (n_fwd + n_moe) * rows * g);
            add(fmt::format("moe dedup combine in the node ({})", dtype_name(ad)),
                dist::CommKind::alltoallv, "ep node", al, (n_fwd + n_moe) * A,
                (n_fwd + n_moe) * rows * a);
            exchange("moe dedup combine (fp32)", n_fwd * A, n_fwd * ents * C * 4);
            exchange("moe dedup output gradient (fp32)", n_moe * A, n_moe * ents * C * 4);
            exchange("moe dedup input gradient (fp32)", n_moe * A, n_moe * ents * (C + K) * 4);
            f.a2a_inter_node_bytes =
                away * (n_fwd * ents * (8 * K + C * g + C * 4) + n_moe * ents * (2 * C + K) * 4);
        } else {
            exchange(fmt::format("moe dispatch all-to-all ({})", dtype_name(gd)),
                     n_disp * Rr * pieces * A, n_disp * rows * elem_bytes(gd));
            exchange(fmt::format("moe combine all-to-all ({})", dtype_name(ad)),
                     n_comb * Rr * pieces * A, n_comb * rows * elem_bytes(ad));
            f.a2a_inter_node_bytes =
                away * (n_disp * rows * elem_bytes(gd) + n_comb * rows * elem_bytes(ad));
        }
    }
    if (Pi > 1) {
        // train/trainer.cpp: the step's loss, the count of ranks still writing a checkpoint and
        // of ranks signalled to stop (three doubles)
        add("loss", dist::CommKind::allreduce, "world", Pi, 1, 24);
    }
    if (Pi > 1 && L.opt_shards <= 1) {
        // dist/paro/replicated_adamw.cpp: one allreduce per run of dense tensors (n_moe + 1
        // runs) over the world, one per run of expert tensors over the expert-data-parallel
        // group; global_grad_norm adds the expert squares over the EP group
        const double dense  = static_cast<double>(ls.dense_floats) * 4,
                     expert = static_cast<double>(ls.expert_floats) * 4;
        const auto [wn, wl] = group_nodes(Pi, 1, L.reduce_group);
        if (wn > 1) {
            // over nodes: each segment is an allreduce_mean (reduce-scatter + all-gather) of
            // our own, per level (collectives.h, "over nodes")
            const model::ParamLayout rank_layout = model::make_layout(m, L.ep, 0);
            const auto [en, el]                  = group_nodes(L.edp(), L.ep, L.reduce_group);
            for (const dist::paro::Segment& sg : dist::paro::make_segments(rank_layout)) {
                const bool ex = sg.expert;
                const int G   = ex ? L.edp() : Pi;
                if (G <= 1) continue;
                const double b = static_cast<double>(sg.end - sg.begin) * 4;
                const int nn = ex ? en : wn, pn = ex ? el : wl;
                const std::string what =
                    ex ? "gradient all-reduce (experts)" : "gradient all-reduce (dense)";
                add_over_nodes(what + " reduce-scatter", dist::CommKind::reduce_scatter,
                               ex ? "edp" : "world", G, nn, pn, b, true, 1, ex ? L.ep : 1);
                add_over_nodes(what + " all-gather", dist::CommKind::all_gather,
                               ex ? "edp" : "world", G, nn, pn, b, true, 1, ex ? L.ep : 1);
            }
        } else {
            add_flagged("gradient all-reduce (dense)", dist::CommKind::allreduce, "world", Pi,
                        n_moe + 1, dense, true, false);
            if (L.edp() > 1 && n_moe > 0) {
                add_flagged("gradient all-reduce (experts)", dist::CommKind::allreduce, "edp",
                            L.edp(), n_moe, expert, true, false);
            }
        }
        if (L.ep > 1) add("gradient norm (experts)", dist::CommKind::allreduce, "ep", L.ep, 1, 8);
    } else if (Pi > 1) {
        // PartitionedAdamW: per space split over more than one rank, one reduce-scatter (float32
        // gradients; precision.grad_reduce = "half": the half-stored spaces' gradients in their
        // half type) per bucket, then the norm's allreduce over the world, then one all-gather
        // per bucket (the space's storage dtype: half-stored tensors travel as half values).
        // Our collectives run on Comm::sendrecv: their hops are counted under sendrecv too.
        const ParoSpaces sp  = paro_spaces(m, L.ep, pol);
        const char* names[4] = {"dense", "experts", "dense", "experts"};
        struct Space {
            int groups;
            double nb, q;
            Dtype dtype;
        };
        std::vector<std::pair<int, Space>> spaces;
        for (int i = 0; i < (sp.any_half ? 4 : 2); ++i) {
            const int G = i % 2 == 1 ? L.opt_shards_expert : L.opt_shards;
            if (sp.floats[i] == 0 || G <= 1) continue;
            const dist::paro::ShardGeometry g =
                dist::paro::shard_geometry(static_cast<size_t>(sp.floats[i]), G, L.bucket_floats);
            spaces.push_back({i, Space{G, static_cast<double>(g.nb), static_cast<double>(g.q),
                                       i >= 2 ? pol.dtype : Dtype::float32}});
        }
        auto label = [&](const char* what, int i, Dtype d) {
            return i >= 2 || sp.any_half
                       ? fmt::format("{} ({}, {} tensors)", what, names[i], dtype_name(d))
                       : fmt::format("{} ({})", what, names[i]);
        };
        auto own = [&](const std::string& what, dist::CommKind kind, int i, const Space& s,
                       double elem, bool reduction) {
            const double bucket = s.groups * s.q * elem;  // bytes of one call's whole array
            const char* group   = i % 2 == 1 ? "edp" : "world";
            const int stride    = i % 2 == 1 ? L.ep : 1;
            const auto [nn, pn] = group_nodes(s.groups, stride, L.reduce_group);
            add_over_nodes(what, kind, group, s.groups, nn, pn, bucket, reduction, s.nb, stride);
        };
        for (const auto& [i, s] : spaces) {
            const double elem = i >= 2 && pol.half_reduce ? elem_bytes(s.dtype) : 4;
            own(label("gradient reduce-scatter", i, s.dtype), dist::CommKind::reduce_scatter, i, s,
                elem, true);
        }
        add("gradient norm", dist::CommKind::allreduce, "world", Pi, 1, 8);
        for (const auto& [i, s] : spaces) {
            own(label("parameter all-gather", i, s.dtype), dist::CommKind::all_gather, i, s,
                elem_bytes(s.dtype), false);
        }
    }
    // Dynamic loss scaling (fp16) adds no collective: a step is skipped when the all-reduced
    // norm is not finite.

    f.tokens_per_step      = static_cast<double>(cfg.train.batch_size) * T;
    f.model_flops_per_step = 3 * model::forward_flops_per_token(m, m.seq_len) * f.tokens_per_step;
    return f;
}

std::pair<int, int> group_nodes(int G, int stride, int R) {
    std::map<int, int> count;  // node -> ranks of the group on it
    for (int k = 0; k < G; ++k) ++count[k * stride / std::max(1, R)];
    const int c0 = count.begin()->second;
    for (const auto& [node, c] : count) {
        if (c != c0) return {1, G};
    }
    return {static_cast<int>(count.size()), c0};
}

Layout make_layout(const TrainConfig& cfg, const model::PrecisionPolicy& policy, int ranks,
                   int ranks_per_node, int threads) {
    Layout L;
    L.ranks          = ranks;
    L.ranks_per_node = ranks_per_node;
    L.ep             = cfg.parallel.expert_parallel;
    L.micro_batch    = cfg.micro_batch(ranks);
    L.accum          = std::max<int64_t>(1, cfg.grad_accum_steps(ranks));
    L.threads        = threads;
    // dist/paro/optimizer.cpp make_optimizer: ParO splits dense tensors over the world, experts
    // over their expert-data-parallel group
    if (cfg.partition_optimizer(ranks)) {
        L.opt_shards        = ranks;
        L.opt_shards_expert = ranks / L.ep;
    }
    L.bucket_floats = dist::paro::paro_bucket_floats(cfg, ranks);
    // data/loader.cpp: auto resolves to one reader a node of consecutive ranks (as mpirun places
    // them) when there are several, as many ranks each
    L.readers = cfg.data.readers.resolve(
        ranks_per_node > 0 && ranks % ranks_per_node == 0 ? ranks / ranks_per_node : 0);
    L.policy = policy;
    // train/trainer.cpp: a helper thread reduces during backward when P > 1 (and MPI provides
    // MPI_THREAD_MULTIPLE, assumed here)
    L.overlap = cfg.parallel.overlap_grad_reduce && ranks > 1;
    // dist/parallel.cpp: two-level when the world spans more than one node (auto), or "on"
    L.reduce_group     = cfg.parallel.reduce_group > 0 ? cfg.parallel.reduce_group : ranks_per_node;
    L.two_level        = switch_on(cfg.parallel.two_level, ranks / std::max(1, L.reduce_group) > 1);
    L.coll_algo        = dist::coll_algo_of(cfg.parallel.collectives);
    L.hierarchical_a2a = L.ep > 1 && switch_on(cfg.parallel.hierarchical_a2a, L.nodes() > 1);
    // cli/commands.cpp, as ParallelContext::set_node_dedup takes it
    L.node_dedup = L.ep > 1 && cfg.node_dedup(group_nodes(L.ep, 1, L.ranks_per_node).first);
    // dist/parallel.cpp set_a2a_grid: rows over the exchange's ranks (its nodes' leaders when
    // hierarchical)
    L.a2a_grid = L.ep > 1
                     ? dist::grid_rows(
                           cfg.parallel.a2a_grid,
                           L.hierarchical_a2a ? group_nodes(L.ep, 1, L.ranks_per_node).first : L.ep)
                     : 0;
    return L;
}

dist::CommTally per_kind(const std::vector<Collective>& cs) {
    dist::CommTally t;
    for (const Collective& c : cs) {
        t[c.kind].calls += static_cast<uint64_t>(std::llround(c.calls));
        t[c.kind].bytes += static_cast<uint64_t>(std::llround(c.bytes));
    }
    return t;
}

uint64_t data_order_bytes(const TrainConfig& cfg) {
    uint64_t bytes = 0;
    for (const std::string& spec : cfg.data.train_splits()) {
        const uint64_t n = shard_windows(spec, cfg.model.seq_len);
        if (data::shuffle_kind_for(static_cast<int64_t>(n)) == data::ShuffleKind::exact) {
            bytes += 8 * n;
        }
    }
    return bytes;
}

}  // namespace bagualu::plan

// The counts of footprint.h. Every formula names the code it mirrors.
#include "plan/footprint.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "moe/moe_layer.h"
#include "train/optimizer.h"

namespace bagualu::plan {
namespace {

// Bytes of a Buffer<T>(n): rounded up to kAlign.
double buf(double n, double elem) { return std::ceil(n * elem / kAlign) * kAlign; }

int n_moe_layers(const ModelConfig& m) {
    int n = 0;
    for (int l = 0; l < m.n_layer; ++l) n += m.is_moe_block(l) ? 1 : 0;
    return n;
}

}  // namespace

MoEBytes moe_layer_bytes(const ModelConfig& m, int64_t max_tokens, int ep, double capacity_factor,
                         bool half_payload) {
    // moe/moe_layer.cpp MoELayer::MoELayer and moe/token_dispatcher.cpp
    const double N = static_cast<double>(max_tokens), E = m.n_experts, K = m.top_k,
                 C = m.d_model, F = m.d_ff;
    // rows this rank's experts may receive: the bound MoELayer sizes its buffers with
    double R = static_cast<double>(moe::max_local_rows(moe::parse_gate(m.gate), max_tokens, m.top_k, ep));
    if (capacity_factor > 0) R = std::ceil(capacity_factor * N * K);
    MoEBytes b;
    double& a = b.activations;
    a += 2 * buf(N * E, 4) + buf(N * K, 4);                    // logits_, softmax_full_, probs_
    a += buf(N * K, 4) + buf(E, 4);                            // expert_idx_, tokens_per_expert_
    a += 2 * buf(N * K, 4) + buf(E + 1, 4);                    // row_of_, token_of_row_, offsets_
    a += 3 * E * 8;                                            // global_tpe_, prob_sum_, f_
    a += 2 * buf(N * K * C, 4);                                // x_perm_, y_perm_
    a += 3 * buf(R * F, 4);                                    // h_, g_, dh_
    a += 2 * buf(N * K * C, 4) + buf(N * K, 4) + buf(N * E, 4);  // dy_perm_, dx_perm_, dprobs_, dlogits_
    if (ep > 1) {
        a += 4 * buf(R * C, 4);  // x_local_, y_local_, dy_local_, dx_local_
        // TokenDispatcher: staging_ (EP * max_rows, C), counts_ [EP * E], 4 x [EP], offsets
        const double staging = std::max(R, N * K) * C;
        b.comm_buffers += buf(staging, 4) + ep * E * 8 + 4 * ep * 8 + (E / ep + 1) * 4;
        if (half_payload) b.comm_buffers += 2 * buf(staging, 2);  // send16_, recv16_

    }
    return b;
}

Footprint footprint(const TrainConfig& cfg, const Layout& L, uint64_t data_tokens,
                    double baseline_bytes) {
    validate_layout(cfg, L.ranks);
    const ModelConfig& m = cfg.model;
    Footprint          f;
    f.layout = L;
    const model::LayoutSize ls = model::layout_size(m, L.ep);
    f.params_full              = ls.full_params;
    f.rank_floats              = ls.rank_floats();
    f.expert_floats            = ls.expert_floats;
    const double n             = static_cast<double>(ls.rank_floats());
    const double MB = static_cast<double>(L.micro_batch), T = m.seq_len, N = MB * T;
    const double P  = L.ranks;

    // ---- memory (train/trainer.cpp run_training, model/gpt.cpp GPT::GPT) ----
    Memory& mem    = f.memory;
    mem.baseline   = baseline_bytes;
    const model::PrecisionPolicy prec = model::PrecisionPolicy::from_config(cfg.precision);
    const model::ParamLayout     lay  = model::make_layout(m, L.ep, 0);
    // train/optimizer.h: the same spaces and shard maps the optimizer builds
    const train::MemoryFootprint opt = train::optimizer_footprint(
        lay, prec, cfg.partition_optimizer(L.ranks), L.ranks, L.edp(),
        train::PartitionedAdamW::kDefaultBucketFloats);
    mem.parameters = buf(n, 4);  // GPT params_ (half values are stored in float arrays)
    mem.gradients  = buf(n, 4);  // GPT grads_
    mem.optimizer  = static_cast<double>(opt.optim_bytes);  // m, v (+ FP32 masters of O2 tensors)
    mem.comm_buffers = static_cast<double>(opt.comm_bytes);  // ParO bucket buffers
    const double C = m.d_model, V = m.vocab_size;
    if (prec.mixed()) {
        mem.parameters += buf(n, 4);  // wc_: the weights as computed with, rounded per the policy
        const model::ParamSpec* wte = lay.find("wte");
        if (prec.gemm_dtype(model::LayerClass::head) != Dtype::float32 &&
            prec.compute_dtype(*wte) == Dtype::float32) {
            mem.parameters += buf(V * C, 4);  // wte_head_: wte rounded for the LM head
        }
        mem.activations += buf(N * C, 4);  // dround_: rounded (N, C) GEMM operand
    }
    // kernels/mixed.cpp: bf16 GEMMs convert their operands into grow-only 16-bit copies (input,
    // weight, output gradient), each as large as the largest of its kind
    if (prec.dtype == Dtype::bfloat16) {
        double inp = 0, w = 0, dout = 0;
        auto   half_linear = [&](model::LayerClass c, double in, double out) {
            if (prec.gemm_dtype(c) != Dtype::bfloat16) return;
            inp  = std::max(inp, N * in);
            w    = std::max(w, in * out);
            dout = std::max(dout, N * out);
        };
        half_linear(model::LayerClass::attention, C, 3 * C);
        half_linear(model::LayerClass::attention, C, C);
        if (n_moe_layers(m) < m.n_layer) {
            half_linear(model::LayerClass::ffn, C, m.d_ff);
            half_linear(model::LayerClass::ffn, m.d_ff, C);
        }
        half_linear(model::LayerClass::head, C, V);
        mem.activations += 2 * (inp + w + dout);
    }
    mem.activations += static_cast<double>(model::activation_floats(m, L.micro_batch)) * 4 +
                       2 * buf(N, 4);  // arena; tokens, targets
    const MoEBytes moe = moe_layer_bytes(m, static_cast<int64_t>(N), L.ep, L.capacity_factor,
                                         prec.act_dtype(model::LayerClass::ffn) != Dtype::float32);
    const int      n_moe = n_moe_layers(m);
    mem.activations += n_moe * moe.activations;
    mem.comm_buffers += n_moe * moe.comm_buffers;
    // train/checkpointing.cpp: the snapshot of this rank's pieces (masters, m, v), copied by the
    // step loop and written by the I/O helper; the pieces cover each space's shard (ParO) or an
    // even split of it (replicated)
    if (cfg.checkpoint.every > 0) {
        mem.checkpoint = 3 * 4 * static_cast<double>(train::state_piece_floats(
                                lay, prec, cfg.partition_optimizer(L.ranks), L.ranks, L.edp(),
                                train::PartitionedAdamW::kDefaultBucketFloats));
    }
    // Data (data/loader.cpp, data/dataset.cpp): the train shards are memory-mapped and val is
    // read (counted as resident, 4 bytes a token: an upper bound); the loader of a reader holds
    // two batches of its group's windows (B·(T+1) tokens per rank of the group, G ranks) and,
    // when it scatters, its own received one; the trainer copies one micro-batch of inputs and
    // targets
    {
        const double W = MB * (T + 1) * 4;
        const double G = cfg.data.readers > 0 ? std::ceil(P / cfg.data.readers) : 1;
        mem.data = static_cast<double>(data_tokens) * 4 + 2 * W * G + (G > 1 ? W : 0) + 2 * buf(N, 4);
    }

    // ---- collectives per step ----
    auto add = [&](std::string what, dist::CommKind kind, std::string group, int size,
                   double calls, double bytes) {
        if (calls > 0) f.collectives.push_back({std::move(what), kind, std::move(group), size, calls, bytes});
    };
    const double A = static_cast<double>(L.accum), E = m.n_experts, K = m.top_k;
    if (n_moe > 0 && L.ranks > 1) {
        // Router::forward: one allreduce of 5E + 3 doubles (top-k counts, probability sums,
        // loads, importance, load estimates, dropped, reassigned, entropy). The capacity and
        // SWIPE gates add count exchanges of their own that are not modelled here.
        add("moe routing statistics", dist::CommKind::allreduce, "world", L.ranks, n_moe * A,
            (5 * E + 3) * 8 * n_moe * A);
    }
    if (n_moe > 0 && L.ep > 1) {
        // TokenDispatcher::dispatch_preprocess: per-expert counts; then dispatch + combine in
        // forward and in backward, N*K rows of C floats each on average
        add("moe expert counts", dist::CommKind::allgather, "ep", L.ep, n_moe * A, E * 8 * n_moe * A);
        add("moe all-to-all", dist::CommKind::alltoallv, "ep", L.ep, 4 * n_moe * A,
            4 * N * K * C * 4 * n_moe * A);
    }
    if (L.ranks > 1) {
        // the step's loss and the count of ranks still writing a checkpoint (two doubles)
        add("loss", dist::CommKind::allreduce, "world", L.ranks, 1, 16);
        // train/grad_sync.cpp: one call per run of dense tensors (n_moe + 1 runs) over world,
        // one per run of expert tensors over the expert-data-parallel group
        const double dense = static_cast<double>(ls.dense_floats) * 4,
                     expert = static_cast<double>(ls.expert_floats) * 4;
        if (L.opt_shards > 1) {
            add("gradient reduce-scatter (dense)", dist::CommKind::reduce_scatter, "world",
                L.ranks, n_moe + 1, dense);
            add("parameter all-gather (dense)", dist::CommKind::all_gather, "world", L.ranks,
                n_moe + 1, dense);
        } else {
            add("gradient all-reduce (dense)", dist::CommKind::allreduce, "world", L.ranks,
                n_moe + 1, dense);
        }
        if (L.edp() > 1 && n_moe > 0) {
            add("gradient all-reduce (experts)", dist::CommKind::allreduce, "edp", L.edp(), n_moe,
                expert);
        }
    }
    if (L.ep > 1) add("gradient norm (experts)", dist::CommKind::allreduce, "ep", L.ep, 1, 8);

    f.tokens_per_step      = static_cast<double>(cfg.train.batch_size) * T;
    f.model_flops_per_step = 3 * model::forward_flops_per_token(m, m.seq_len) * f.tokens_per_step;
    return f;
}

dist::CommTally per_kind(const std::vector<Collective>& cs) {
    dist::CommTally t;
    for (const Collective& c : cs) {
        t[c.kind].calls += static_cast<uint64_t>(std::llround(c.calls));
        t[c.kind].bytes += static_cast<uint64_t>(std::llround(c.bytes));
    }
    return t;
}

}  // namespace bagualu::plan

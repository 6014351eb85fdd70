// The counts of footprint.h. Every formula names the code it mirrors.
#include "plan/footprint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "data/loader.h"
#include "dist/comm/collectives.h"
#include "moe/router.h"
#include "dist/paro/shard_map.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "moe/moe_layer.h"
#include "dist/paro/spaces.h"

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

// ParO's spaces (dist/paro/partitioned_adamw.cpp PartitionedAdamW::PartitionedAdamW): tensors split by
// (half-stored, expert) into [dense, expert] of float32 tensors and, when any tensor is
// half-stored, [dense, expert] of half ones; floats per space, tensor padding included.
struct ParoSpaces {
    double floats[4] = {0, 0, 0, 0};
    bool   any_half  = false;
};

ParoSpaces paro_spaces(const ModelConfig& m, int ep, const model::PrecisionPolicy& prec) {
    ParoSpaces sp;
    model::for_each_param_kind(m, ep, [&](const model::ParamSpec& s, uint64_t count) {
        const bool half = prec.master_mode(s) != model::MasterMode::none;
        sp.any_half     = sp.any_half || half;
        sp.floats[(half ? 2 : 0) + (s.expert ? 1 : 0)] += static_cast<double>(count * ((s.numel + 15) / 16 * 16));
    });
    return sp;
}

}  // namespace

MoEBytes moe_layer_bytes(const ModelConfig& m, int64_t max_tokens, int ep, double capacity_factor,
                         bool half_payload) {
    // moe/moe_layer.cpp MoELayer::MoELayer and moe/token_dispatcher.cpp
    const double N = static_cast<double>(max_tokens), E = m.n_experts, K = m.top_k,
                 C = m.d_model, F = m.d_ff;
    // rows this rank's experts may receive: the bound MoELayer sizes its buffers with
    double R = static_cast<double>(moe::max_local_rows(max_tokens, m.top_k, ep));
    if (capacity_factor > 0) R = std::ceil(capacity_factor * N * K);
    MoEBytes b;
    double& a = b.activations;
    double& s = b.layer_buffers;  // moe::MoEBuffers, counted in activations too
    a += 2 * buf(N * E, 4) + buf(N * K, 4);                    // logits_, softmax_full_, probs_
    a += buf(N * K, 4) + buf(E, 4);                            // expert_idx_, tokens_per_expert_
    s += 2 * buf(N * K, 4) + buf(E + 1, 4);                    // row_of_, token_of_row_, offsets_
    a += 3 * E * 8;                                            // global_tpe_, prob_sum_, f_
    s += 2 * buf(N * K * C, 4);                                // x_perm_, y_perm_
    s += 3 * buf(R * F, 4);                                    // h_, g_, dh_
    s += 2 * buf(N * K * C, 4) + buf(N * K, 4);                // dy_perm_, dx_perm_, dprobs_
    a += buf(N * E, 4);                                        // dlogits_
    if (ep > 1) {
        s += 4 * buf(R * C, 4);  // x_local_, y_local_, dy_local_, dx_local_
        // TokenDispatcher: staging_ (max(R, N*K), C), counts_ [E], 6 x [EP], offsets
        const double staging = std::max(R, N * K) * C;
        b.comm_buffers += buf(staging, 4) + E * 8 + 6 * ep * 8 + (E / ep + 1) * 4;
        if (half_payload) b.comm_buffers += 2 * buf(staging, 2);  // send16_, recv16_

    }
    a += s;
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
    const model::PrecisionPolicy& prec = L.policy;
    const model::ParamLayout      lay  = model::make_layout(m, L.ep, 0);
    // dist/paro/spaces.h: the same spaces and shard maps the optimizer builds
    const dist::paro::MemoryFootprint opt = dist::paro::optimizer_footprint(
        lay, prec, L.opt_shards > 1, L.ranks, L.edp(), L.bucket_floats);
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
    // train.recompute (model/gpt.h): block keeps one block's working set; moe and block share
    // one set of MoE buffers between the layers (the routers stay per layer)
    const Recompute rc = cfg.train.recompute;
    mem.activations += static_cast<double>(model::activation_floats(m, L.micro_batch, rc)) * 4 +
                       2 * buf(N, 4);  // arena; tokens, targets
    const MoEBytes moe = moe_layer_bytes(m, static_cast<int64_t>(N), L.ep, L.capacity_factor,
                                         prec.act_dtype(model::LayerClass::ffn) != Dtype::float32);
    const int      n_moe = n_moe_layers(m);
    mem.activations += n_moe * moe.activations;
    if (rc != Recompute::none && n_moe > 1) mem.activations -= (n_moe - 1) * moe.layer_buffers;
    // collectives of the forward: one more for each MoE layer backward runs again
    const double n_fwd = n_moe + model::recomputed(m, rc).moe_layers;
    mem.comm_buffers += n_moe * moe.comm_buffers;
    // train/checkpointing.cpp: the snapshot of this rank's pieces (masters, m, v), copied by the
    // step loop and written by the I/O helper; the pieces cover each space's shard (ParO) or an
    // even split of it (replicated)
    if (cfg.checkpoint.every > 0) {
        mem.checkpoint = 3 * 4 * static_cast<double>(dist::paro::state_piece_floats(
                                lay, prec, L.opt_shards > 1, L.ranks, L.edp(), L.bucket_floats));
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
        // SWIPE gates exchange counts of their own (below).
        add("moe routing statistics", dist::CommKind::allreduce, "world", L.ranks, n_fwd * A,
            (5 * E + 3) * 8 * n_fwd * A);
    }
    // the same as add, for a unit of gradient reduction or the hops of one of our collectives
    auto add_flagged = [&](std::string what, dist::CommKind kind, std::string group, int size,
                           double calls, double bytes, bool reduction, bool hops) {
        if (calls > 0) {
            f.collectives.push_back(
                {std::move(what), kind, std::move(group), size, calls, bytes, reduction, hops});
        }
    };
    const model::PrecisionPolicy& pol  = L.policy;
    const int                     Pi   = L.ranks;

    // data/loader.cpp DataLoader::next: in a reader group of more than one rank, every
    // micro-batch is scattered from the reader, MB windows of T + 1 int32 to each member
    // (counted on every member). Mean over ranks: only members of such groups scatter.
    if (cfg.data.readers > 0 && Pi > 1) {
        double members = 0;
        int    largest = 1;
        for (int r = 0; r < Pi;) {
            const data::ReaderGroup g = data::reader_group(r, Pi, cfg.data.readers);
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
        // TokenDispatcher::dispatch_preprocess: per-expert counts; then MoELayer's dispatch in
        // forward and in backward with GEMM-dtype payloads (half from FFN level O1), combine in
        // both with activation-dtype payloads (half from O2): N*K rows of C values each, the
        // mean over ranks (slots dropped by a capacity gate are not sent: an upper bound there)
        // counts: each peer gets its El experts' counts, E int64 sent per rank in all
        // (a recomputed layer moves its tokens forward once more: n_fwd - n_moe extra calls)
        add("moe expert counts", dist::CommKind::alltoallv, "ep", L.ep, n_fwd * A, E * 8 * n_fwd * A);
        const double rows = N * K * C * (n_moe + n_fwd) / 2 * A;
        const Dtype  gd = pol.gemm_dtype(model::LayerClass::ffn), ad = pol.act_dtype(model::LayerClass::ffn);
        add(fmt::format("moe dispatch all-to-all ({})", dtype_name(gd)), dist::CommKind::alltoallv,
            "ep", L.ep, (n_moe + n_fwd) * A, 2 * rows * elem_bytes(gd));
        add(fmt::format("moe combine all-to-all ({})", dtype_name(ad)), dist::CommKind::alltoallv,
            "ep", L.ep, (n_moe + n_fwd) * A, 2 * rows * elem_bytes(ad));
    }
    if (Pi > 1) {
        // train/trainer.cpp: the step's loss and the count of ranks still writing a checkpoint
        add("loss", dist::CommKind::allreduce, "world", Pi, 1, 16);
    }
    if (Pi > 1 && L.opt_shards <= 1) {
        // dist/paro/replicated_adamw.cpp: one allreduce per run of dense tensors (n_moe + 1
        // runs) over the world, one per run of expert tensors over the expert-data-parallel
        // group; global_grad_norm adds the expert squares over the EP group
        const double dense = static_cast<double>(ls.dense_floats) * 4,
                     expert = static_cast<double>(ls.expert_floats) * 4;
        add_flagged("gradient all-reduce (dense)", dist::CommKind::allreduce, "world", Pi, n_moe + 1,
                    dense, true, false);
        if (L.edp() > 1 && n_moe > 0) {
            add_flagged("gradient all-reduce (experts)", dist::CommKind::allreduce, "edp", L.edp(),
                        n_moe, expert, true, false);
        }
        if (L.ep > 1) add("gradient norm (experts)", dist::CommKind::allreduce, "ep", L.ep, 1, 8);
    } else if (Pi > 1) {
        // PartitionedAdamW: per space split over more than one rank, one reduce-scatter (float32
        // gradients) per bucket, then the norm's allreduce over the world, then one all-gather
        // per bucket (the space's storage dtype: half-stored tensors travel as half values).
        // Our collectives run on Comm::sendrecv: their hops are counted under sendrecv too.
        const ParoSpaces sp       = paro_spaces(m, L.ep, pol);
        const char*      names[4] = {"dense", "experts", "dense", "experts"};
        struct Space {
            int    groups;
            double nb, q;
            Dtype  dtype;
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
            return i >= 2 || sp.any_half ? fmt::format("{} ({}, {} tensors)", what, names[i], dtype_name(d))
                                         : fmt::format("{} ({})", what, names[i]);
        };
        auto own = [&](const std::string& what, dist::CommKind kind, int i, const Space& s,
                       double elem, bool reduction) {
            const double bucket = s.groups * s.q * elem;  // bytes of one call's whole array
            const char*  group  = i % 2 == 1 ? "edp" : "world";
            add_flagged(what, kind, group, s.groups, s.nb, s.nb * bucket, reduction, false);
            const dist::CollAlgo algo = dist::resolve_algo(dist::CollAlgo::automatic, s.groups,
                                                           static_cast<size_t>(bucket));
            add_flagged(what + " hops", dist::CommKind::sendrecv, group, s.groups,
                        s.nb * dist::sendrecv_hops(algo, s.groups),
                        s.nb * (s.groups - 1) * s.q * elem, false, true);
        };
        for (const auto& [i, s] : spaces) {
            own(label("gradient reduce-scatter", i, s.dtype), dist::CommKind::reduce_scatter, i, s, 4, true);
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
    L.policy        = policy;
    // train/trainer.cpp: a helper thread reduces during backward when P > 1 (and MPI provides
    // MPI_THREAD_MULTIPLE, assumed here)
    L.overlap = cfg.parallel.overlap_grad_reduce && ranks > 1;
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

}  // namespace bagualu::plan

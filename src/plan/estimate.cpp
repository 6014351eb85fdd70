// The time model of estimate.h. Byte counts of the memory-bound kernels follow kernels/ops.cpp
// (fp32 reads and writes of each pass); docs/scale.md lists them.
#include "plan/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "dist/comm/collectives.h"
#include "model/gpt.h"
#include "model/precision.h"

namespace bagualu::plan {

double gemm_efficiency(const NodeSpec& node, double M, double N, double K, bool half) {
    const double s = 3.0 / (1.0 / M + 1.0 / N + 1.0 / K);
    const auto& xs = node.gemm_sizes;
    const auto& ys = half && !node.half_gemm_efficiency.empty() ? node.half_gemm_efficiency
                                                                : node.gemm_efficiency;
    if (s <= xs.front()) return ys.front();
    if (s >= xs.back()) return ys.back();
    size_t i = 1;
    while (xs[i] < s) ++i;
    const double u =
        (std::log2(s) - std::log2(xs[i - 1])) / (std::log2(xs[i]) - std::log2(xs[i - 1]));
    return ys[i - 1] + u * (ys[i] - ys[i - 1]);
}

namespace {

struct Level {
    double alpha;  // s per message
    double beta;   // bytes/s per rank
};

// The slowest level a group of p consecutive ranks spans, R ranks per node.
Level group_level(const MachineSpec& m, int p, int R) {
    const NetworkSpec& n = m.network;
    if (p <= R) return {n.intra_node_latency_us * 1e-6, n.intra_node_bandwidth_gbs * 1e9};
    const int nodes = (p + R - 1) / R;
    if (nodes <= n.nodes_per_supernode) {
        return {n.latency_us * 1e-6, n.injection_bandwidth_gbs * 1e9 / R};
    }
    return {n.supernode_latency_us * 1e-6,
            n.injection_bandwidth_gbs * 1e9 / (R * n.oversubscription)};
}

double log2_ceil(int p) { return std::ceil(std::log2(std::max(1, p))); }

double transfer_seconds(const MachineSpec& m, dist::CommKind kind, int p, int R, double bytes,
                        dist::CollAlgo algo, int stride);
double own_collective_seconds(Level lv, int p, double bytes, bool all_gather, dist::CollAlgo algo);

}  // namespace

double collective_seconds(const MachineSpec& m, dist::CommKind kind, int p, int R, double bytes,
                          dist::CollAlgo algo, int stride) {
    if (p <= 1) return 0;
    // every blocking call pays the machine's synchronisation cost, then its alpha-beta time
    return m.network.sync_us * 1e-6 + transfer_seconds(m, kind, p, R, bytes, algo, stride);
}

namespace {

double transfer_seconds(const MachineSpec& m, dist::CommKind kind, int p, int R, double bytes,
                        dist::CollAlgo algo, int stride) {
    // the slowest level of the ranks the group spans (a grid column spans its rows)
    Level lv          = group_level(m, (p - 1) * stride + 1, R);
    const Level intra = group_level(m, 1, R);
    const double P    = p;
    switch (kind) {
        case dist::CommKind::allreduce: {
            if (p <= R && m.network.intra_node_reduce_gbs > 0)
                lv.beta = m.network.intra_node_reduce_gbs * 1e9;
            const double doubling = log2_ceil(p) * (lv.alpha + bytes / lv.beta);
            const double ring     = 2 * (P - 1) * lv.alpha + 2 * (P - 1) / P * bytes / lv.beta;
            return std::min(doubling, ring);
        }
        case dist::CommKind::alltoallv:
        case dist::CommKind::alltoall: {
            // payload to ranks of the same node goes through shared memory, the rest through
            // the slowest level; the block to itself is a local copy
            const double local = std::clamp(static_cast<double>(R / stride), 1.0, P);
            return (P - 1) * lv.alpha +
                   bytes * ((local - 1) / P / intra.beta + (P - local) / P / lv.beta);
        }
        case dist::CommKind::allgather:
        case dist::CommKind::scatter:  // bytes per rank: the root sends P - 1 blocks
            return log2_ceil(p) * lv.alpha + (P - 1) * bytes / lv.beta;
        case dist::CommKind::reduce_scatter:
        case dist::CommKind::all_gather:
            return own_collective_seconds(lv, p, bytes, kind == dist::CommKind::all_gather, algo);
        case dist::CommKind::reduce_scatter_native:
            return (P - 1) * (lv.alpha + bytes / P / lv.beta);
        case dist::CommKind::broadcast:
            return log2_ceil(p) * (lv.alpha + bytes / lv.beta);
        case dist::CommKind::sendrecv:
            return lv.alpha + bytes / lv.beta;
    }
    return 0;
}

// Our reduce-scatter / all-gather of a whole array of `bytes` over p ranks at level lv
// (dist/comm/collectives.cpp): halving/doubling or the ring, as resolve_algo picks; the busiest
// rank's hops and bytes (dist::coll_traffic).
double own_collective_seconds(Level lv, int p, double bytes, bool all_gather, dist::CollAlgo algo) {
    if (p <= 1) return 0;
    const dist::CollAlgo a    = dist::resolve_algo(algo, p, static_cast<size_t>(bytes));
    const dist::CollTraffic t = dist::coll_traffic(a, p, bytes, all_gather);
    return t.hops * lv.alpha + t.busiest_bytes / lv.beta;
}

// One call of c (a reduce-scatter or all-gather over a group spanning c.nodes > 1 nodes):
// two-level, inside the node over the whole array and then across nodes over 1/per_node of
// it (every rank of a node sends across at once: the injection bandwidth shared by R); or one
// level, the direct exchange (reduce-scatter) or the ring / halving over the whole group.
double over_nodes_seconds(const MachineSpec& m, const Collective& c, int R, double bytes) {
    const double sync = m.network.sync_us * 1e-6;
    const bool gather = c.kind == dist::CommKind::all_gather;
    // the slowest level of the ranks that n of the group's members span
    auto level = [&](int n) { return group_level(m, (n - 1) * c.stride + 1, R); };
    if (c.two_level) {
        return sync +
               own_collective_seconds(level(c.per_node), c.per_node, bytes, gather, c.coll_algo) +
               own_collective_seconds(level(c.group_size), c.nodes, bytes / c.per_node, gather,
                                      c.coll_algo);
    }
    const Level lv = level(c.group_size);
    if (c.kind == dist::CommKind::reduce_scatter) {
        const double P = c.group_size;
        return sync + (P - 1) * (lv.alpha + bytes / P / lv.beta);
    }
    return sync + own_collective_seconds(lv, c.group_size, bytes, gather, c.coll_algo);
}

}  // namespace

Estimate estimate(const Footprint& fp, const TrainConfig& cfg, const MachineSpec& mach,
                  const EstimateOptions& opt) {
    Estimate e;
    e.fp                               = fp;
    const Layout& L                    = fp.layout;
    const ModelConfig& m               = cfg.model;
    const NodeSpec& nd                 = mach.node;
    const model::PrecisionPolicy& prec = L.policy;  // [precision], set by make_layout
    // the fraction of peak is against the peak of the run's precision
    const bool half        = prec.mixed() && nd.peak_half_gflops > 0;
    const double node_peak = (half ? nd.peak_half_gflops : nd.peak_fp32_gflops) * 1e9;
    // cores this rank gets: its threads, or its share when ranks x threads oversubscribe the node
    const double cores =
        std::min<double>(L.threads, static_cast<double>(nd.cores) / L.ranks_per_node);
    const double peak_rank = nd.peak_fp32_gflops * 1e9 * cores / nd.cores;
    const double core_bw   = nd.memory_bandwidth_core_gbs > 0 ? nd.memory_bandwidth_core_gbs
                                                              : nd.memory_bandwidth_gbs / nd.cores;
    const double bw_rank =
        std::min(nd.memory_bandwidth_gbs / L.ranks_per_node, cores * core_bw) * 1e9;

    const double MB = static_cast<double>(L.micro_batch), T = m.seq_len, N = MB * T, C = m.d_model,
                 F = m.d_ff, FE = m.expert_width(), V = m.vocab_size, E = m.n_experts, K = m.top_k,
                 A = static_cast<double>(L.accum), El = E / L.ep;
    const double n = static_cast<double>(fp.rank_floats);

    std::map<std::string, double> compute, memory;  // seconds per step by group
    // Mixed precision (model/precision.h): the classes at O1 and above run their dense products
    // through gemm_bf16 at the machine's half-precision peak (fp16 products run in float32 on
    // rounded operands); the experts' grouped products too, weight gradients included
    // (moe/experts.cpp).
    // A product's rate: the peak of the arithmetic it runs on and the efficiency curve
    // calibrated against that peak (the bf16 products' own, where the machine file has one).
    struct Rate {
        double peak;
        bool half;
        double seconds(const NodeSpec& node, double M, double Nn, double Kk) const {
            return 2 * M * Nn * Kk / (peak * gemm_efficiency(node, M, Nn, Kk, half));
        }
    };
    const double half_peak_rank =
        nd.peak_half_gflops > 0 ? nd.peak_half_gflops * 1e9 * cores / nd.cores : 0;
    const Rate fp32_rate{peak_rank, false};
    auto rate_of = [&](Dtype d) {
        return d == Dtype::bfloat16 && half_peak_rank > 0 ? Rate{half_peak_rank, true} : fp32_rate;
    };
    auto rate_of_class = [&](model::LayerClass c) { return rate_of(prec.gemm_dtype(c)); };
    // a linear layer (rows, out, in): its forward, dinp and dweight products at `rate`
    auto linear = [&](const char* group, double rows, double out, double in, double count,
                      Rate rate) {
        if (rows <= 0) return;
        compute[group] += count * A *
                          (rate.seconds(nd, rows, out, in) + rate.seconds(nd, rows, in, out) +
                           rate.seconds(nd, out, in, rows));
    };
    auto bytes = [&](const char* group, double b) { memory[group] += b / bw_rank; };

    int n_moe = 0;
    for (int l = 0; l < m.n_layer; ++l) n_moe += m.is_moe_block(l) ? 1 : 0;
    const int n_dense = m.n_layer - n_moe;
    const Rate pa     = rate_of_class(model::LayerClass::attention),
               pf     = rate_of_class(model::LayerClass::ffn);
    // the router: float32 products, or bf16 ones under precision.router = "half"
    const Rate gate_rate = rate_of(prec.router_dtype());
    linear("gemm: attention projections", N, 3 * C, C, m.n_layer, pa);
    linear("gemm: attention projections", N, C, C, m.n_layer, pa);
    linear("gemm: dense MLP", N, F, C, n_dense, pf);
    linear("gemm: dense MLP", N, C, F, n_dense, pf);
    if (n_moe > 0) {
        const double rows = N * K / El;  // per local expert, balanced load
        linear("gemm: MoE gate", N, m.gate_rows(), C, n_moe, gate_rate);
        linear("gemm: experts", rows, FE, C, n_moe * El, pf);
        linear("gemm: experts", rows, C, FE, n_moe * El, pf);
        if (fp.moe_rounds > 1) {
            // several rounds: backward recomputes the experts' forward products
            // (moe/moe_layer.cpp); the balanced load is N K rows per rank
            for (const auto& [out, in] : {std::pair{FE, C}, std::pair{C, FE}}) {
                compute["gemm: experts (recompute)"] +=
                    n_moe * El * A * pf.seconds(nd, rows, out, in);
            }
        }
        // shared experts: every token, grouped products like the routed ones
        const double S = m.n_shared_experts, FS = m.shared_width();
        if (S > 0) {
            linear("gemm: shared experts", N, FS, C, n_moe * S, pf);
            linear("gemm: shared experts", N, C, FS, n_moe * S, pf);
        }
    }
    linear("gemm: LM head", N, V, C, 1, rate_of_class(model::LayerClass::head));
    // the attention kernel (scores, softmax, weighted sum) computes in float32
    compute["attention"] = A * m.n_layer * 6 * N * T * C / (peak_rank * nd.attention_efficiency);
    // train.recompute (model/gpt.h): backward runs the forward of some blocks or MoE layers
    // again: their forward products and attention once more
    const model::Recomputed rc = model::recomputed(m, cfg.train.recompute);
    auto forward_again         = [&](double rows, double out, double in, double count, Rate rate) {
        if (rows <= 0 || count <= 0) return;
        compute["recompute (forward again)"] += count * A * rate.seconds(nd, rows, out, in);
    };
    forward_again(N, 3 * C, C, rc.blocks, pa);
    forward_again(N, C, C, rc.blocks, pa);
    forward_again(N, F, C, rc.dense_mlps, pf);
    forward_again(N, C, F, rc.dense_mlps, pf);
    if (n_moe > 0) {
        const double rows = N * K / El;
        forward_again(N, m.gate_rows(), C, rc.moe_layers, gate_rate);
        // the experts' products again in their class's precision, as in the first forward
        forward_again(rows, FE, C, rc.moe_layers * El, pf);
        forward_again(rows, C, FE, rc.moe_layers * El, pf);
        const double S = m.n_shared_experts, FS = m.shared_width();  // shared experts
        forward_again(N, FS, C, rc.moe_layers * S, pf);
        forward_again(N, C, FS, rc.moe_layers * S, pf);
    }
    if (rc.blocks > 0) {
        compute["recompute (forward again)"] +=
            A * rc.blocks * 2 * N * T * C / (peak_rank * nd.attention_efficiency);
    }

    // memory-bound kernels, bytes per micro-batch
    const double NC = N * C;
    bytes("layernorm + residual",
          A * (m.n_layer * 2 * (8 + 16 + 12) * NC + (8 + 16) * NC + 4 * NC));
    bytes("embedding", A * 24 * NC);
    // forward 8 bytes an element, backward 12 and 8 more for the GELU it computes again: dense
    // blocks, shared experts (every token) and the routed experts (N K rows at the balanced load)
    bytes("gelu",
          A * (n_dense * 28 * N * F + n_moe * m.n_shared_experts * 28 * N * m.shared_width() +
               n_moe * 28 * N * K * FE));
    bytes("softmax + cross-entropy", A * 16 * N * V);
    if (n_moe > 0) {
        const double NKC = N * K * C;
        bytes("moe permute/unpermute", A * n_moe * (40 * NKC + 16 * NC + 24 * N * E));
        if (m.product_keys > 0) {
            // moe/gate.h: the logits written from the keys (forward, again when recomputed),
            // dlogits read into the keys' gradient (backward)
            const double NG = N * m.gate_rows();
            bytes("moe gate keys", A * (n_moe + rc.moe_layers) * (4 * N * E + 4 * NG) +
                                       A * n_moe * (4 * N * E + 4 * NG));
        }
        if (L.ep > 1) bytes("moe permute/unpermute", A * n_moe * 4 * 8 * NKC);
    }
    if (prec.mixed()) {
        // model/gpt.cpp, moe/experts.cpp: every half-precision tensor is rounded in place (read
        // and write, 8 bytes an element), the half-stored weights again before each forward
        // (in place) and the O1 ones into their compute copies (fp.rounded_floats), and
        // gemm_bf16's operands are converted to 16 bits (4 read + 2 written bytes an element:
        // input and weight forward; output gradient, weight and input backward; an upper bound
        // on a CPU without 16-bit arithmetic, which skips them)
        using model::LayerClass;
        auto r = [&](LayerClass c, bool act) {
            return (act ? prec.act_dtype(c) : prec.gemm_dtype(c)) != Dtype::float32 ? 8.0 : 0.0;
        };
        const double nl = m.n_layer, NF = N * F, RK = N * K;
        double b = 8 * static_cast<double>(fp.rounded_floats) +
                   (prec.gemm_dtype(LayerClass::head) != Dtype::float32 ? 8 * V * C : 0);
        b += NC * r(LayerClass::embedding, true);
        b += nl *
             (NC * r(LayerClass::attention, false) * 3 + 4 * NC * r(LayerClass::attention, true) +
              3 * NC * r(LayerClass::attention, false) + NC * r(LayerClass::ffn, false));
        b += n_dense * (NF * (2 * r(LayerClass::ffn, true) + 2 * r(LayerClass::ffn, false)) +
                        NC * (r(LayerClass::ffn, true) + r(LayerClass::ffn, false)));
        b += n_moe * (RK * FE * (r(LayerClass::ffn, true) + 2 * r(LayerClass::ffn, false)) +
                      RK * C * (2 * r(LayerClass::ffn, true) + 2 * r(LayerClass::ffn, false)));
        b += NC * r(LayerClass::head, false) +
             N * V * (r(LayerClass::head, true) + r(LayerClass::head, false));
        auto conv = [&](LayerClass c, double in, double out, double count) {
            if (prec.gemm_dtype(c) == Dtype::bfloat16)
                b += count * 6 * (2 * N * in + 2 * in * out + N * out);
        };
        conv(LayerClass::attention, C, 3 * C, nl);
        conv(LayerClass::attention, C, C, nl);
        conv(LayerClass::ffn, C, F, n_dense);
        conv(LayerClass::ffn, F, C, n_dense);
        conv(LayerClass::head, C, V, 1);
        if (n_moe > 0 && prec.gemm_dtype(LayerClass::ffn) == Dtype::bfloat16) {
            // kernels::grouped_gemm_half: the rows and the local experts' weights of the four
            // products of activations and weights (forward x and g, backward dy and dh), and
            // grouped_gemm_tn_half: both row operands of the two weight gradients (dy and g, dh
            // and x); the routed experts' at the balanced load and the shared experts'
            const double S = m.n_shared_experts, FS = m.shared_width();
            b += n_moe * 6 *
                 (4 * RK * (C + FE) + 4 * El * FE * C + S * (4 * N * (C + FS) + 4 * FS * C));
        }
        if (n_moe > 0 && prec.router_dtype() != Dtype::float32) {
            // moe/router.cpp under precision.router = "half": bf16 converts the input and the
            // weight forward and backward (again in a recomputed forward) and the logits'
            // gradient to 16 bits, as for the dense products; fp16 (float products) rounds them
            // into copies, the logits' gradient in place
            const double CE = C * m.gate_rows(), NE = N * m.gate_rows();
            const double per = prec.router_dtype() == Dtype::bfloat16 ? 6 : 8;
            b += per * ((n_moe * 2 + rc.moe_layers) * (NC + CE) + n_moe * NE);
        }
        bytes("precision casts", A * b);
    }
    // per step: zero grads and the gradient scale after the all-reduce over every local float;
    // then on this rank's shard (dense over opt_shards, experts over opt_shards_expert) the
    // norm (g read) and AdamW with the clip folded in (p, g, m, v read, p, m, v written): 32
    // bytes a float, at memory speed or at the calibrated per-float cost of those passes on the
    // rank's cores, whichever is slower
    const double ne    = static_cast<double>(fp.expert_floats);
    const double shard = (n - ne) / L.opt_shards + ne / L.opt_shards_expert;
    bytes("optimizer + gradient passes", n * (4 + (L.ranks > 1 ? 8 : 0)));
    memory["optimizer + gradient passes"] +=
        std::max(32 * shard / bw_rank, shard * nd.optimizer_ns_per_float * 1e-9 / cores);

    for (const auto& [k, v] : compute) {
        e.compute.push_back({k, v});
        e.t_compute += v;
    }
    for (const auto& [k, v] : memory) {
        e.compute.push_back({k, v});
        e.t_memory += v;
    }
    // t_reduce: the units of gradient reduction; t_last: one call of the dense reduction over
    // the world, the unit holding the embeddings, which is ready only when backward ends
    double t_reduce = 0, t_last = 0;
    for (const Collective& c : fp.collectives) {
        // hops are the sendrecv calls of a reduce-scatter / all-gather timed on its own entry
        // a hierarchical all-to-all's leaders' exchange: per_node ranks wait for each leader's
        // call, one rank per node (the leader uses the node's injection bandwidth alone)
        const double t =
            c.hops      ? 0
            : c.leaders ? c.calls * c.per_node *
                              collective_seconds(mach, c.kind, c.group_size, 1, c.bytes / c.calls,
                                                 dist::CollAlgo::automatic, c.stride)
            : c.nodes > 1
                ? c.calls * over_nodes_seconds(mach, c, L.ranks_per_node, c.bytes / c.calls)
                : c.calls * collective_seconds(mach, c.kind, c.group_size, L.ranks_per_node,
                                               c.bytes / c.calls, c.coll_algo, c.stride);
        e.comm.push_back({c.what, t});
        e.t_comm += t;
        if (c.reduction) {
            t_reduce += t;
            if (c.group == "world" && t_last == 0) t_last = t / c.calls;
        }
    }
    // The experts' exchanges on the all-to-all helper (docs/parallelism.md). With c pieces, while
    // the experts compute piece i the helper moves piece i+1's dispatch and piece i-1's combine:
    // a two-stage pipeline of c equal pieces hides (c-1)/c of min(exchanges, products) in each
    // forward (a third of the products) and backward (two thirds). Beside the shared experts:
    // min(dispatch, their products) of the forward, and of the backward with one shared expert.
    // The helper needs MPI_THREAD_MULTIPLE (assumed, as for the gradient reduction).
    double disp = 0, comb = 0;
    for (size_t i = 0; i < fp.collectives.size(); ++i) {
        const std::string& w = fp.collectives[i].what;
        if (w.rfind("moe dispatch all-to-all", 0) == 0) disp += e.comm[i].seconds;
        if (w.rfind("moe combine all-to-all", 0) == 0) comb += e.comm[i].seconds;
    }
    const double fs = fp.a2a_forward_share;
    if (fp.a2a_pieces > 1) {
        const double x = compute["gemm: experts"], c = fp.a2a_pieces, a = disp + comb;
        e.t_a2a_hidden =
            (c - 1) / c * (std::min(fs * a, x / 3) + std::min((1 - fs) * a, 2 * x / 3));
    } else if (fp.shared_beside) {
        const double s = compute["gemm: shared experts"];
        e.t_a2a_hidden = std::min(fs * disp, s / 3) +
                         (m.n_shared_experts == 1 ? std::min((1 - fs) * disp, 2 * s / 3) : 0);
    }
    // the last micro-batch's backward: 2/3 of its GEMM and attention time
    const double t_backward = 2.0 / 3.0 * e.t_compute / A;
    if (opt.comm_overlap >= 0) {
        e.t_overlap = opt.comm_overlap * std::min(t_reduce, t_backward);
    } else if (L.overlap) {
        e.t_overlap = std::max(0.0, std::min(t_reduce - t_last, t_backward));
    }
    e.t_step = e.t_compute + e.t_memory + e.t_comm - e.t_overlap - e.t_a2a_hidden;

    e.tokens_per_s     = fp.tokens_per_step / e.t_step;
    e.sustained_flops  = fp.model_flops_per_step / e.t_step;
    e.peak_flops       = node_peak * L.ranks / L.ranks_per_node;
    e.fraction_of_peak = e.sustained_flops / e.peak_flops;

    e.node_memory_bytes = fp.memory.total() * L.ranks_per_node;
    e.node_capacity     = nd.memory_gib * 1073741824.0;
    e.fits              = e.node_memory_bytes <= e.node_capacity;

    // bottleneck: the largest single term
    double worst = -1;
    for (const auto& terms : {e.compute, e.comm}) {
        for (const Term& t : terms) {
            if (t.seconds > worst) {
                worst        = t.seconds;
                e.bottleneck = t.name;
            }
        }
    }
    return e;
}

}  // namespace bagualu::plan

// The planner's exact counts: analytic layout sizes against make_layout, memory against what
// GPT really allocates (malloc statistics), FLOPs against GPT::flops_per_token, collective bytes
// against a hand count, and machine files (good, bad, round trip).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "../../common/fresh_threads.h"
#include "../../common/run_command.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/comm/collectives.h"
#include "dist/paro/grad_sync.h"
#include "dist/paro/shard_map.h"
#include "dist/paro/spaces.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "model/gpt.h"
#include "model/precision.h"
#include "plan/estimate.h"

namespace bagualu::plan {
namespace {

TrainConfig small_config(int moe_every, int E = 4) {
    TrainConfig c;
    c.model.vocab_size       = 97;
    c.model.d_model          = 24;
    c.model.n_layer          = 3;
    c.model.n_head           = 2;
    c.model.seq_len          = 10;
    c.model.d_ff             = 40;
    c.model.n_experts        = E;
    c.model.top_k            = 2;
    c.model.moe_every        = moe_every;
    c.train.batch_size       = 8;
    c.train.micro_batch_size = 2;
    return c;
}

// A machine of 4 cores at 100 GFLOP/s in float32 (peak_half in 16 bits, 0: as float32), 1 GiB
// at 10 GB/s.
MachineSpec small_machine(double peak_half = 0) {
    MachineSpec m;
    m.node.peak_fp32_gflops     = 100;
    m.node.peak_half_gflops     = peak_half;
    m.node.memory_gib           = 1;
    m.node.memory_bandwidth_gbs = 10;
    m.node.cores                = 4;
    return m;
}

// The layout the planner derives from c on P ranks of one node with expert parallelism ep.
// 4 ranks, 4 per node, c's own expert parallelism.
Layout layout_4x4(const TrainConfig& c) {
    return make_layout(c, model::PrecisionPolicy::from_config(c.precision), 4, 4, 1);
}

Layout layout_of(const TrainConfig& c, int P, int ep) {
    TrainConfig with_ep              = c;
    with_ep.parallel.expert_parallel = ep;
    return make_layout(with_ep, model::PrecisionPolicy::from_config(with_ep.precision), P, P, 1);
}

TEST(PlanLayout, AnalyticSizesMatchMakeLayout) {
    for (int moe_every : {0, 1, 2, 3}) {
        for (int ep : {1, 2, 4}) {
            const TrainConfig c        = small_config(moe_every);
            const model::LayoutSize s  = model::layout_size(c.model, ep);
            const model::ParamLayout L = model::make_layout(c.model, ep, ep - 1);
            EXPECT_EQ(s.rank_floats(), L.total_floats()) << moe_every << " " << ep;
            EXPECT_EQ(s.full_params, model::make_layout(c.model).num_params());
            uint64_t expert = 0;
            for (const dist::paro::Segment& g : dist::paro::make_segments(L)) {
                if (g.expert) expert += g.end - g.begin;
            }
            EXPECT_EQ(s.expert_floats, expert);
        }
    }
}

TEST(PlanLayout, ParamKindsExpandToMakeLayout) {
    for (const GateKind gate : {GateKind::topk, GateKind::noisy}) {
        for (int moe_every : {0, 1, 2}) {
            for (int ep : {1, 2, 4}) {
                TrainConfig c              = small_config(moe_every);
                c.model.gate               = gate;
                const model::ParamLayout L = model::make_layout(c.model, ep, 0);
                size_t i                   = 0;
                model::for_each_param_kind(c.model, ep,
                                           [&](const model::ParamSpec& s, uint64_t count) {
                                               ASSERT_LE(i + count, L.specs().size()) << s.name;
                                               EXPECT_EQ(L.spec(i).name, s.name);
                                               for (uint64_t j = 0; j < count; ++j) {
                                                   const model::ParamSpec& r = L.spec(i + j);
                                                   EXPECT_EQ(r.shape, s.shape) << r.name;
                                                   EXPECT_EQ(r.numel, s.numel) << r.name;
                                                   EXPECT_EQ(r.decay, s.decay) << r.name;
                                                   EXPECT_EQ(r.expert, s.expert) << r.name;
                                               }
                                               i += count;
                                           });
                EXPECT_EQ(i, L.specs().size()) << name_of(gate) << " " << moe_every << " " << ep;
                EXPECT_EQ(model::layout_size(c.model, ep).rank_floats(), L.total_floats());
            }
        }
    }
}

TEST(PlanFlops, MatchGpt) {
    for (int moe_every : {0, 2}) {
        const TrainConfig c = small_config(moe_every);
        const model::GPT gpt(c.model, 2);
        const Footprint f = footprint(c, layout_of(c, 1, 1), 0, 0);
        EXPECT_DOUBLE_EQ(f.model_flops_per_step,
                         3 * gpt.flops_per_token(c.model.seq_len) * 8 * c.model.seq_len);
    }
}

// Bytes the allocator hands out (heap + mmap'd chunks).
double allocated_bytes() {
    const struct mallinfo2 mi = mallinfo2();
    return static_cast<double>(mi.uordblks + mi.hblkhd);
}

TEST(PlanMemory, MatchesGptAllocations) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "counts bytes with glibc's mallinfo2, which a sanitizer's allocator bypasses";
#endif
    // fp16 with the BaGuaLu policy adds the rounded weight copies and operand buffer; its GEMMs
    // allocate no 16-bit operand copies; bf16 needs no rounded copy (its products round their
    // float operands themselves) and allocates its 16-bit operand copies on first use, not in
    // the constructor (half_operand_bytes, left out of the prediction here)
    // train.recompute: block's arena holds one block's working set; moe and block share one
    // set of MoE buffers between the layers; moe_every 2 with experts of their own width
    for (const Dtype dtype : {Dtype::float32, Dtype::float16, Dtype::bfloat16}) {
        for (int moe_every : {0, 1, 2, -2}) {
            for (const Recompute rc : {Recompute::none, Recompute::moe, Recompute::block}) {
                if (rc == Recompute::moe && moe_every == 0) continue;  // invalid: no MoE layer
                // -2: every second block MoE with a row budget of a quarter of the balanced load
                // (256 rows, the smallest: rounds, with their extra buffers)
                TrainConfig c     = small_config(std::abs(moe_every), 8);
                c.train.recompute = rc;
                c.model.d_model   = 64;  // large enough that buffers dominate allocator bookkeeping
                c.model.d_ff      = 256;
                c.model.vocab_size = 1000;
                c.model.seq_len    = 64;
                c.precision.dtype  = dtype;
                if (moe_every == 2) c.model.expert_d_ff = 96;  // experts narrower than the MLP
                if (moe_every < 0) {                           // N K = 2 x 256 x 2 rows, budget 256
                    c.model.seq_len         = 256;
                    c.model.moe_rows_budget = 0.25;
                }
                const Footprint f   = footprint(c, layout_of(c, 1, 1), 0, 0);
                const double before = allocated_bytes();
                double during       = 0;
                {
                    model::GPT gpt(c.model, static_cast<int>(c.micro_batch(1)), nullptr, 0,
                                   model::PrecisionPolicy::from_config(c.precision), 0, rc);
                    during = allocated_bytes() - before;
                }
                const Memory& m      = f.memory;
                const double predict = m.parameters + m.gradients + m.activations + m.comm_buffers -
                                       half_operand_bytes(c, layout_of(c, 1, 1));
                EXPECT_NEAR(during, predict, 0.01 * predict + 65536)
                    << dtype_name(dtype) << " moe_every " << moe_every << " recompute "
                    << name_of(rc);
                if (moe_every < 0) {
                    TrainConfig unbounded           = c;
                    unbounded.model.moe_rows_budget = 0;
                    const Memory& u = footprint(unbounded, layout_of(c, 1, 1), 0, 0).memory;
                    EXPECT_LT(predict, u.parameters + u.gradients + u.activations + u.comm_buffers);
                }
            }
        }
    }
}

// Many experts, where the router's (N, E) buffers dominate: the planner's count of what each
// gate keeps per layer and what the layers share (moe::RouterScratch: the choice scores, the
// ranking, the logits' gradients) is what GPT allocates. A (N, E) buffer per layer too many or
// too few is 4 N E bytes = 4% of the total here, against a 1% tolerance.
TEST(PlanMemory, RouterBuffersMatchGptAllocations) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "counts bytes with glibc's mallinfo2, which a sanitizer's allocator bypasses";
#endif
    struct Case {
        moe::GateKind gate;
        double bias;
        int route_nodes;
        RouterScore score = RouterScore::softmax;  // sigmoid: the logits kept per layer
        bool half_router  = false;  // fp16 with precision.router = "half": its rounded operands
        Recompute rc      = Recompute::none;  // moe: one RouterKept for all the layers
        int product_keys  = 0;                // the keys' scratch and a smaller gate weight
    };
    for (const Case g :
         {Case{moe::GateKind::topk, 0.0, 0}, Case{moe::GateKind::topk, 0.01, 2},
          Case{moe::GateKind::topk, 0.0, 0, RouterScore::sigmoid},
          Case{moe::GateKind::swipe, 0.01, 0}, Case{moe::GateKind::noisy, 0.0, 0},
          Case{moe::GateKind::noisy, 0.01, 0},
          Case{moe::GateKind::topk, 0.0, 0, RouterScore::softmax, true},
          Case{moe::GateKind::topk, 0.0, 0, RouterScore::sigmoid, false, Recompute::moe},
          Case{moe::GateKind::noisy, 0.0, 0, RouterScore::softmax, false, Recompute::moe},
          Case{moe::GateKind::topk, 0.0, 0, RouterScore::softmax, true, Recompute::none, 16}}) {
        TrainConfig c              = small_config(1, 256);  // every block MoE, 256 experts
        c.model.d_model            = 32;
        c.model.d_ff               = 16;
        c.model.seq_len            = 64;
        c.model.gate               = g.gate;
        c.model.balance_bias_rate  = g.bias;
        c.model.route_nodes        = g.route_nodes;
        c.model.router_score       = g.score;
        c.model.route_groups       = g.route_nodes > 0 ? 4 : 0;
        c.model.router_z_loss_coef = 0.001;
        c.model.jitter             = 0.01;
        if (g.half_router) {
            c.precision.dtype  = Dtype::float16;
            c.precision.router = RouterPrecision::half;
        }
        c.train.recompute    = g.rc;
        c.model.product_keys = g.product_keys;
        const Footprint f    = footprint(c, layout_of(c, 1, 1), 0, 0);
        // the model's tensor table (names and shapes of 3 x 256 x 4 expert tensors, 0.3 MiB
        // here) is not among the planner's buffers; at scale a rank holds few experts
        double table = allocated_bytes();
        {
            const model::ParamLayout lay = model::make_layout(c.model);
            table                        = allocated_bytes() - table;
        }
        const double before = allocated_bytes();
        double during       = 0;
        {
            model::GPT gpt(c.model, static_cast<int>(c.micro_batch(1)), nullptr, 1,
                           model::PrecisionPolicy::from_config(c.precision), 0, g.rc);
            during = allocated_bytes() - before - table;
        }
        const Memory& m      = f.memory;
        const double predict = m.parameters + m.gradients + m.activations + m.comm_buffers;
        EXPECT_NEAR(during, predict, 0.01 * predict + 65536)
            << name_of(g.gate) << " " << name_of(g.score) << " bias " << g.bias << " route_nodes "
            << g.route_nodes << (g.half_router ? " fp16, half router" : "") << " recompute "
            << name_of(g.rc) << " product_keys " << g.product_keys;
    }
}

// Recompute lowers the activations by what GPT and the MoE layers stop keeping, and costs one
// more forward of the recomputed part (a time term of its own, and the MoE collectives of the
// recomputed layers' forward).
TEST(PlanMemory, RecomputeKeepsLessAndCostsAForward) {
    TrainConfig c              = small_config(1, 8);  // every block MoE
    c.model.n_layer            = 4;
    c.parallel.expert_parallel = 2;
    const MachineSpec mach     = small_machine();
    double act[3], step[3], a2a_calls[3];
    for (const Recompute rc : {Recompute::none, Recompute::moe, Recompute::block}) {
        c.train.recompute = rc;
        const Footprint f = footprint(c, layout_of(c, 2, 2), 0, 0);
        const Estimate e  = estimate(f, c, mach);
        const size_t i    = static_cast<size_t>(rc);
        act[i]            = f.memory.activations;
        step[i]           = e.t_step;
        a2a_calls[i] =
            static_cast<double>(per_kind(f.collectives)[dist::CommKind::alltoallv].calls);
        bool has_term = false;
        for (const Term& t : e.compute)
            has_term = has_term || t.name == "recompute (forward again)";
        EXPECT_EQ(has_term, rc != Recompute::none) << name_of(rc);
    }
    const MoEBytes moe = moe_layer_bytes(c.model, c.micro_batch(2) * c.model.seq_len, 2);
    EXPECT_DOUBLE_EQ(act[0] - act[1], 3 * moe.layer_buffers);  // 4 layers' buffers -> 1
    EXPECT_LT(act[2], act[1]);                                 // and 4 block working sets -> 1
    EXPECT_GT(step[1], step[0]);
    EXPECT_GT(step[2], step[1]);
    // per micro-batch and MoE layer: counts, dispatch, combine forward + dispatch, combine
    // backward = 5 all-to-all calls; each of the 3 recomputed layers adds counts, dispatch, combine
    EXPECT_DOUBLE_EQ(a2a_calls[1] - a2a_calls[0],
                     3 * 3 * static_cast<double>(c.grad_accum_steps(2)));
    EXPECT_DOUBLE_EQ(a2a_calls[2], a2a_calls[1]);
}

TEST(PlanMemory, CategoriesSumAndScale) {
    const TrainConfig c = small_config(2);
    const Footprint f   = footprint(c, layout_of(c, 2, 2), 1000, 12345);
    const Memory& m     = f.memory;
    EXPECT_DOUBLE_EQ(m.total(), m.baseline + m.parameters + m.gradients + m.optimizer +
                                    m.activations + m.comm_buffers + m.data + m.checkpoint +
                                    m.gemm_packing);
    EXPECT_EQ(m.gemm_packing, 0);  // a layout without caches (no machine file gives them)
    // ParO over 2 ranks (optimizer.partition = "auto"): the optimizer's own shard maps
    const model::ParamLayout lay = model::make_layout(c.model, 2, 0);
    const model::PrecisionPolicy fp32;
    EXPECT_DOUBLE_EQ(
        m.optimizer,
        static_cast<double>(dist::paro::optimizer_footprint(lay, fp32, true, 2, 1).optim_bytes));
    EXPECT_LT(m.optimizer, 2 * m.parameters);
    EXPECT_DOUBLE_EQ(m.baseline, 12345);
    // the order's table (1000 bytes given); the loader's two micro-batches of 2 windows of 11
    // tokens; the trainer's inputs and targets (2 x 10 tokens each, 64-byte rounded); the shards
    // themselves are read a window at a time, nothing of them resident
    EXPECT_DOUBLE_EQ(m.data, 1000 + 2 * 2 * 11 * 4 + 2 * 128);
    EXPECT_EQ(m.checkpoint, 0);
    TrainConfig replicated         = c;
    replicated.optimizer.partition = Partition::off;
    replicated.checkpoint.every    = 5;
    const Memory& r = footprint(replicated, layout_of(replicated, 2, 2), 1000, 12345).memory;
    EXPECT_DOUBLE_EQ(r.optimizer, 2 * r.parameters);
    // the snapshot: master, m and v of rank 0's part of each space, less than a whole copy
    EXPECT_DOUBLE_EQ(r.checkpoint, 12.0 * static_cast<double>(dist::paro::state_piece_floats(
                                              lay, fp32, false, 2, 1)));
    EXPECT_LT(r.checkpoint, 3 * r.parameters);
    MachineSpec mach;
    mach.node.peak_fp32_gflops     = 100;
    mach.node.memory_gib           = 1;
    mach.node.memory_bandwidth_gbs = 10;
    const Estimate e               = estimate(f, c, mach);
    EXPECT_DOUBLE_EQ(e.node_memory_bytes, 2 * m.total());
    EXPECT_TRUE(e.fits);
    EXPECT_GT(e.t_step, 0);
}

// The GEMMs' packing buffers a training step makes the compute threads grow and keep, against
// the planner's count on this machine's caches and GEMM path: never more than counted, and on one
// thread at least half of it (a count that left out a kind of product, the grouped experts'
// blocks or a thread, or that ignored the caches or the shapes, fails one side or the other;
// 1.0 of it on a Zen 5 in float32 and bf16). Dense and MoE (with a shared expert), float32 and
// bf16, on 1 and 2 threads.
TEST(PlanMemory, GemmPackingBoundsWhatTrainingKeeps) {
    // 0: dense; 1: MoE with a shared expert; 2: MoE at small_config's widths, where the grouped
    // products' reservation is the largest
    for (const int variant : {0, 1, 2}) {
        for (const Dtype dtype : {Dtype::float32, Dtype::bfloat16}) {
            for (const int threads : {1, 2}) {
                TrainConfig c     = small_config(variant > 0 ? 1 : 0, 8);
                c.precision.dtype = dtype;
                if (variant < 2) {
                    c.model.d_model    = 128;
                    c.model.n_head     = 4;
                    c.model.d_ff       = 512;
                    c.model.vocab_size = 2000;
                    c.model.seq_len    = 128;
                }
                if (variant == 1) {
                    c.model.n_shared_experts = 1;
                    c.model.shared_d_ff      = 256;
                }
                SCOPED_TRACE(::testing::Message() << "variant " << variant << " "
                                                  << dtype_name(dtype) << " threads " << threads);
                Layout L           = layout_of(c, 1, 1);
                L.threads          = threads;
                L.caches           = kernels::cache_sizes();
                L.gemm_path        = kernels::gemm::active_path();
                L.avx512_bf16      = kernels::cpu_features().avx512_bf16;
                const double count = gemm_packing_bytes(c, L);
                EXPECT_EQ(footprint(c, L, 0, 0).memory.gemm_packing, count);
                const int B = static_cast<int>(c.micro_batch(1));
                const int T = c.model.seq_len;
                const size_t grown =
                    bagualu::testing::packing_growth_on_fresh_threads(threads, [&] {
                        model::GPT gpt(c.model, B, nullptr, 1,
                                       model::PrecisionPolicy::from_config(c.precision));
                        model::init_params(gpt.params(), gpt.layout(), c.model, 7);
                        std::vector<int32_t> x(size_t(B) * T), y(x.size());
                        for (size_t i = 0; i < x.size(); ++i) {
                            x[i] = static_cast<int32_t>(i * 7 % size_t(c.model.vocab_size));
                            y[i] = static_cast<int32_t>(i * 13 % size_t(c.model.vocab_size));
                        }
                        gpt.set_routing_context(moe::RoutingContext{1, 0, true});
                        gpt.forward(x.data(), y.data(), B, T, 1.0f);
                        gpt.zero_grad();
                        gpt.backward(1.0f);
                    });
                EXPECT_LE(static_cast<double>(grown), count);
                // One thread takes every unit; with two, which thread takes the largest
                // products' units varies with the machine's load.
                if (threads == 1) {
                    EXPECT_GE(2.0 * static_cast<double>(grown), count);
                }
            }
        }
    }
    set_compute_threads(0);
}

TEST(PlanComm, BytesByHand) {
    // P = 4, EP = 2: micro-batch 2 x 10 tokens, 2 micro-batches, one MoE layer of 4 experts
    // (block 1 of 3), top-2, C = 24
    TrainConfig c         = small_config(2);
    c.optimizer.partition = Partition::off;  // the replicated optimizer's all-reduces
    const Footprint f     = footprint(c, layout_of(c, 4, 2), 0, 0);
    EXPECT_EQ(f.layout.micro_batch, 2);
    EXPECT_EQ(f.layout.accum, 1);
    const dist::CommTally t   = per_kind(f.collectives);
    const model::LayoutSize s = model::layout_size(c.model, 2);
    const uint64_t N = 2 * 10, K = 2, C = 24, E = 4;
    // all-to-all: dispatch + combine, forward + backward, N K rows of C floats; before them the
    // per-expert counts (int64), each peer's El of them
    EXPECT_EQ(t[dist::CommKind::alltoallv].calls, 4u + 1);
    EXPECT_EQ(t[dist::CommKind::alltoallv].bytes, 4 * N * K * C * 4 + E * 8);
    EXPECT_EQ(f.moe_rounds, 1);
    EXPECT_EQ(t[dist::CommKind::allgather].calls, 0u);
    // routing statistics (5E + 4) x 8 in one call, the dispatcher's largest receipt 8, loss,
    // checkpoint and stop flags 24, dense gradients in 2 runs, expert gradients over
    // EDP = 2 in 1 run, expert gradient norm 8
    EXPECT_EQ(t[dist::CommKind::allreduce].calls, 1u + 1 + 1 + 2 + 1 + 1);
    EXPECT_EQ(t[dist::CommKind::allreduce].bytes,
              (5 * E + 4) * 8 + 8 + 24 + s.dense_floats * 4 + s.expert_floats * 4 + 8);
    // one rank: nothing
    EXPECT_TRUE(footprint(c, layout_of(c, 1, 1), 0, 0).collectives.empty());
}

// parallel.collectives reaches the planner's counts: ParO's hops over P = 3 (one node of 3, so
// one level) are the ring's 2 per call, or halving/doubling's 4 (reduce-scatter: the pair's two
// hand-over halves, one level, the shard back) and 3 (all-gather).
TEST(PlanComm, CollectivesAlgorithmSetsTheHops) {
    TrainConfig c         = small_config(2);
    c.optimizer.partition = Partition::on;
    c.model.moe_every     = 0;  // dense only: the reduce-scatters and all-gathers of one space
    uint64_t hops[3]      = {};
    int i                 = 0;
    for (const Collectives a : {Collectives::ring, Collectives::halving, Collectives::automatic}) {
        c.parallel.collectives  = a;
        const Footprint f       = footprint(c, layout_of(c, 3, 1), 0, 0);
        const dist::CommTally t = per_kind(f.collectives);
        const uint64_t calls    = t[dist::CommKind::reduce_scatter].calls;
        ASSERT_GT(calls, 0u);
        ASSERT_EQ(t[dist::CommKind::all_gather].calls, calls);
        hops[i++] = t[dist::CommKind::sendrecv].calls;
        if (a == Collectives::ring) {
            EXPECT_EQ(hops[0], calls * (2 + 2));
        } else if (a == Collectives::halving) {
            EXPECT_EQ(hops[1], calls * (4 + 3));
        }
    }
    EXPECT_EQ(hops[2], hops[0]);  // automatic: the ring over 3 ranks
}

// ParO's calls and bytes against the trainer's own shard maps: the spaces PartitionedAdamW
// builds (float32 / half-stored x dense / experts), each split over its group in buckets.
TEST(PlanComm, ParoMatchesShardMaps) {
    struct Policy {
        Dtype dtype;
        bool uniform;  // false: the default BaGuaLu levels
        Level level;
    };
    for (const Policy pol :
         {Policy{Dtype::float32, false, Level::O0}, Policy{Dtype::bfloat16, false, Level::O0},
          Policy{Dtype::float16, true, Level::O2}, Policy{Dtype::bfloat16, true, Level::O3}}) {
        for (const auto& [P, ep] :
             {std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 4}}) {
            for (const size_t bucket : {size_t{1} << 20, size_t{1000}}) {
                TrainConfig c     = small_config(2);
                c.precision.dtype = pol.dtype;
                if (pol.uniform) {
                    c.precision.embedding = c.precision.attention = c.precision.ffn =
                        c.precision.head                          = pol.level;
                }
                c.parallel.expert_parallel = ep;
                Layout L =
                    make_layout(c, model::PrecisionPolicy::from_config(c.precision), P, P, 1);
                L.bucket_floats = bucket;
                ASSERT_EQ(L.opt_shards, P);
                ASSERT_EQ(L.opt_shards_expert, P / ep);
                const dist::CommTally t = per_kind(footprint(c, L, 0, 0).collectives);

                const model::ParamLayout layout = model::make_layout(c.model, ep, 0);
                const model::PrecisionPolicy prec =
                    model::PrecisionPolicy::from_config(c.precision);
                std::vector<dist::paro::FlatRun> runs[4];
                bool any_half = false;
                for (const model::ParamSpec& s : layout.specs()) {
                    const bool half  = prec.master_mode(s) != model::MasterMode::none;
                    any_half         = any_half || half;
                    auto& r          = runs[(half ? 2 : 0) + (s.expert ? 1 : 0)];
                    const size_t end = s.offset + (s.numel + 15) / 16 * 16;
                    if (!r.empty() && r.back().end == s.offset) {
                        r.back().end = end;
                    } else {
                        r.push_back({s.offset, end});
                    }
                }
                uint64_t rs_calls = 0, rs_bytes = 0, ag_calls = 0, ag_bytes = 0, hops = 0,
                         hop_bytes = 0;
                for (int sp = 0; sp < (any_half ? 4 : 2); ++sp) {
                    const int G = sp % 2 == 1 ? P / ep : P;
                    if (runs[sp].empty() || G == 1) continue;
                    const dist::paro::ShardMap map(runs[sp], layout, G, 0, bucket);
                    const uint64_t elem = sp >= 2 ? 2 : 4, nb = map.num_buckets(),
                                   n = map.bucket_size();
                    rs_calls += nb;
                    rs_bytes += nb * n * 4;
                    ag_calls += nb;
                    ag_bytes += nb * n * elem;
                    for (const bool gather : {false, true}) {  // float reduce-scatter, all-gather
                        const uint64_t e = gather ? elem : 4;
                        const auto algo  = dist::resolve_algo(dist::CollAlgo::automatic, G, n * e);
                        hops += nb * static_cast<uint64_t>(
                                         dist::coll_traffic(algo, G, double(n * e), gather).hops);
                        hop_bytes += nb * (n - map.piece_size()) * e;
                    }
                }
                const std::string at =
                    fmt::format("{} {} P={} EP={} bucket {}", dtype_name(pol.dtype),
                                pol.uniform ? name_of(pol.level) : "", P, ep, bucket);
                EXPECT_EQ(t[dist::CommKind::reduce_scatter].calls, rs_calls) << at;
                EXPECT_EQ(t[dist::CommKind::reduce_scatter].bytes, rs_bytes) << at;
                EXPECT_EQ(t[dist::CommKind::all_gather].calls, ag_calls) << at;
                EXPECT_EQ(t[dist::CommKind::all_gather].bytes, ag_bytes) << at;
                EXPECT_EQ(t[dist::CommKind::sendrecv].calls, hops) << at;
                EXPECT_EQ(t[dist::CommKind::sendrecv].bytes, hop_bytes) << at;
                if (bucket == 1000) {
                    EXPECT_GT(rs_calls, 4u) << at;  // several buckets per space
                }
                // no all-reduce of gradients under ParO: gate statistics, loss, the norm, and with
                // EP > 1 the dispatcher's largest receipt
                EXPECT_EQ(t[dist::CommKind::allreduce].calls,
                          static_cast<uint64_t>(L.accum) * (ep > 1 ? 2 : 1) + 2)
                    << at;
            }
        }
    }
}

TEST(PlanComm, GateCountsAndReaderScatter) {
    const uint64_t E = 4, K = 2, MB = 2, T = 10;
    {  // SWIPE, EP = 2: K rounds of (E + 1) counts per virtual worker (the per-expert counts
       // of the dispatcher go by all-to-all)
        TrainConfig c              = small_config(2);
        c.model.gate               = GateKind::swipe;
        c.parallel.expert_parallel = 2;
        c.parallel.virtual_workers = 2;
        const dist::CommTally t    = per_kind(footprint(c, layout_4x4(c), 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::allgather].calls, K);
        EXPECT_EQ(t[dist::CommKind::allgather].bytes, K * 2 * (E + 1) * 8);
    }
    {  // switch, EP = 1: the K x E first-choice counts over the world, no all-to-all (P = 4: one
       // micro-batch per step, as for every case here)
        TrainConfig c           = small_config(2);
        c.model.gate            = GateKind::switch_top1;
        c.model.top_k           = 1;
        const dist::CommTally t = per_kind(footprint(c, layout_4x4(c), 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::allgather].calls, 1u);
        EXPECT_EQ(t[dist::CommKind::allgather].bytes, 1 * E * 8);
        EXPECT_EQ(t[dist::CommKind::alltoallv].calls, 0u);
    }
    {  // readers: MB windows of T + 1 tokens per member and micro-batch
        TrainConfig c     = small_config(2);
        c.data.readers    = ReaderCount{1};
        dist::CommTally t = per_kind(footprint(c, layout_4x4(c), 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::scatter].calls, 1u);
        EXPECT_EQ(t[dist::CommKind::scatter].bytes, MB * (T + 1) * 4);
        c.data.readers    = ReaderCount{3};  // groups {0}, {1}, {2, 3}: half the ranks scatter
        const Footprint f = footprint(c, layout_4x4(c), 0, 0);
        bool found        = false;
        for (const Collective& x : f.collectives) {
            if (x.kind != dist::CommKind::scatter) continue;
            found = true;
            EXPECT_DOUBLE_EQ(x.calls, 0.5);
            EXPECT_DOUBLE_EQ(x.bytes, 0.5 * MB * (T + 1) * 4);
        }
        EXPECT_TRUE(found);
        c.data.readers = ReaderCount{4};  // every rank reads for itself
        t              = per_kind(footprint(c, layout_4x4(c), 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::scatter].calls, 0u);
        // auto (the default): on one node every rank reads; on 2 nodes of 2 ranks one reader a
        // node, as data.readers = 2
        c.data.readers = ReaderCount{};
        EXPECT_EQ(layout_4x4(c).readers, 0);
        t = per_kind(footprint(c, layout_4x4(c), 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::scatter].calls, 0u);
        const model::PrecisionPolicy fp32;
        const Layout two_nodes = make_layout(c, fp32, 4, 2, 1);
        EXPECT_EQ(two_nodes.readers, 2);
        t = per_kind(footprint(c, two_nodes, 0, 0).collectives);
        EXPECT_EQ(t[dist::CommKind::scatter].calls, 1u);
        EXPECT_EQ(t[dist::CommKind::scatter].bytes, MB * (T + 1) * 4);
        EXPECT_EQ(make_layout(c, fp32, 3, 2, 1).readers, 0);  // unequal nodes: every rank
    }
    {  // half payloads: dispatch in the FFN's GEMM dtype (O1 up), combine in its activation
       // dtype (O2 up); the per-expert counts (E int64) go by all-to-all as well
        TrainConfig c              = small_config(2);
        c.parallel.expert_parallel = 2;
        c.precision.dtype          = Dtype::bfloat16;
        const uint64_t N = MB * T, C = 24, rows = N * K * C;
        c.precision.ffn = Level::O1;
        EXPECT_EQ(per_kind(footprint(c, layout_4x4(c), 0, 0).collectives)[dist::CommKind::alltoallv]
                      .bytes,
                  2 * rows * 2 + 2 * rows * 4 + E * 8);
        c.precision.ffn = Level::O2;
        EXPECT_EQ(per_kind(footprint(c, layout_4x4(c), 0, 0).collectives)[dist::CommKind::alltoallv]
                      .bytes,
                  4 * rows * 2 + E * 8);
    }
}

// The row budget (model.moe_rows_budget): MoE memory per rank stops growing with EP, and a
// budget below the balanced load means more rounds, each a dispatch and a combine, and a
// second dispatch of the tokens in backward.
TEST(PlanComm, RowBudgetBoundsMemoryAndCountsRounds) {
    TrainConfig c    = small_config(2, 8);
    c.model.seq_len  = 256;  // N K = 2 x 256 x 2 = 1024 rows per rank
    const uint64_t N = 2 * 256, K = 2, C = 24, E = 8, rows = N * K * C;
    auto moe_bytes = [&](double budget, int ep) {
        TrainConfig b           = c;
        b.model.moe_rows_budget = budget;
        const MoEBytes m        = moe_layer_bytes(b.model, static_cast<int64_t>(N), ep);
        return m.activations + m.scratch + m.comm_buffers;
    };
    // unbounded grows with EP by (R, C) and (R, F) buffers; with a budget of twice the
    // balanced load only the per-peer counts grow (a few int64 per peer and expert)
    EXPECT_GT(moe_bytes(0, 8), moe_bytes(0, 4) + 4 * 1024 * (C + 40));
    EXPECT_NEAR(moe_bytes(2, 8), moe_bytes(2, 4), 4096);
    EXPECT_LT(moe_bytes(2, 8), moe_bytes(0, 8));
    c.parallel.expert_parallel = 4;
    c.model.moe_rows_budget    = 0.25;  // 256 rows: 4 rounds at the balanced load
    const Footprint f          = footprint(c, layout_of(c, 4, 4), 0, 0);
    EXPECT_EQ(f.moe_rounds, 4);
    const dist::CommTally t = per_kind(f.collectives);
    // counts, row starts (several rounds); per round: dispatch + combine forward, dispatch x2 +
    // combine backward
    EXPECT_EQ(t[dist::CommKind::alltoallv].calls, 2u + 4 * 5);
    EXPECT_EQ(t[dist::CommKind::alltoallv].bytes, 5 * rows * 4 + E * 8 + 2 * E * 8);
}

// The MoE layer's backward scratch holds one (N K, C) array of gradient rows: the output
// gradient's copy, whose rows the input gradient's take over; or, with the experts' products in
// bf16 (gather_dy), one rank and one round, the input gradient's alone beside the (N K) weights of
// the output gradient's rows (formed from the tokens'). With pieces, two.
TEST(PlanComm, MoEScratchHoldsOneArrayOfGradientRows) {
    TrainConfig c   = small_config(2, 8);
    c.model.seq_len = 256;
    const int64_t N = 2 * 256;
    const double NK = double(N) * c.model.top_k, NKC = NK * c.model.d_model;
    auto scratch = [&](int ep, double budget, bool gather) {
        TrainConfig b           = c;
        b.model.moe_rows_budget = budget;
        return moe_layer_bytes(b.model, N, ep, 0, true, 1, gather).scratch;
    };
    // one (N K, C) array either way: the output gradient's rows, the input gradient's in them;
    // or the input gradient's alone, with the (N K) weights beside
    EXPECT_NEAR(scratch(1, 0, true) - scratch(1, 0, false), 4 * NK, 64);
    EXPECT_EQ(scratch(2, 0, false), scratch(2, 0, true));
    EXPECT_EQ(scratch(1, 0.25, false), scratch(1, 0.25, true));  // rounds
    // with pieces both arrays: a piece's dispatch reads the one while the previous piece's
    // combine writes the other
    TrainConfig b    = c;
    const double one = moe_layer_bytes(b.model, N, 2, 0, true, 1).scratch,
                 two = moe_layer_bytes(b.model, N, 2, 0, true, 4).scratch;
    EXPECT_NEAR(two - one, 4 * NKC, 64);
    // the experts' outputs kept in 16 bits: half their bytes, with one rank in one round only
    auto kept = [&](int ep, double budget, bool y16) {
        TrainConfig k           = c;
        k.model.moe_rows_budget = budget;
        return moe_layer_bytes(k.model, N, ep, 0, true, 1, true, y16).layer_buffers;
    };
    EXPECT_NEAR(kept(1, 0, false) - kept(1, 0, true), 2 * NKC, 64);
    EXPECT_EQ(kept(2, 0, false), kept(2, 0, true));
    EXPECT_EQ(kept(1, 0.25, false), kept(1, 0.25, true));
}

TEST(PlanTime, OverlapFollowsTheConfig) {
    TrainConfig c         = small_config(0);
    c.model.d_model       = 256;   // gradients large enough to take time
    c.parallel.bucket_mib = 0.25;  // several ParO buckets: all but the first can hide
    MachineSpec mach;
    mach.node.peak_fp32_gflops     = 100;
    mach.node.memory_gib           = 1;
    mach.node.memory_bandwidth_gbs = 10;
    mach.node.cores                = 4;
    const Footprint f              = footprint(c, layout_4x4(c), 0, 0);
    ASSERT_TRUE(f.layout.overlap);
    const Estimate on = estimate(f, c, mach);
    double reduce     = 0;
    for (size_t i = 0; i < f.collectives.size(); ++i) {
        if (f.collectives[i].reduction) reduce += on.comm[i].seconds;
    }
    EXPECT_GT(on.t_overlap, 0);
    EXPECT_LT(on.t_overlap, reduce);  // the unit holding the embeddings is never hidden
    EXPECT_DOUBLE_EQ(estimate(f, c, mach, {0.0}).t_overlap, 0);
    c.parallel.overlap_grad_reduce = false;
    EXPECT_DOUBLE_EQ(estimate(footprint(c, layout_4x4(c), 0, 0), c, mach).t_overlap, 0);
}

// The experts' exchanges behind the experts: with c pieces, (c-1)/c of min(exchanges, products)
// of the forward (a third of the products) and of the backward; one piece hides nothing; a
// shared expert hides the dispatch behind its own products (forward and backward); the hidden
// time comes off the step.
TEST(PlanTime, ExpertExchangesHideBehindTheExperts) {
    TrainConfig c              = small_config(1, 8);
    c.parallel.expert_parallel = 4;
    c.model.moe_rows_budget    = 0;  // one round
    MachineSpec mach;
    mach.node.peak_fp32_gflops     = 100;
    mach.node.memory_gib           = 1;
    mach.node.memory_bandwidth_gbs = 10;
    mach.node.cores                = 4;
    auto run                       = [&](const TrainConfig& cfg) {
        const Footprint f = footprint(cfg, layout_4x4(cfg), 0, 0);
        const Estimate e  = estimate(f, cfg, mach);
        double disp = 0, comb = 0, experts = 0, shared = 0;
        for (size_t i = 0; i < f.collectives.size(); ++i) {
            const std::string& w = f.collectives[i].what;
            if (w.rfind("moe dispatch all-to-all", 0) == 0) disp += e.comm[i].seconds;
            if (w.rfind("moe combine all-to-all", 0) == 0) comb += e.comm[i].seconds;
        }
        for (const Term& t : e.compute) {
            if (t.name == "gemm: experts") experts = t.seconds;
            if (t.name == "gemm: shared experts") shared = t.seconds;
        }
        EXPECT_NEAR(e.t_step, e.t_compute + e.t_memory + e.t_comm - e.t_overlap - e.t_a2a_hidden,
                                          1e-15);
        return std::tuple{e.t_a2a_hidden, disp, comb, experts, shared};
    };
    const auto [none, d1, c1, x1, s1] = run(c);
    EXPECT_EQ(none, 0.0);
    c.parallel.a2a_chunks            = 4;
    const auto [hidden, d, cb, x, s] = run(c);
    ASSERT_GT(d + cb, 0);
    ASSERT_GT(x, 0);
    EXPECT_NEAR(hidden,
                0.75 * (std::min(0.5 * (d + cb), x / 3) + std::min(0.5 * (d + cb), 2 * x / 3)),
                1e-15);
    c.parallel.a2a_chunks               = 1;
    c.model.n_shared_experts            = 1;
    const auto [beside, ds, cs, xs, ss] = run(c);
    ASSERT_GT(ss, 0);
    EXPECT_NEAR(beside, std::min(0.5 * ds, ss / 3) + std::min(0.5 * ds, 2 * ss / 3), 1e-15);
    c.parallel.overlap_shared = false;
    EXPECT_EQ(std::get<0>(run(c)), 0.0);
}

// precision.router = "half": in a bf16 run the gate's three products are timed at the half
// peak (4x the float32 one here: a quarter of the time) and its casts are counted; an fp32 run
// and a run with the float32 router keep them at the float32 peak.
TEST(PlanTime, HalfRouterRunsAtTheHalfPeak) {
    TrainConfig c          = small_config(1, 64);
    const MachineSpec mach = small_machine(400);
    auto terms             = [&](Dtype d, RouterPrecision r) {
        c.precision.dtype  = d;
        c.precision.router = r;
        const Estimate e   = estimate(footprint(c, layout_of(c, 1, 1), 0, 0), c, mach);
        double gate = 0, casts = 0;
        for (const Term& t : e.compute) {
            if (t.name == "gemm: MoE gate") gate = t.seconds;
            if (t.name == "precision casts") casts = t.seconds;
        }
        return std::pair{gate, casts};
    };
    const auto [g32, c32]   = terms(Dtype::float32, RouterPrecision::half);
    const auto [gbf, cbf]   = terms(Dtype::bfloat16, RouterPrecision::fp32);
    const auto [ghalf, chf] = terms(Dtype::bfloat16, RouterPrecision::half);
    ASSERT_GT(g32, 0);
    EXPECT_DOUBLE_EQ(gbf, g32);
    EXPECT_NEAR(ghalf, g32 / 4, 1e-12 * g32);
    EXPECT_EQ(c32, 0.0);
    EXPECT_GT(chf, cbf);
}

TEST(PlanTime, GemmEfficiencyInterpolates) {
    NodeSpec n;
    n.gemm_sizes      = {64, 256};
    n.gemm_efficiency = {0.2, 0.6};
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 16, 16, 16), 0.2);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 128, 128, 128), 0.4);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 4096, 4096, 4096), 0.6);
    // the bf16 products' curve where the machine has one, else the float32 one
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 128, 128, 128, true), 0.4);
    n.half_gemm_efficiency = {0.1, 0.9};
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 128, 128, 128, true), 0.5);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 16, 16, 16, true), 0.1);
    EXPECT_DOUBLE_EQ(gemm_efficiency(n, 128, 128, 128), 0.4);
}

// Every bf16 product, the recomputed forward's included, is timed at the half peak with the
// bf16 curve, and no float32 product is: halving the bf16 curve doubles exactly the bf16 run's
// GEMM terms and leaves the float32 run's as they were.
TEST(PlanTime, HalfProductsRunOnTheirOwnCurve) {
    TrainConfig c             = small_config(1, 8);
    c.train.recompute         = Recompute::moe;
    c.model.n_shared_experts  = 1;
    MachineSpec mach          = small_machine(400);
    mach.node.gemm_sizes      = {8, 64};
    mach.node.gemm_efficiency = {0.4, 0.8};
    auto gemm_terms           = [&](Dtype d, const std::vector<double>& half_curve) {
        c.precision.dtype              = d;
        mach.node.half_gemm_efficiency = half_curve;
        const Estimate e               = estimate(footprint(c, layout_of(c, 1, 1), 0, 0), c, mach);
        std::map<std::string, double> g;
        for (const Term& t : e.compute) {
            if (t.name.rfind("gemm: ", 0) == 0 || t.name == "recompute (forward again)")
                g[t.name] = t.seconds;
        }
        return g;
    };
    const std::vector<double> same = {0.4, 0.8}, half = {0.2, 0.4};
    const auto bf_same = gemm_terms(Dtype::bfloat16, same),
               bf_half = gemm_terms(Dtype::bfloat16, half);
    const auto f_same = gemm_terms(Dtype::float32, same), f_half = gemm_terms(Dtype::float32, half);
    EXPECT_EQ(f_same, f_half);
    ASSERT_TRUE(bf_same.count("gemm: experts") && bf_same.count("recompute (forward again)"));
    // the default policy: the embedding (no products) O0, the router float32, the rest bf16
    for (const auto& [name, secs] : bf_same) {
        if (name == "gemm: MoE gate") {
            EXPECT_DOUBLE_EQ(bf_half.at(name), secs) << name;
        } else if (name == "recompute (forward again)") {
            // the recomputed MoE layers' gate product stays float32, their experts' are bf16
            EXPECT_GT(bf_half.at(name), 1.5 * secs) << name;
            EXPECT_LT(bf_half.at(name), 2 * secs) << name;
        } else {
            EXPECT_NEAR(bf_half.at(name), 2 * secs, 1e-12 * secs) << name;
        }
    }
}

// ---- machine files ----

class MachineFileTest : public ::testing::Test {
   protected:
    std::string write(const std::string& text) {
        const std::string p = dir / "m.toml";
        testing::write_file(p, text);
        return p;
    }
    void expect_error(const std::string& text, std::initializer_list<std::string> needles) {
        const std::string p = write(text);
        try {
            load_machine(p);
            ADD_FAILURE() << "no error for:\n" << text;
        } catch (const InputError& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(p), std::string::npos) << msg;
            for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
        }
    }
    testing::TempDir dir;
};

TEST_F(MachineFileTest, ShippedFilesLoad) {
    const MachineSpec m =
        load_machine(std::string(BGL_SOURCE_DIR) + "/machines/sunway-oceanlight.toml");
    EXPECT_EQ(m.node.cores, 390);
    EXPECT_DOUBLE_EQ(m.node.peak_fp32_gflops, 14030);
    EXPECT_EQ(m.network.total_nodes, 107520);
}

TEST_F(MachineFileTest, RoundTrip) {
    MachineSpec m;
    m.node.peak_fp32_gflops     = 123.5;
    m.node.memory_gib           = 7;
    m.node.memory_bandwidth_gbs = 9;
    m.node.gemm_sizes           = {10, 20};
    m.node.gemm_efficiency      = {0.1, 0.2};
    m.node.l2_kib               = 2048;
    m.node.l3_kib               = 32768;
    m.node.gemm_path            = "avx512";
    const MachineSpec r         = load_machine(write(to_toml(m, "# comment\n")));
    EXPECT_DOUBLE_EQ(r.node.peak_fp32_gflops, 123.5);
    EXPECT_EQ(r.node.gemm_sizes, m.node.gemm_sizes);
    EXPECT_TRUE(r.node.half_gemm_efficiency.empty());
    m.node.half_gemm_efficiency = {0.05, 0.5};
    EXPECT_EQ(load_machine(write(to_toml(m))).node.half_gemm_efficiency,
              m.node.half_gemm_efficiency);
    EXPECT_DOUBLE_EQ(r.node.l2_kib, 2048);
    EXPECT_DOUBLE_EQ(r.node.l3_kib, 32768);
    EXPECT_EQ(r.node.gemm_path, "avx512");
}

TEST_F(MachineFileTest, BadFilesNameFileAndKey) {
    const std::string ok =
        "[node]\npeak_fp32_gflops = 10\nmemory_gib = 1\nmemory_bandwidth_gbs = 1\n";
    expect_error(ok + "bogus = 1\n", {"node.bogus", "unknown key"});
    expect_error(ok + "[nodes]\n", {"unknown section [nodes]"});
    expect_error("[node]\npeak_fp32_gflops = \"fast\"\n",
                 {"node.peak_fp32_gflops", "expected a number"});
    expect_error("[node]\npeak_fp32_gflops = -1\nmemory_gib = 1\nmemory_bandwidth_gbs = 1\n",
                 {"node.peak_fp32_gflops", "must be > 0"});
    expect_error(ok + "gemm_sizes = [1.0, 2.0]\n", {"gemm_sizes", "same length"});
    expect_error(ok + "half_gemm_efficiency = [0.5, 0.6]\n",
                 {"node.half_gemm_efficiency", "as long as node.gemm_sizes", "got 2 and 1"});
    expect_error(ok + "half_gemm_efficiency = [1.5]\n",
                 {"node.half_gemm_efficiency = 1.5", "must be in (0, 1]"});
    expect_error(ok + "[network]\noversubscription = 0.5\n", {"network.oversubscription"});
    expect_error("[node\n", {"invalid TOML"});
    expect_error(ok + "gemm_path = \"avx1024\"\nl2_kib = 1024\nl3_kib = 8192\n",
                 {"node.gemm_path", "avx1024", "expected generic, avx2, avx512"});
    expect_error(ok + "gemm_path = \"avx2\"\nl3_kib = 8192\n", {"node.l2_kib", "must be > 0"});
    expect_error(ok + "l2_kib = -1\n", {"node.l2_kib", ">= 0"});
    EXPECT_THROW(load_machine(dir / "missing.toml"), InputError);
}

}  // namespace
}  // namespace bagualu::plan

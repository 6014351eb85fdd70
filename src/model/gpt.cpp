#include "model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/phase_timer.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"

namespace bagualu::model {

using namespace kernels;

// ---- parameter layout ----

ParamLayout make_layout(const ModelConfig& m, int ep_size, int ep_rank) {
    ParamLayout L;
    for (const TensorKind& k : tensor_kinds(m, ep_size, ep_rank)) {
        const TensorDef& d               = tensor_def(k.row);
        const std::vector<int64_t> shape = tensor_shape(d, m);
        for (int64_t e = k.e0; e < k.e1; ++e) {
            L.add(tensor_name(d, k.layer, e), shape, d.decay, d.scope == Scope::expert);
        }
    }
    return L;
}

void for_each_param_kind(const ModelConfig& m, int ep_size,
                         FunctionRef<void(const ParamSpec&, uint64_t)> fn) {
    for (const TensorKind& k : tensor_kinds(m, ep_size, 0)) {
        const TensorDef& d = tensor_def(k.row);
        ParamSpec s;
        s.name  = tensor_name(d, k.layer, k.e0);
        s.shape = tensor_shape(d, m);
        s.numel = 1;
        for (int64_t x : s.shape) s.numel *= static_cast<size_t>(x);
        s.decay  = d.decay;
        s.expert = d.scope == Scope::expert;
        fn(s, static_cast<uint64_t>(k.e1 - k.e0));
    }
}

LayoutSize layout_size(const ModelConfig& m, int ep_size) {
    const auto pad = [](uint64_t n) { return (n + 15) / 16 * 16; };  // as ParamLayout::add
    LayoutSize s;
    for_each_param_kind(m, ep_size, [&](const ParamSpec& p, uint64_t count) {
        (p.expert ? s.expert_floats : s.dense_floats) += count * pad(p.numel);
    });
    // the whole model: every expert of every MoE layer
    for_each_param_kind(
        m, 1, [&](const ParamSpec& p, uint64_t count) { s.full_params += count * p.numel; });
    return s;
}

template <typename P>
ModelTensors<P> resolve_each(const ParamLayout& layout, const ModelConfig& m,
                             FunctionRef<P*(const ParamSpec&)> at, int ep_size, int ep_rank) {
    auto spec = [&](const std::string& name) -> const ParamSpec& {
        const ParamSpec* s = layout.find(name);
        BGL_CHECK(s != nullptr, "no parameter {}", name);
        return *s;
    };
    ModelTensors<P> t;
    t.blocks.resize(static_cast<size_t>(m.n_layer));
    for (const TensorKind& k : tensor_kinds(m, ep_size, ep_rank)) {
        const TensorRow<P>& r = kTensorTable<P>[k.row];
        P* const p            = at(spec(tensor_name(r.def, k.layer, k.e0)));
        switch (r.def.scope) {
            case Scope::model:
                t.*r.model_slot = p;
                break;
            case Scope::block:
                t.blocks[static_cast<size_t>(k.layer)].*r.block_slot = p;
                break;
            case Scope::expert:
            case Scope::shared: {
                BlockTensors<P>& bt       = t.blocks[static_cast<size_t>(k.layer)];
                moe::ExpertTensors<P>& ex = r.def.scope == Scope::expert ? bt.experts : bt.shared;
                ex.*r.expert_slot         = p;
                ex.*r.stride_slot =
                    k.e1 - k.e0 > 1
                        ? static_cast<size_t>(at(spec(tensor_name(r.def, k.layer, k.e0 + 1))) - p)
                        : 0;
                break;
            }
        }
    }
    return t;
}
template ModelTensors<const float> resolve_each(const ParamLayout&, const ModelConfig&,
                                                FunctionRef<const float*(const ParamSpec&)>, int,
                                                int);

template <typename P>
ModelTensors<P> resolve(const ParamLayout& layout, const ModelConfig& m, P* base, int ep_size,
                        int ep_rank) {
    return resolve_each<P>(
        layout, m, [base](const ParamSpec& s) { return base + s.offset; }, ep_size, ep_rank);
}
template ModelTensors<float> resolve(const ParamLayout&, const ModelConfig&, float*, int, int);
template ModelTensors<const float> resolve(const ParamLayout&, const ModelConfig&, const float*,
                                           int, int);

void init_params(float* params, const ParamLayout& layout, const ModelConfig& m, uint64_t seed) {
    const double resid_std = m.init_std / std::sqrt(2.0 * m.n_layer);
    std::unordered_map<std::string, const ParamSpec*> held;  // this layout's tensors by name
    for (const ParamSpec& s : layout.specs()) held.emplace(s.name, &s);
    uint64_t i  = 0;  // position in the full layout
    size_t done = 0;  // tensors of `layout` initialised
    for (const TensorKind& k : tensor_kinds(m, 1, 0)) {
        const TensorDef& d = tensor_def(k.row);
        for (int64_t e = k.e0; e < k.e1; ++e, ++i) {
            const auto it = held.find(tensor_name(d, k.layer, e));
            if (it == held.end()) continue;
            const ParamSpec& s = *it->second;
            float* p           = params + s.offset;
            ++done;
            switch (d.init) {
                case Init::zeros:
                    std::fill(p, p + s.numel, 0.0f);
                    break;
                case Init::ones:
                    std::fill(p, p + s.numel, 1.0f);
                    break;
                case Init::normal:
                case Init::normal_resid: {
                    const double std = d.init == Init::normal_resid ? resid_std : m.init_std;
                    Rng rng(seed, i + 1);
                    for (size_t j = 0; j < s.numel; ++j) {
                        p[j] = static_cast<float>(rng.normal() * std);
                    }
                    break;
                }
            }
        }
    }
    BGL_CHECK(done == layout.specs().size(),
              "init_params: {} of the layout's {} tensors are not "
              "tensors of this model",
              layout.specs().size() - done, layout.specs().size());
}

// ---- activations ----

struct GPT::Acts {
    struct Block {
        float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res1, *ln2, *ln2_mean, *ln2_rstd;
        // dense MLP only: pre-GELU (N, F), in float32 or (a half ffn act dtype) 16 bits;
        // gelu(fch) is not kept, backward computes it again
        kernels::KeptArray fch;
        // ln_1's (a dense block's ln_2's) output kept only as its 16 bits where the products
        // that are its only readers take half operands (then ln1 (ln2) is nullptr)
        uint16_t *ln1_16 = nullptr, *ln2_16 = nullptr;
        // Q, K, V and the attention's output kept only as their 16 bits where the bf16 core
        // reads them so (attention_in_16_bits; then qkv and atty are nullptr)
        uint16_t *qkv16 = nullptr, *atty16 = nullptr;
    };
    FloatArena arena;
    std::vector<float*> resid;  // [L+1] (N, C)
    std::vector<Block> blocks;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *dlosses;
    // head_gradient_in_16_bits: ln_f's output and the head's output gradient (N, V) only as
    // their 16 bits (then lnf is nullptr, and logits holds a block of rows)
    uint16_t *lnf16 = nullptr, *head16 = nullptr;
    float* head_lse;  // (N): each row's logsumexp, from the forward's cross-entropy for backward's
    float *dresid, *dc, *dc2, *dqkv, *df;  // backward scratch (df: a dense GELU's output too)
    Buffer<int32_t> tokens, targets;
};

// Offsets of every activation slice in the arena, in the order they are reserved.
struct ArenaPlan {
    struct BlockOff {
        size_t ln1, m1, r1, qkv, atty, lse, res1, ln2, m2, r2, fch;
        bool ln1_half, ln2_half, attn_half;  // ln1, ln2 (qkv, atty) reserved as 16-bit slices
    };
    std::vector<size_t> resid;     // [L+1]
    std::vector<BlockOff> blocks;  // [L]
    size_t lnf, lnfm, lnfr, logits, losses, dlosses, head_lse, dresid, dc, dc2, dqkv, df;
    size_t head16  = 0;
    bool head_half = false;  // lnf and head16 reserved as 16-bit slices
};

// Whether block l keeps ln_2's output in 16 bits: a dense block whose fc products, its only
// readers, take half operands (a MoE layer's router reads it as floats; under block
// recomputation the blocks share one working set, MoE layers' included).
static bool ln2_in_16_bits(const ModelConfig& cfg, int l, Recompute rc, Dtype ln_ffn) {
    return ln_ffn != Dtype::float32 && rc != Recompute::block && !cfg.is_moe_block(l);
}

// Reserves the activation slices of a forward/backward over N tokens. The one place that sizes
// the activations: GPT's constructor and activation_floats() (the planner) both call it.
// recompute = block: every block uses one working set (the MLP's slices when any block is dense).
// head16: head_gradient_in_16_bits (head_rows 0).
static ArenaPlan plan_arena(FloatArena& A, const ModelConfig& cfg, size_t N, size_t head_rows,
                            Recompute rc, Dtype hidden, Dtype ln_attn, Dtype ln_ffn, bool attn16,
                            bool head16) {
    const size_t C = static_cast<size_t>(cfg.d_model), F = static_cast<size_t>(cfg.d_ff),
                 V = static_cast<size_t>(cfg.vocab_size), NH = static_cast<size_t>(cfg.n_head);
    ArenaPlan p;
    for (int l = 0; l <= cfg.n_layer; ++l) p.resid.push_back(A.reserve(N * C));
    bool any_dense = false;
    for (int l = 0; l < cfg.n_layer; ++l) any_dense = any_dense || !cfg.is_moe_block(l);
    for (int l = 0; l < cfg.n_layer; ++l) {
        if (rc == Recompute::block && l > 0) {
            p.blocks.push_back(p.blocks.front());
            continue;
        }
        const bool dense = rc == Recompute::block ? any_dense : !cfg.is_moe_block(l);
        ArenaPlan::BlockOff o{};
        o.ln1_half  = ln_attn != Dtype::float32;
        o.ln2_half  = ln2_in_16_bits(cfg, l, rc, ln_ffn);
        o.ln1       = o.ln1_half ? A.reserve_half(N * C) : A.reserve(N * C);
        o.m1        = A.reserve(N);
        o.r1        = A.reserve(N);
        o.attn_half = attn16;
        o.qkv       = attn16 ? A.reserve_half(N * 3 * C) : A.reserve(N * 3 * C);
        o.atty      = attn16 ? A.reserve_half(N * C) : A.reserve(N * C);
        o.lse       = A.reserve(N * NH);
        o.res1      = A.reserve(N * C);
        o.ln2       = o.ln2_half ? A.reserve_half(N * C) : A.reserve(N * C);
        o.m2        = A.reserve(N);
        o.r2        = A.reserve(N);
        if (dense) o.fch = hidden == Dtype::float32 ? A.reserve(N * F) : A.reserve_half(N * F);
        p.blocks.push_back(o);
    }
    p.head_half             = head16 && head_rows == 0;
    p.lnf                   = p.head_half ? A.reserve_half(N * C) : A.reserve(N * C);
    p.lnfm                  = A.reserve(N);
    p.lnfr                  = A.reserve(N);
    const size_t logit_rows = p.head_half ? std::min(N, static_cast<size_t>(head_block_rows(cfg)))
                                          : (head_rows > 0 ? std::min(N, head_rows) : N);
    p.logits                = A.reserve(logit_rows * V);
    if (p.head_half) p.head16 = A.reserve_half(N * V);
    p.losses   = A.reserve(N);
    p.dlosses  = A.reserve(N);
    p.head_lse = A.reserve(N);
    p.dresid   = A.reserve(N * C);
    p.dc       = A.reserve(N * C);
    p.dc2      = A.reserve(N * C);
    p.dqkv     = A.reserve(N * 3 * C);
    p.df       = A.reserve(N * F);
    return p;
}

size_t activation_floats(const ModelConfig& cfg, int64_t max_batch, int64_t head_rows,
                         Recompute recompute, Dtype hidden, Dtype ln_attn, Dtype ln_ffn,
                         bool attn16, bool head16) {
    FloatArena A;
    plan_arena(A, cfg, static_cast<size_t>(max_batch) * static_cast<size_t>(cfg.seq_len),
               static_cast<size_t>(head_rows), recompute, hidden, ln_attn, ln_ffn, attn16, head16);
    return A.total_floats();
}

namespace {
bool g_attention_16bit = true;  // attention_16bit_activations
bool g_head_16bit      = true;  // head_gradient_16bit
}  // namespace

void attention_16bit_activations(bool on) { g_attention_16bit = on; }
void head_gradient_16bit(bool on) { g_head_16bit = on; }

bool head_gradient_in_16_bits(const PrecisionPolicy& prec, int64_t head_rows) {
    const Dtype gh = prec.gemm_dtype(LayerClass::head);
    return g_head_16bit && head_rows == 0 && gh != Dtype::float32 &&
           kernels::half_products_convert(gh);
}

int64_t head_block_rows(const ModelConfig& cfg) {
    const int64_t rows = (int64_t{1} << 21) / std::max<int64_t>(1, cfg.vocab_size);
    return std::max<int64_t>(64, rows);
}

bool attention_in_16_bits(const ModelConfig& cfg, const PrecisionPolicy& prec) {
    return g_attention_16bit && cfg.n_head > 0 && cfg.d_model % cfg.n_head == 0 &&
           kernels::attention_kept16(prec.gemm_dtype(LayerClass::attention),
                                     cfg.d_model / cfg.n_head, prec.fp64_sensitive);
}

int64_t fused_head_rows(const ModelConfig& cfg) {
    // 768 is a multiple of the k block (KC) of each of our packed GEMMs (avx512 192 and 384,
    // amx 768, avx2 and generic 256): dwte += dlogits^T @ x then adds the same k blocks of N in the
    // same order as one GEMM over all N rows, and the fused head gives the unfused one's bits.
    constexpr int64_t kRowMultiple = 768;
    const int64_t rows             = (int64_t{1} << 22) / std::max<int64_t>(1, cfg.vocab_size);
    return std::max<int64_t>(1, rows / kRowMultiple) * kRowMultiple;
}

ComputeCopies plan_compute_copies(const ParamLayout& layout, const PrecisionPolicy& prec,
                                  bool masters_in_place) {
    const size_t n = layout.specs().size();
    ComputeCopies c;
    c.at.assign(n, ComputeCopies::kNone);
    c.kept.assign(n, ComputeCopies::kNone);
    for (size_t i = 0; i < n; ++i) {
        const ParamSpec& s = layout.spec(i);
        // the padded span, so an expert kind keeps its stride
        const size_t span =
            (i + 1 < n ? layout.spec(i + 1).offset : layout.total_floats()) - s.offset;
        if (prec.storage_dtype(s) != Dtype::float32) {
            if (!masters_in_place || prec.master_mode(s) != MasterMode::master) {
                c.half.push_back(i);
            } else if (s.decay && PrecisionPolicy::class_of(s.name) != LayerClass::embedding) {
                c.at[i] = c.floats;  // a GEMM weight matrix: as an O1 weight
                c.floats += span;
            } else {
                c.kept[i] = c.kept_floats;
                c.kept_floats += span;
            }
            continue;
        }
        if (prec.compute_dtype(s) == Dtype::float32) continue;
        c.at[i] = c.floats;
        c.floats += span;
    }
    return c;
}

GPT::GPT(const ModelConfig& cfg, int max_batch, dist::ParallelContext* par, int virtual_workers,
         const PrecisionPolicy& prec, int head_rows, Recompute recompute, int a2a_chunks,
         bool overlap_shared)
    : cfg_(cfg),
      max_batch_(max_batch),
      layout_(make_layout(cfg, par ? par->ep_size() : 1, par ? par->ep_rank() : 0)),
      prec_(prec),
      head_rows_(head_rows),
      recompute_(recompute) {
    BGL_CHECK(head_rows >= 0, "GPT: head_rows = {} must be >= 0", head_rows);
    const int ep_size = par ? par->ep_size() : 1, ep_rank = par ? par->ep_rank() : 0;
    par_ep_size_   = ep_size;
    par_ep_rank_   = ep_rank;
    params_        = Buffer<float>(layout_.total_floats());
    grads_         = Buffer<float>(layout_.total_floats());
    g_             = resolve<float>(layout_, cfg_, grads_.data(), ep_size, ep_rank);
    const size_t N = static_cast<size_t>(max_batch) * static_cast<size_t>(cfg.seq_len);
    if (prec_.mixed()) {
        // Forward computes with the weights as the policy rounds them (refresh_compute_weights):
        // a half-stored tensor is its parameter, rounded in place; a float32-stored one computed
        // in half (O1 GEMM weights) is a rounded copy in wc_ (plan_compute_copies), made only
        // where its products do not round it themselves (use_o1_copies).
        compute_         = plan_compute_copies(layout_, prec_);
        const Dtype head = prec_.gemm_dtype(LayerClass::head);
        head_copy_ =
            head != Dtype::float32 && prec_.compute_dtype(*layout_.find("wte")) == Dtype::float32;
        use_o1_copies(!half_products_convert(prec_.dtype));
        // only where some products take the rounded floats (fp16; backward's operand lambda
        // makes it should the products stop converting later)
        if (!half_products_convert(prec_.dtype))
            dround_ = Buffer<float>(N * static_cast<size_t>(cfg.d_model));
    } else {
        w_      = resolve<const float>(layout_, cfg_, params_.data(), ep_size, ep_rank);
        head_w_ = w_.wte;
    }
    a_            = std::make_unique<Acts>();
    FloatArena& A = a_->arena;
    // plan offsets, then allocate once, then resolve
    const Dtype hidden = prec_.act_dtype(LayerClass::ffn);
    const bool head16  = head_gradient_in_16_bits(prec_, head_rows);
    if (head16) head16_rows_ = static_cast<int>(std::min<int64_t>(head_block_rows(cfg), N));
    const ArenaPlan p =
        plan_arena(A, cfg, N, static_cast<size_t>(head_rows), recompute_, hidden,
                   prec_.gemm_dtype(LayerClass::attention), prec_.gemm_dtype(LayerClass::ffn),
                   attention_in_16_bits(cfg, prec_), head16);
    A.allocate();
    for (size_t off : p.resid) a_->resid.push_back(A.at(off));
    for (int l = 0; l < cfg.n_layer; ++l) {
        const ArenaPlan::BlockOff& o = p.blocks[static_cast<size_t>(l)];
        Acts::Block b{o.ln1_half ? nullptr : A.at(o.ln1),
                      A.at(o.m1),
                      A.at(o.r1),
                      o.attn_half ? nullptr : A.at(o.qkv),
                      o.attn_half ? nullptr : A.at(o.atty),
                      A.at(o.lse),
                      A.at(o.res1),
                      o.ln2_half ? nullptr : A.at(o.ln2),
                      A.at(o.m2),
                      A.at(o.r2),
                      kernels::KeptArray{}};
        if (o.ln1_half) b.ln1_16 = A.at_half(o.ln1);
        if (o.ln2_half) b.ln2_16 = A.at_half(o.ln2);
        if (o.attn_half) {
            b.qkv16  = A.at_half(o.qkv);
            b.atty16 = A.at_half(o.atty);
        }
        if (!cfg.is_moe_block(l)) {
            if (hidden == Dtype::float32) {
                b.fch.f32 = A.at(o.fch);
            } else {
                b.fch.half = A.at_half(o.fch);
            }
        }
        a_->blocks.push_back(b);
    }
    if (p.head_half) {
        a_->lnf    = nullptr;
        a_->lnf16  = A.at_half(p.lnf);
        a_->head16 = A.at_half(p.head16);
    } else {
        a_->lnf = A.at(p.lnf);
    }
    a_->lnf_mean = A.at(p.lnfm);
    a_->lnf_rstd = A.at(p.lnfr);
    a_->logits   = A.at(p.logits);
    a_->losses   = A.at(p.losses);
    a_->dlosses  = A.at(p.dlosses);
    a_->head_lse = A.at(p.head_lse);
    a_->dresid   = A.at(p.dresid);
    a_->dc       = A.at(p.dc);
    a_->dc2      = A.at(p.dc2);
    a_->dqkv     = A.at(p.dqkv);
    a_->df       = A.at(p.df);
    a_->tokens   = Buffer<int32_t>(N);
    a_->targets  = Buffer<int32_t>(N);

    moe::MoEShape ms{cfg.d_model, cfg.expert_width(), cfg.n_experts, cfg.top_k, cfg.aux_loss_coef};
    ms.gate.kind            = cfg.gate;
    ms.gate.swipe_balance   = cfg.swipe_balance;
    ms.gate.capacity_factor = cfg.capacity_factor;
    ms.gate.jitter          = cfg.jitter;
    ms.gate.z_loss_coef     = cfg.router_z_loss_coef;
    ms.gate.score           = cfg.router_score;
    ms.gate.balance_scope   = cfg.balance_loss_scope;
    ms.gate.fp64            = prec_.router_fp64();
    ms.gate.half            = prec_.router_dtype();
    ms.gate.virtual_workers = virtual_workers;
    ms.gate.balance_bias    = cfg.balance_bias_rate > 0;
    ms.rows_budget          = cfg.moe_rows_budget;
    ms.gate.route_override  = cfg.route_override;
    ms.gate.route_nodes     = cfg.route_nodes;
    ms.gate.route_groups    = cfg.route_groups;
    ms.gate.product_keys    = cfg.product_keys;
    ms.a2a_chunks           = a2a_chunks;
    ms.n_shared             = cfg.n_shared_experts;
    ms.FS                   = cfg.shared_width();
    ms.prec                 = {prec_.gemm_dtype(LayerClass::ffn), prec_.act_dtype(LayerClass::ffn),
                               prec_.fp64_sensitive};
    // recomputed MoE layers run forward right before their backward: one set of buffers serves all
    const auto shared =
        recompute_ != Recompute::none ? std::make_shared<moe::MoEBuffers>() : nullptr;
    // one backward working set for every MoE layer (moe/moe_layer.h)
    const auto scratch = std::make_shared<moe::MoEScratch>();
    // overlap needs a second thread that may call MPI while the grad-reduce helper does
    ms.overlap_shared = overlap_shared && cfg.n_shared_experts > 0;
    if ((a2a_chunks > 1 || ms.overlap_shared) && par && par->ep_size() > 1 &&
        par->world().threads_multiple()) {
        a2a_helper_ = std::make_unique<HelperThread>();
    }
    for (int l = 0; l < cfg.n_layer; ++l) {
        if (cfg.is_moe_block(l)) {
            ms.gate.layer = static_cast<int>(moe_.size());
            moe_index_.push_back(static_cast<int>(moe_.size()));
            moe_.push_back(
                std::make_unique<moe::MoELayer>(ms, static_cast<int>(N), par, shared, scratch));
            moe_.back()->set_a2a_helper(a2a_helper_.get());
        } else {
            moe_index_.push_back(-1);
        }
    }
}

GPT::~GPT() = default;

const float* GPT::logits() const { return a_->logits; }

void GPT::zero_grad() {
    constexpr size_t kChunk = 4096;  // floats: a page, so that no two threads share a line
    const size_t n          = grads_.size();
    float* g                = grads_.data();
    parallel_for(static_cast<int64_t>((n + kChunk - 1) / kChunk), [&](int64_t begin, int64_t end) {
        const size_t lo = static_cast<size_t>(begin) * kChunk;
        const size_t hi = std::min(n, static_cast<size_t>(end) * kChunk);
        // streamed: the backward's last layers read them first, long after this pass
        zero_stream(g + lo, hi - lo);
    });
}

void GPT::hold_compute_weights() {
    BGL_CHECK(B_ > 0, "GPT::hold_compute_weights: before any forward");
    hold_compute_ = true;
}

void GPT::keep_masters_in_place() {
    BGL_CHECK(prec_.dtype == Dtype::bfloat16, "GPT::keep_masters_in_place: {} is not bf16",
              dtype_name(prec_.dtype));
    BGL_CHECK(!hold_compute_, "GPT::keep_masters_in_place: while the compute weights are held");
    if (masters_in_place_) return;
    round_half_stored();  // the values written so far, as the next forward would have
    masters_in_place_ = true;
    compute_          = plan_compute_copies(layout_, prec_, true);
    kc_               = Buffer<float>(compute_.kept_floats);
    use_o1_copies(o1_copies_);
}

void GPT::round_half_stored() {
    if (half_rounded_) return;
    for (const size_t i : compute_.half) {
        const ParamSpec& s = layout_.spec(i);
        round_inplace(params_.data() + s.offset, s.numel, prec_.dtype);
    }
    half_rounded_ = true;
}

void GPT::refresh_compute_weights() {
    // values written through params() (the initial weights, a model loaded or set from outside)
    // take their stored dtype here; after the optimizer's rounded update there is nothing to do
    round_half_stored();
    // tensor i rounded to dst + at[i], for every tensor with a place there
    const auto round_copies = [&](const std::vector<size_t>& at, float* dst) {
        for (size_t i = 0; i < at.size(); ++i) {
            if (at[i] == ComputeCopies::kNone) continue;
            const ParamSpec& s = layout_.spec(i);
            round_copy(dst + at[i], params_.data() + s.offset, s.numel, prec_.dtype);
        }
    };
    // the tensors whose FP32 masters are kept in place and that some reader takes as floats
    round_copies(compute_.kept, kc_.data());
    // the GEMM path may have changed since the last forward (BGL_GEMM=auto's choices are per
    // shape, but a test or bench can switch paths): the copies follow what the products do now
    const bool copies = !half_products_convert(prec_.dtype);
    if (copies != o1_copies_) use_o1_copies(copies);
    if (!copies) return;
    round_copies(compute_.at, wc_.data());
    if (head_copy_) {
        round_copy(wte_head_.data(), params_.data() + layout_.find("wte")->offset, wte_head_.size(),
                   prec_.gemm_dtype(LayerClass::head));
    }
}

void GPT::use_o1_copies(bool copies) {
    o1_copies_        = copies;
    const int ep_size = par_ep_size_, ep_rank = par_ep_rank_;
    if (copies && wc_.size() < compute_.floats) wc_ = Buffer<float>(compute_.floats);
    w_ = resolve_each<const float>(
        layout_, cfg_,
        [this](const ParamSpec& s) -> const float* {
            const size_t i = static_cast<size_t>(&s - layout_.specs().data());
            if (compute_.kept[i] != ComputeCopies::kNone) return kc_.data() + compute_.kept[i];
            const size_t at = compute_.at[i];
            return at == ComputeCopies::kNone || !o1_copies_ ? params_.data() + s.offset
                                                             : wc_.data() + at;
        },
        ep_size, ep_rank);
    head_w_ = w_.wte;
    if (copies && head_copy_) {
        const size_t n = static_cast<size_t>(cfg_.vocab_size) * static_cast<size_t>(cfg_.d_model);
        if (wte_head_.size() < n) wte_head_ = Buffer<float>(n);
        head_w_ = wte_head_.data();
    }
}

namespace {
// The kernels of the numerically sensitive ops: float32, or FP64 inside (kernels/mixed.h).
struct SensitiveOps {
    decltype(&layernorm_forward) ln_fwd;
    decltype(&layernorm_backward) ln_bwd;
    decltype(&crossentropy_forward) ce_fwd;  // backward: crossentropy_linear_backward_half
};
SensitiveOps sensitive_ops(bool fp64) {
    if (fp64) {
        return {layernorm_forward_f64, layernorm_backward_f64, crossentropy_forward_f64};
    }
    return {layernorm_forward, layernorm_backward, crossentropy_forward};
}
}  // namespace

void GPT::set_routing_context(const moe::RoutingContext& ctx) {
    for (auto& layer : moe_) layer->set_routing_context(ctx);
}

static moe::MoEWeights moe_weights(const BlockTensors<const float>& b) {
    return moe::MoEWeights{b.gate_w, b.noise_w, b.experts, b.shared};
}

// Mixed precision (model/precision.h): each class rounds its GEMMs' operands to its GEMM dtype
// (activations where they are stored, weights in wc_, and activation gradients as they enter a
// backward GEMM) and, from O2, its GEMM outputs to its activation dtype; bf16 products of the
// dense layers run through gemm_bf16 (kernels/mixed.h). The residual stream,
// parameter gradients and the other ops stay float32. With the float32 policy every rounding is
// a no-op and the results are those of the plain float32 model, bit for bit.
double GPT::forward(const int32_t* tokens, const int32_t* targets, int B, int T,
                    std::optional<float> loss_scale) {
    BGL_CHECK(B >= 1 && B <= max_batch_ && T >= 1 && T <= cfg_.seq_len,
              "forward({}, {}) outside the planned {} x {}", B, T, max_batch_, cfg_.seq_len);
    B_          = B;
    T_          = T;
    const int N = B * T, C = cfg_.d_model, V = cfg_.vocab_size;
    const size_t NC = static_cast<size_t>(N) * C;
    Acts& a         = *a_;
    std::copy(tokens, tokens + N, a.tokens.data());
    std::copy(targets, targets + N, a.targets.data());
    for (auto& layer : moe_) layer->set_seq_len(T);
    if (prec_.mixed() && !hold_compute_) refresh_compute_weights();
    const SensitiveOps op = sensitive_ops(prec_.fp64_sensitive);
    const Dtype gh = prec_.gemm_dtype(LayerClass::head), ah = prec_.act_dtype(LayerClass::head);

    embedding_forward(a.resid[0], a.tokens.data(), w_.wte, w_.wpe, B, T, C);
    round_inplace(a.resid[0], NC, prec_.act_dtype(LayerClass::embedding));
    aux_loss_ = 0;
    for (int l = 0; l < cfg_.n_layer; ++l) aux_loss_ += block_forward(l);
    if (a.head16) {
        // only the head's products read ln_f's output: only its 16 bits are kept. The logits a
        // block of rows at a time, each reduced to its losses and, given the backward's scale,
        // to its 16-bit gradient while in cache (the same bits as the unfused head's backward)
        layernorm_forward_narrow(gh, a.lnf16, a.lnf_mean, a.lnf_rstd, a.resid.back(), w_.lnf_w,
                                 w_.lnf_b, N, C, prec_.fp64_sensitive);
        PhaseScope lm_head(Phase::lm_head);
        if (loss_scale) set_dlosses(*loss_scale);
        head16_blocks(true, loss_scale);
        double sum = 0;
        for (int i = 0; i < N; ++i) sum += a.losses[i];
        return sum / N;
    }
    op.ln_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, a.resid.back(), w_.lnf_w, w_.lnf_b, N, C);
    round_operand(a.lnf, NC, gh);  // only the head's products read it
    PhaseScope lm_head(Phase::lm_head);
    // fused: the same per-row math over blocks of head_rows_ tokens (the GEMM gives a row the
    // same sums whatever the number of rows), so the losses are those of the unfused head
    const int rows = head_rows_ > 0 ? head_rows_ : N;
    for (int r0 = 0; r0 < N; r0 += rows) {
        const int n = std::min(rows, N - r0);
        linear_forward_half(gh, a.logits, a.lnf + static_cast<size_t>(r0) * C, head_w_, nullptr, n,
                            C, V, ah);
        op.ce_fwd(a.losses + r0, a.logits, a.targets.data() + r0, n, V, a.head_lse + r0);
    }
    double sum = 0;
    for (int i = 0; i < N; ++i) sum += a.losses[i];
    return sum / N;
}

void GPT::set_dlosses(float loss_scale) {
    const int N = B_ * T_;
    for (int i = 0; i < N; ++i) a_->dlosses[i] = loss_scale / static_cast<float>(N);
}

void GPT::head16_blocks(bool losses, std::optional<float> grad_scale) {
    Acts& a     = *a_;
    const int N = B_ * T_, C = cfg_.d_model, V = cfg_.vocab_size;
    const Dtype gh = prec_.gemm_dtype(LayerClass::head), ah = prec_.act_dtype(LayerClass::head);
    const SensitiveOps op = sensitive_ops(prec_.fp64_sensitive);
    // the weight narrowed once for all the blocks where the products convert
    const uint16_t* w16 = half_products_convert(gh)
                              ? narrow_weight(gh, head_w_, static_cast<size_t>(V) * C)
                              : nullptr;
    for (int r0 = 0; r0 < N; r0 += head16_rows_) {
        const int n         = std::min(head16_rows_, N - r0);
        const uint16_t* x16 = a.lnf16 + static_cast<size_t>(r0) * C;
        if (w16) {
            linear_forward_w16(gh, a.logits, x16, w16, n, C, V, ah);
        } else {
            linear_forward_kept16(gh, a.logits, x16, head_w_, nullptr, n, C, V, ah);
        }
        if (losses) {
            op.ce_fwd(a.losses + r0, a.logits, a.targets.data() + r0, n, V, a.head_lse + r0);
        }
        if (grad_scale) {
            crossentropy_backward_narrow(gh, a.head16 + static_cast<size_t>(r0) * V, a.logits,
                                         a.targets.data() + r0, a.dlosses + r0, n, V,
                                         prec_.fp64_sensitive, a.head_lse + r0);
        }
    }
    head16_scale_ = grad_scale;
}

double GPT::block_forward(int l) {
    const int B = B_, T = T_, N = B * T, C = cfg_.d_model, F = cfg_.d_ff, NH = cfg_.n_head;
    const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
    const SensitiveOps op = sensitive_ops(prec_.fp64_sensitive);
    const Dtype ga        = prec_.gemm_dtype(LayerClass::attention),
                aa        = prec_.act_dtype(LayerClass::attention);
    const Dtype gf = prec_.gemm_dtype(LayerClass::ffn), af = prec_.act_dtype(LayerClass::ffn);
    Acts& a        = *a_;
    const auto& w  = w_.blocks[static_cast<size_t>(l)];
    auto& b        = a.blocks[static_cast<size_t>(l)];
    const float* x = a.resid[static_cast<size_t>(l)];
    float* y       = a.resid[static_cast<size_t>(l) + 1];
    double aux     = 0;
    if (b.ln1_16) {  // only the qkv products read it: only their 16-bit operand is kept
        layernorm_forward_narrow(ga, b.ln1_16, b.ln1_mean, b.ln1_rstd, x, w.ln1_w, w.ln1_b, N, C,
                                 prec_.fp64_sensitive);
    } else {
        op.ln_fwd(b.ln1, b.ln1_mean, b.ln1_rstd, x, w.ln1_w, w.ln1_b, N, C);
        round_operand(b.ln1, NC, ga);  // only the qkv products read it
    }
    if (b.qkv16) {
        // Q, K, V and the output only as the 16 bits the core and the products read: qkv formed
        // in the backward scratch dqkv (free in forward) and narrowed from there
        PhaseScope phase(Phase::attention);
        linear_forward_kept16(ga, a.dqkv, b.ln1_16, w.qkv_w, w.qkv_b, N, C, 3 * C, ga, b.qkv16);
        attention_forward_half16(ga, b.atty16, b.lse, b.qkv16, B, T, C, NH);
        linear_forward_kept16(ga, b.res1, b.atty16, w.proj_w, w.proj_b, N, C, C, aa);
    } else {
        PhaseScope phase(Phase::attention);
        if (b.ln1_16) {
            linear_forward_kept16(ga, b.qkv, b.ln1_16, w.qkv_w, w.qkv_b, N, C, 3 * C, aa);
        } else {
            linear_forward_half(ga, b.qkv, b.ln1, w.qkv_w, w.qkv_b, N, C, 3 * C, aa);
        }
        // without the bf16 core the float core reads bf16 values, as a kept qkv16 would give
        if (attention_rounds_qkv(ga, C / NH, prec_.fp64_sensitive))
            round_inplace(b.qkv, 3 * NC, ga);
        if (prec_.fp64_sensitive) {
            attention_forward_f64(b.atty, b.lse, b.qkv, B, T, C, NH);
        } else {
            attention_forward_half(ga, b.atty, b.lse, b.qkv, B, T, C, NH);
        }
        round_inplace(b.atty, NC, ga);
        linear_forward_half(ga, b.res1, b.atty, w.proj_w, w.proj_b, N, C, C, aa);
    }
    add_forward(b.res1, b.res1, x, NC);
    const int mi = moe_index_[static_cast<size_t>(l)];
    // a dense block's fc products are its only readers; a MoE layer's router reads it too
    if (b.ln2_16) {
        layernorm_forward_narrow(gf, b.ln2_16, b.ln2_mean, b.ln2_rstd, b.res1, w.ln2_w, w.ln2_b, N,
                                 C, prec_.fp64_sensitive);
    } else {
        op.ln_fwd(b.ln2, b.ln2_mean, b.ln2_rstd, b.res1, w.ln2_w, w.ln2_b, N, C);
        if (mi >= 0) {
            round_inplace(b.ln2, NC, gf);
        } else {
            round_operand(b.ln2, NC, gf);
        }
    }
    if (mi >= 0) {
        PhaseScope phase(Phase::gate_dispatch);  // the layer times its experts itself
        aux = moe_[static_cast<size_t>(mi)]->forward(y, b.ln2, moe_weights(w), N);
    } else {
        PhaseScope phase(Phase::mlp);
        // the GELU's output only feeds the next product: it goes to the backward scratch df
        // (free during forward), and backward computes it again from fch; a 16-bit fch is
        // formed in df and narrowed from there
        float* hf = b.fch.half ? a.df : b.fch.f32;
        if (b.ln2_16) {
            linear_forward_kept16(gf, hf, b.ln2_16, w.fc_w, w.fc_b, N, C, F, af, b.fch.half);
        } else {
            linear_forward_half(gf, hf, b.ln2, w.fc_w, w.fc_b, N, C, F, af, b.fch.half);
        }
        if (half_products_convert(gf)) {
            // the GELU's output only as the next product's 16-bit operand, formed in df's
            // storage from fch (a 16-bit fch is read rather than hf in df, the same values)
            auto* g16 = reinterpret_cast<uint16_t*>(a.df);
            gelu_forward_narrow(gf, g16, af, b.fch, NF, prec_.fp64_sensitive);
            linear_forward_half16(gf, y, g16, w.fcproj_w, w.fcproj_b, N, F, C, af);
        } else {
            gelu_forward_kept(af, a.df, {hf, nullptr}, NF, prec_.fp64_sensitive, gf);
            linear_forward_half(gf, y, a.df, w.fcproj_w, w.fcproj_b, N, F, C, af);
        }
    }
    add_forward(y, y, b.res1, NC);
    return aux;
}

void GPT::backward(float loss_scale, float aux_scale, FunctionRef<void(size_t from)> grads_ready) {
    const int B = B_, T = T_, N = B * T, C = cfg_.d_model, F = cfg_.d_ff, V = cfg_.vocab_size,
              NH = cfg_.n_head;
    BGL_CHECK(N > 0, "backward without forward");
    const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
    Acts& a               = *a_;
    const SensitiveOps op = sensitive_ops(prec_.fp64_sensitive);
    const Dtype ga        = prec_.gemm_dtype(LayerClass::attention),
                gf = prec_.gemm_dtype(LayerClass::ffn), gh = prec_.gemm_dtype(LayerClass::head);
    // d (N, C) as a GEMM operand of dtype d: itself for float32 or where the products convert
    // their operands (kernels/mixed.h, round_operand), else a rounded copy.
    auto operand = [&](const float* d, Dtype dt) -> const float* {
        if (dt == Dtype::float32 || half_products_convert(dt)) return d;
        if (dround_.size() < NC) {
            dround_ = Buffer<float>(static_cast<size_t>(max_batch_) * cfg_.seq_len * C);
        }
        round_copy(dround_.data(), d, NC, dt);
        return dround_.data();
    };
    {
        PhaseScope phase(Phase::lm_head);
        set_dlosses(loss_scale);
        if (a.head16) {
            // the 16-bit gradient forward formed, or formed now from the logits computed again
            if (head16_scale_ != loss_scale) {
                ++head16_recomputes_;
                head16_blocks(false, loss_scale);
            }
            head16_scale_.reset();  // backward runs once a forward
            linear_backward_dout16(gh, a.dc, g_.wte, nullptr, a.head16, nullptr, a.lnf16, head_w_,
                                   N, C, V);
        } else if (head_rows_ == 0) {
            crossentropy_linear_backward_half(gh, a.dc, g_.wte, a.logits, a.targets.data(),
                                              a.dlosses, a.lnf, head_w_, N, C, V,
                                              prec_.fp64_sensitive, a.head_lse);
        } else {
            // fused: recompute each block's logits as forward did, then its dlogits; dx rows are
            // the unfused ones, dwte sums the blocks' products one after another
            const Dtype ah = prec_.act_dtype(LayerClass::head);
            for (int r0 = 0; r0 < N; r0 += head_rows_) {
                const int n      = std::min(head_rows_, N - r0);
                const float* lnf = a.lnf + static_cast<size_t>(r0) * C;
                linear_forward_half(gh, a.logits, lnf, head_w_, nullptr, n, C, V, ah);
                crossentropy_linear_backward_half(
                    gh, a.dc + static_cast<size_t>(r0) * C, g_.wte, a.logits, a.targets.data() + r0,
                    a.dlosses + r0, lnf, head_w_, n, C, V, prec_.fp64_sensitive, a.head_lse + r0);
            }
        }
    }
    std::fill(a.dresid, a.dresid + NC, 0.0f);
    op.ln_bwd(a.dresid, g_.lnf_w, g_.lnf_b, a.dc, a.resid.back(), w_.lnf_w, a.lnf_mean, a.lnf_rstd,
              N, C);
    // the layout is wte, wpe, blocks in order, ln_f: all after a block's first float is final
    // once that block is done (wte, the LM head, only after the embedding)
    const auto flat = [&](const float* p) { return static_cast<size_t>(p - grads_.data()); };
    if (grads_ready) grads_ready(flat(g_.lnf_w));
    for (int l = cfg_.n_layer - 1; l >= 0; --l) {
        const auto& w  = w_.blocks[static_cast<size_t>(l)];
        auto& g        = g_.blocks[static_cast<size_t>(l)];
        auto& b        = a.blocks[static_cast<size_t>(l)];
        const float* x = a.resid[static_cast<size_t>(l)];
        const int mi   = moe_index_[static_cast<size_t>(l)];
        // recompute: the block's (or its MoE layer's) forward again, unless it ran last
        if (recompute_ == Recompute::block && l < cfg_.n_layer - 1) {
            RecomputeScope rs;
            block_forward(l);  // writes x_{l+1} again, bit for bit; backward no longer reads it
        } else if (recompute_ == Recompute::moe && mi >= 0 &&
                   mi < static_cast<int>(moe_.size()) - 1) {
            RecomputeScope rs;
            PhaseScope phase(Phase::gate_dispatch);
            moe_[static_cast<size_t>(mi)]->forward(a.dc2, b.ln2, moe_weights(w),
                                                   N);  // dc2: scratch
        }
        // feed-forward: dresid holds d x_{l+1} = d ffn_out, and flows on to d res1
        if (mi >= 0) {
            PhaseScope phase(Phase::gate_dispatch);  // the layer times its experts itself
            moe::MoEGrads mg{g.gate_w, g.noise_w, g.experts, g.shared};
            moe_[static_cast<size_t>(mi)]->backward(a.dc, mg, a.dresid, b.ln2, moe_weights(w),
                                                    aux_scale);
        } else {
            PhaseScope phase(Phase::mlp);
            // gelu(fch) again into df, as forward made it, for the weight gradient; then df
            // becomes its gradient
            const float* dy = operand(a.dresid, gf);
            const Dtype af  = prec_.act_dtype(LayerClass::ffn);
            const bool f64  = prec_.fp64_sensitive;
            if (half_products_convert(gf)) {  // as forward: only its 16 bits, in df's storage
                auto* g16 = reinterpret_cast<uint16_t*>(a.df);
                gelu_forward_narrow(gf, g16, af, b.fch, NF, f64);
                // one call, dy narrowed once: the weight gradient reads g16 before the input
                // gradient overwrites it in df
                linear_backward_half16(gf, a.df, g.fcproj_w, g.fcproj_b, dy, g16, w.fcproj_w, N, F,
                                       C);
                // dh only as the products' 16 bits, formed from df and never stored as floats
                const uint16_t* dh16 = gelu_backward_dout(gf, af, b.fch, a.df, NF, f64);
                linear_backward_dout16(gf, a.dc, g.fc_w, g.fc_b, dh16, b.ln2, b.ln2_16, w.fc_w, N,
                                       C, F);
            } else {
                gelu_forward_kept(af, a.df, b.fch, NF, f64, gf);
                linear_backward_half(gf, nullptr, g.fcproj_w, g.fcproj_b, dy, a.df, w.fcproj_w, N,
                                     F, C);
                linear_backward_half(gf, a.df, nullptr, nullptr, dy, nullptr, w.fcproj_w, N, F, C);
                // dh rounded as the products' operand
                gelu_backward_kept(af, a.df, b.fch, a.df, NF, f64, gf);
                if (b.ln2_16) {
                    linear_backward_kept16(gf, a.dc, g.fc_w, g.fc_b, a.df, b.ln2_16, w.fc_w, N, C,
                                           F);
                } else {
                    linear_backward_half(gf, a.dc, g.fc_w, g.fc_b, a.df, b.ln2, w.fc_w, N, C, F);
                }
            }
        }
        op.ln_bwd(a.dresid, g.ln2_w, g.ln2_b, a.dc, b.res1, w.ln2_w, b.ln2_mean, b.ln2_rstd, N, C);
        // attention: dresid holds d res1 = d attn_out, and flows on to d x_l
        if (b.qkv16) {  // Q, K, V and the output as their 16 bits
            PhaseScope phase(Phase::attention);
            linear_backward_kept16(ga, a.dc, g.proj_w, g.proj_b, operand(a.dresid, ga), b.atty16,
                                   w.proj_w, N, C, C);
            const uint16_t* dqkv16 =
                attention_backward_dout16(ga, a.dqkv, a.dc, b.qkv16, b.atty16, b.lse, B, T, C, NH);
            if (dqkv16) {
                linear_backward_dout16(ga, a.dc2, g.qkv_w, g.qkv_b, dqkv16, nullptr, b.ln1_16,
                                       w.qkv_w, N, C, 3 * C);
            } else {
                round_operand(a.dqkv, 3 * NC, ga);
                linear_backward_kept16(ga, a.dc2, g.qkv_w, g.qkv_b, a.dqkv, b.ln1_16, w.qkv_w, N, C,
                                       3 * C);
            }
        } else {
            PhaseScope phase(Phase::attention);
            linear_backward_half(ga, a.dc, g.proj_w, g.proj_b, operand(a.dresid, ga), b.atty,
                                 w.proj_w, N, C, C);
            if (half_products_convert(ga)) {  // dqkv only as the products' 16 bits
                const uint16_t* dqkv16 = attention_backward_dout(
                    ga, a.dqkv, a.dc, b.qkv, b.atty, b.lse, B, T, C, NH, prec_.fp64_sensitive);
                linear_backward_dout16(ga, a.dc2, g.qkv_w, g.qkv_b, dqkv16, b.ln1, b.ln1_16,
                                       w.qkv_w, N, C, 3 * C);
            } else {
                if (prec_.fp64_sensitive) {
                    attention_backward_f64(a.dqkv, a.dc, b.qkv, b.atty, b.lse, B, T, C, NH);
                } else {
                    attention_backward_half(ga, a.dqkv, a.dc, b.qkv, b.atty, b.lse, B, T, C, NH);
                }
                round_operand(a.dqkv, 3 * NC, ga);
                if (b.ln1_16) {
                    linear_backward_kept16(ga, a.dc2, g.qkv_w, g.qkv_b, a.dqkv, b.ln1_16, w.qkv_w,
                                           N, C, 3 * C);
                } else {
                    linear_backward_half(ga, a.dc2, g.qkv_w, g.qkv_b, a.dqkv, b.ln1, w.qkv_w, N, C,
                                         3 * C);
                }
            }
        }
        op.ln_bwd(a.dresid, g.ln1_w, g.ln1_b, a.dc2, x, w.ln1_w, b.ln1_mean, b.ln1_rstd, N, C);
        if (grads_ready) grads_ready(flat(g.ln1_w));
    }
    embedding_backward(g_.wte, g_.wpe, a.dresid, a.tokens.data(), B, T, C);
    if (grads_ready) grads_ready(0);
}

double forward_flops_per_token(const ModelConfig& cfg, int T) {
    const double C = cfg.d_model, F = cfg.d_ff, V = cfg.vocab_size, K = cfg.top_k;
    double f = 0;
    for (int l = 0; l < cfg.n_layer; ++l) {
        f += 2 * C * 3 * C + 2 * C * C;  // qkv, proj
        f += 2 * 2 * C * T / 2.0 *
             1.0;  // causal attention: scores and weighted sum, T/2 keys on average
        if (cfg.is_moe_block(l)) {
            f += 2 * C * cfg.gate_rows() + K * 2 * (2 * C * cfg.expert_width());  // gate, experts
            f += cfg.n_shared_experts * 2 * (2 * C * cfg.shared_width());         // shared experts
        } else {
            f += 2 * (2 * C * F);
        }
    }
    f += 2 * C * V;  // LM head
    return f;
}

Recomputed recomputed(const ModelConfig& cfg, Recompute recompute) {
    Recomputed r;
    int n_moe = 0;
    for (int l = 0; l < cfg.n_layer; ++l) n_moe += cfg.is_moe_block(l) ? 1 : 0;
    if (recompute == Recompute::block) {
        for (int l = 0; l + 1 < cfg.n_layer; ++l) {
            ++r.blocks;
            ++(cfg.is_moe_block(l) ? r.moe_layers : r.dense_mlps);
        }
    } else if (recompute == Recompute::moe) {
        r.moe_layers = std::max(0, n_moe - 1);
    }
    return r;
}

double GPT::flops_per_token(int T) const { return forward_flops_per_token(cfg_, T); }

moe::BalanceBiases GPT::balance_biases() const {
    moe::BalanceBiases out;
    for (const auto& layer : moe_) {
        const moe::BalanceBias& b = layer->balance_bias();
        out.emplace_back(b.values(), b.values() + b.E());
    }
    return out;
}

void GPT::set_balance_biases(const moe::BalanceBiases& b) {
    if (b.empty()) return;
    BGL_CHECK(b.size() == moe_.size(), "{} balance biases for {} MoE layers", b.size(),
              moe_.size());
    for (size_t i = 0; i < moe_.size(); ++i) moe_[i]->balance_bias().set(b[i]);
}

}  // namespace bagualu::model

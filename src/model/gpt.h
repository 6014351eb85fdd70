// GPT-2-style decoder with MoE feed-forward blocks: explicit forward and backward, no autograd.
//   x_0     = wte[tokens] + wpe[0..T)
//   block l: a = x_l + attn(ln_1(x_l));  x_{l+1} = a + ffn(ln_2(a))  (ffn = MLP or MoE)
//   logits  = ln_f(x_L) @ wte^T;  loss = mean_t CE(logits_t, target_t) (+ MoE aux losses)
// docs/model.md states the math, names, shapes and initialisation exactly.
// Dimension letters: B batch, T sequence, C d_model, F d_ff, V vocab, NH heads, N = B*T.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/function_ref.h"
#include "dist/parallel.h"
#include "model/param_layout.h"
#include "model/precision.h"
#include "model/tensor_table.h"
#include "moe/moe_layer.h"

namespace bagualu::model {

// The parameter names, shapes and order of a model, from model/tensor_table.h (docs/model.md
// lists them). With expert parallelism a rank holds only experts
// [ep_rank * E/ep_size, (ep_rank + 1) * E/ep_size) of each MoE layer; they keep their global
// expert ids in their names.
ParamLayout make_layout(const ModelConfig& cfg, int ep_size = 1, int ep_rank = 0);
// The size of make_layout(cfg, ep_size, any rank) without building it (paper-scale models have
// millions of expert tensors): floats per rank, padding included, and real parameters of the
// whole model (all experts, as make_layout(cfg).num_params()).
struct LayoutSize {
    uint64_t dense_floats  = 0;  // replicated tensors on one rank (the MoE gates included)
    uint64_t expert_floats = 0;  // this rank's experts
    uint64_t full_params   = 0;
    uint64_t rank_floats() const { return dense_floats + expert_floats; }
};
LayoutSize layout_size(const ModelConfig& cfg, int ep_size = 1);
// The tensors of make_layout(cfg, ep_size, 0) by kind, in layout order: fn(spec, count) gets the
// spec of the kind's first tensor (name, shape, numel, decay, expert; offset 0) and how many
// tensors of that kind follow one another (E/ep_size for a kind of expert tensor, else 1).
// layout_size sums over it; `bagualu plan` splits it by precision (tests/unit/plan checks it
// against make_layout).
void for_each_param_kind(const ModelConfig& cfg, int ep_size,
                         FunctionRef<void(const ParamSpec&, uint64_t)> fn);
// Resolves the layout's offsets into pointers into `base`.
template <typename P>
ModelTensors<P> resolve(const ParamLayout& layout, const ModelConfig& cfg, P* base, int ep_size = 1,
                        int ep_rank = 0);
// The same with each tensor where at(spec) says; an expert kind's tensors must keep one stride.
template <typename P>
ModelTensors<P> resolve_each(const ParamLayout& layout, const ModelConfig& cfg,
                             FunctionRef<P*(const ParamSpec&)> at, int ep_size = 1,
                             int ep_rank = 0);
// GPT-2 initialisation: weights N(0, init_std), residual projections N(0, init_std/sqrt(2L)),
// biases 0, layernorm weight 1. Each tensor draws from its own stream Rng(seed, i + 1), i its
// index in the full (single-process) layout, so every layout initialises identically.
void init_params(float* params, const ParamLayout& layout, const ModelConfig& cfg, uint64_t seed);

// Mixed precision: what forward rounds before it computes, all to the policy's half type.
// The half-stored tensors (`half`, indices into the layout) are rounded in place and computed
// from; the float32-stored ones computed in half (O1 GEMM weights) get rounded copies, packed in
// layout order into one array of `floats`: at[i] is tensor i's offset there, kNone for a tensor
// computed from its parameter. GPT allocates and rounds them; the planner counts them.
// masters_in_place (GPT::keep_masters_in_place): the O2 tensors hold their FP32 masters and are
// not rounded in place; their GEMM weight matrices join the O1 weights (read in place where the
// products round them, else copies in `at`), and the others (biases, an O2 embedding), which
// readers take as floats, get rounded copies on every forward: kept[i] is tensor i's offset in
// an array of kept_floats, kNone for the rest.
struct ComputeCopies {
    static constexpr size_t kNone = ~size_t{0};
    std::vector<size_t> at;
    size_t floats = 0;
    std::vector<size_t> half;
    std::vector<size_t> kept;
    size_t kept_floats = 0;
};
ComputeCopies plan_compute_copies(const ParamLayout& layout, const PrecisionPolicy& prec,
                                  bool masters_in_place = false);

// Floats of GPT's activation arena for forward/backward over max_batch sequences of seq_len
// (saved activations, logits, backward scratch); the constructor sizes its arena with it.
// head_rows > 0: the fused LM head (GPT's head_rows), whose logits take head_rows x V floats
// instead of N x V. recompute = block keeps each block's input and one block's working set (the
// block running forward or backward); none and moe keep every block's activations.
// hidden: the dtype the dense MLPs keep their pre-activation in (PrecisionPolicy::act_dtype of
// the ffn class: 16 bits for a half type). ln_attn, ln_ffn: the GEMM dtypes of the attention and
// ffn classes (PrecisionPolicy::gemm_dtype): a half one keeps ln_1's output (and a dense block's
// ln_2's, without block recomputation) in 16 bits, the values its products read. attn16: the
// attention core keeps Q, K, V and its output in 16 bits (attention_in_16_bits). head16 (with
// head_rows = 0): the LM head's output gradient formed in forward and kept in 16 bits
// (head_gradient_in_16_bits): ln_f's output as its 16 bits, head_block_rows x V floats of
// logits and N x V 16-bit values of their gradient instead of N x V floats.
size_t activation_floats(const ModelConfig& cfg, int64_t max_batch, int64_t head_rows = 0,
                         Recompute recompute = Recompute::none, Dtype hidden = Dtype::float32,
                         Dtype ln_attn = Dtype::float32, Dtype ln_ffn = Dtype::float32,
                         bool attn16 = false, bool head16 = false);
// Whether a model of cfg under prec keeps its attention's Q, K, V and output only as 16 bits on
// this machine: where its bf16 attention core reads them so with the same bits, or where no
// bf16 core runs and the float core reads them rounded and widened (kernels::attention_kept16,
// which depends on the GEMM path and the head size).
bool attention_in_16_bits(const ModelConfig& cfg, const PrecisionPolicy& prec);
// Tests: off makes the models built after it keep Q, K, V and the attention's output as floats
// (attention_in_16_bits false), on (the default) lets attention_in_16_bits decide. Not
// thread-safe: set between models.
void attention_16bit_activations(bool on);
// Whether a GPT under prec with head_rows (0: unfused) forms the LM head's output
// gradient in forward, a block of rows of logits at a time, and keeps it only as its 16 bits
// (GPT::forward's loss_scale): an unfused head whose products take 16-bit operands
// (kernels::half_products_convert of the head's GEMM dtype, bf16), the values its backward's
// products read, bitwise. Its (N, V) float logits are then never stored.
bool head_gradient_in_16_bits(const PrecisionPolicy& prec, int64_t head_rows);
// Tests: off makes the models built after it keep the unfused head's (N, V) float logits
// (head_gradient_in_16_bits false), on (the default) lets head_gradient_in_16_bits decide. Not
// thread-safe: set between models.
void head_gradient_16bit(bool on);
// Rows of logits per block where head_gradient_in_16_bits: about 2^21 floats (8 MiB), at least
// 64 rows (a GEMM of fewer rows packs its weight for too few).
int64_t head_block_rows(const ModelConfig& cfg);
// Rows per block of the fused LM head: a multiple of 768 rows (so that it gives the unfused head's
// bits with our GEMMs, gpt.cpp), about 2^22 logits (16 MiB) when V allows, at least 768 rows.
int64_t fused_head_rows(const ModelConfig& cfg);
// What backward runs forward again for under `recompute` (GPT below): blocks whole (block:
// all but the last), and of those or alone the MoE layers and dense MLPs (moe: every MoE
// layer but the last). The planner counts the extra forward with it.
struct Recomputed {
    int blocks = 0, moe_layers = 0, dense_mlps = 0;
};
Recomputed recomputed(const ModelConfig& cfg, Recompute recompute);
// Forward FLOPs per token of the matrix products and attention at sequence length T (2 per
// multiply-add; training = 3x). GPT::flops_per_token and the planner both use it.
double forward_flops_per_token(const ModelConfig& cfg, int T);

class GPT {
   public:
    // max_batch: the most sequences one forward will see. par: nullptr for one process.
    // virtual_workers: swipe workers each rank of an EP group simulates (parallel section).
    // prec: the mixed-precision policy (model/precision.h); the default is float32 throughout.
    // head_rows > 0 fuses the LM head with the cross-entropy: the logits of head_rows tokens
    // at a time are computed, reduced to losses and dropped, and backward recomputes them
    // block by block, so the (N, V) logits are never stored (logits() then holds only a
    // block). 0 stores all N x V logits, or where head_gradient_in_16_bits their gradient's 16
    // bits (logits() then holds a block too).
    // recompute (train.recompute): what backward runs forward again for instead of keeping it.
    //   none:  every activation is kept.
    //   moe:   of each MoE layer only its input (ln_2's output) is kept; backward runs the
    //          router, permute, dispatch, experts and combine forward again before the layer's
    //          backward (the all-to-all too, on every rank in the same order), and the MoE
    //          layers share one set of buffers (moe::MoEBuffers).
    //   block: only each block's input (the residual stream) is kept; backward runs the whole
    //          block forward again into one shared working set.
    // The routing's randomness is a function of the routing context (seed, micro-step), and
    // the recomputed forward gives the very values of the first: results are bitwise those of
    // none. The last block (block) or MoE layer (moe) is not run again: its forward is still
    // in the buffers. Statistics (routing stats, aux_loss()) are those of forward().
    GPT(const ModelConfig& cfg, int max_batch, dist::ParallelContext* par = nullptr,
        int virtual_workers = 1, const PrecisionPolicy& prec = {}, int head_rows = 0,
        Recompute recompute = Recompute::none, int a2a_chunks = 1, bool overlap_shared = false);
    ~GPT();

    const ModelConfig& config() const { return cfg_; }
    const ParamLayout& layout() const { return layout_; }
    const PrecisionPolicy& precision() const { return prec_; }
    // The dtype tensor layout().spec(i) is stored in. params() holds every tensor as floats; a
    // half-stored tensor's values are those of its dtype once the optimizer (which keeps the
    // FP32 masters) has stepped. After a writable params() (the initial weights, a checkpoint,
    // values set from outside) the next forward rounds them in place.
    Dtype storage_dtype(size_t i) const { return prec_.storage_dtype(layout_.spec(i)); }
    float* params() {
        float* p      = params_rounded_update();
        half_rounded_ = false;
        return p;
    }
    // Writable for an update that leaves every half-stored tensor holding values of its dtype,
    // as the optimizer's step does (dist/paro/optimizer.h: the rounded update from the FP32
    // master, or of the half parameter itself, and the all-gather of such shards; a skipped step
    // writes nothing): the next forward does not round them again, which would be a pass over
    // every half-stored parameter that changes no bit.
    float* params_rounded_update() {
        BGL_CHECK(!hold_compute_, "GPT::params(): writable while the compute weights are held");
        return params_.data();
    }
    const float* params() const { return params_.data(); }
    // Between hold_compute_weights() and release_compute_weights(), forwards reuse the compute
    // weights the last forward made (the half-stored tensors rounded, the O1 copies) instead of
    // making them again: for the micro-batches of one step, between which nothing writes the
    // parameters. Writable params() is refused meanwhile; hold only after a forward.
    void hold_compute_weights();
    void release_compute_weights() { hold_compute_ = false; }
    // Whether forward computes with rounded copies of the float32-stored weights it computes in
    // half (the O1 GEMM weights and, for a half head, wte): not where the products round their
    // operands themselves (kernels::half_products_convert), which is decided again at each
    // forward that is not held.
    bool o1_copies() const { return o1_copies_; }
    // From now on the O2 (half-stored, FP32-mastered) tensors hold their FP32 masters, which the
    // optimizer updates in place (model::masters_in_place): forward never rounds them in place
    // again, its products round the weight matrices themselves, and the tensors read as floats
    // (biases, an O2 embedding) are rounded into copies at each forward (plan_compute_copies).
    // Values written through params() before this call take their dtype now, as the next forward
    // would have rounded them; written after it (a checkpoint's masters) they are kept. bf16 only.
    void keep_masters_in_place();
    bool masters_in_place() const { return masters_in_place_; }
    float* grads() { return grads_.data(); }
    size_t n_floats() const { return layout_.total_floats(); }
    // Zeroes every gradient, the compute pool's threads each a contiguous part (one thread's
    // memset of a 64 MiB gradient took twice as long as two threads').
    void zero_grad();

    // tokens, targets: (B, T), T <= seq_len. Saves activations. Returns mean cross-entropy.
    // loss_scale: that of the backward to follow, where the caller knows it. Where
    // head_gradient_in_16_bits, the head then forms its output gradient here, a block of logits
    // at a time while it is in cache; a backward with another scale (or after a forward
    // without one) computes the logits again. The results are the same bits either way.
    double forward(const int32_t* tokens, const int32_t* targets, int B, int T,
                   std::optional<float> loss_scale = std::nullopt);
    // Routing of the following forwards: seed, micro-step and training (capacity, noise,
    // SWIPE) or inference (plain top-k). The default is inference.
    void set_routing_context(const moe::RoutingContext& ctx);
    // Sum of the MoE layers' aux losses of the last forward.
    double aux_loss() const { return aux_loss_; }
    // Backward of the last forward: grads += d(loss_scale * (CE + aux)) / d params.
    // grads_ready(from), when given, is called each time backward has written its last to the
    // gradient floats [from, n_floats()): after ln_f, after each block (from = the block's first
    // float; blocks go from the last to the first) and at the end (from = 0, the embeddings).
    void backward(float loss_scale, FunctionRef<void(size_t from)> grads_ready = {}) {
        backward(loss_scale, loss_scale, grads_ready);
    }
    // The same with its own scale for the routers' aux losses: grads += d(loss_scale * CE +
    // aux_scale * aux) / d params (a micro-batch of an uneven split weighs its mean
    // cross-entropy and the aux losses over all ranks differently: config/batch_split.h).
    void backward(float loss_scale, float aux_scale,
                  FunctionRef<void(size_t from)> grads_ready = {});
    // Backward passes whose LM head computed its logits again, where head_gradient_in_16_bits
    // (a backward with another scale than its forward's, or after a forward given none): none
    // in training, whose forwards are given the backward's scale.
    int64_t head_recomputes() const { return head16_recomputes_; }
    // (B*T, V) logits of the last forward (overwritten by backward); unfused head only, and not
    // where head_gradient_in_16_bits (then the last block's).
    const float* logits() const;
    // MoE layers in block order, for routing statistics.
    const std::vector<std::unique_ptr<moe::MoELayer>>& moe_layers() const { return moe_; }
    // Every MoE layer's balancing bias (moe/balance_bias.h), in block order; set_ replaces them
    // (one vector of E per MoE layer, or none to leave them as they are).
    moe::BalanceBiases balance_biases() const;
    void set_balance_biases(const moe::BalanceBiases& b);
    // Forward FLOPs per token of the dense matrix products (for MFU: training = 3x).
    double flops_per_token(int T) const;

   private:
    struct Acts;
    ModelConfig cfg_;
    int max_batch_;
    ParamLayout layout_;
    Buffer<float> params_, grads_;
    PrecisionPolicy prec_;
    // mixed precision: what forward rounds (plan_compute_copies), the copies in wc_
    // Where the products convert their float operands to 16 bits themselves (rounding to nearest
    // even: kernels::half_products_convert), the O1 weights are read where they lie and neither
    // copy is allocated or written (use_o1_copies): the same products, one pass and the copies'
    // memory less.
    ComputeCopies compute_;
    Buffer<float> wc_;
    Buffer<float> wte_head_;   // mixed: wte rounded for the LM head
    bool o1_copies_  = false;  // w_ and head_w_ point into wc_ and wte_head_
    bool head_copy_  = false;  // the head computes in half on a float32-stored wte
    int par_ep_size_ = 1, par_ep_rank_ = 0;
    Buffer<float> dround_;  // mixed, products on rounded floats: (N, C) rounded GEMM operand
    const float* head_w_ = nullptr;  // the LM head's weight
    int head_rows_       = 0;        // fused head: rows per block
    // head_gradient_in_16_bits: rows per block of logits, and the loss_scale of the 16-bit
    // gradient the last forward formed (none: not formed)
    int head16_rows_ = 0;
    std::optional<float> head16_scale_;
    int64_t head16_recomputes_ = 0;
    // Where head_gradient_in_16_bits: the last forward's logits, head16_rows_ rows at a time,
    // each block reduced to its losses and logsumexps (losses) and, with grad_scale, to its rows
    // of the 16-bit gradient for a backward of that scale (dlosses set for it); records the scale.
    void head16_blocks(bool losses, std::optional<float> grad_scale);
    // dlosses = loss_scale / N: the mean cross-entropy's gradient over each token's loss.
    void set_dlosses(float loss_scale);
    ModelTensors<const float> w_;
    ModelTensors<float> g_;
    std::unique_ptr<Acts> a_;
    std::vector<std::unique_ptr<moe::MoELayer>> moe_;  // [n_moe_blocks]
    // the MoE layers' overlapped all-to-alls (a2a_chunks > 1, EP > 1, MPI_THREAD_MULTIPLE)
    std::unique_ptr<HelperThread> a2a_helper_;
    std::vector<int> moe_index_;  // [n_layer] -> index into moe_ or -1
    int B_ = 0, T_ = 0;
    Recompute recompute_ = Recompute::none;
    void refresh_compute_weights();
    // Rounds the half-stored tensors in place unless they hold values of their dtype already.
    void round_half_stored();
    // Points w_ and head_w_ at the O1 copies (allocated the first time) or at the parameters.
    void use_o1_copies(bool copies);
    bool hold_compute_     = false;  // hold_compute_weights()
    bool half_rounded_     = false;  // the half-stored tensors hold values of their dtype
    bool masters_in_place_ = false;  // keep_masters_in_place()
    Buffer<float> kc_;               // the kept copies (ComputeCopies::kept)
    // Forward of block l over the last forward's B_ x T_ tokens: resid[l] -> resid[l + 1].
    // Returns its MoE aux loss (0 for a dense block).
    double block_forward(int l);
    double aux_loss_ = 0;
};

}  // namespace bagualu::model

// The one typed configuration of a run. Parsed from TOML (config.cpp), overridden with
// `--set section.key=value`, validated once by validate(). Nothing outside src/cli and
// src/config reads configuration by string key.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/batch_split.h"
#include "config/enums.h"

namespace bagualu {

struct ModelConfig {
    int vocab_size       = 8192;
    int d_model          = 256;  // C
    int n_layer          = 4;    // L
    int n_head           = 4;    // NH
    int seq_len          = 128;  // T (also the number of learned positions)
    int d_ff             = 768;  // F: hidden width of dense MLPs (and of each expert, by default)
    int n_experts        = 8;    // E
    int top_k            = 2;    // K
    int n_shared_experts = 0;    // S: FFNs every token of an MoE block passes through
    int shared_d_ff      = 0;    // FS: width of each shared expert; 0 = d_ff
    int expert_d_ff      = 0;    // FE: width of each routed expert; 0 = d_ff
    int moe_every = 2;  // block i (0-based) is MoE iff moe_every > 0 && (i+1) % moe_every == 0
    double aux_loss_coef            = 0.01;  // Switch/GShard load-balancing loss weight; 0 disables
    BalanceScope balance_loss_scope = BalanceScope::global;  // the tokens it balances over
    double router_z_loss_coef       = 0.0;  // ST-MoE router z-loss weight; 0 disables
    RouterScore router_score =
        RouterScore::softmax;        // weights of the chosen experts (docs/model.md)
    GateKind gate = GateKind::topk;  // topk | switch | gshard | noisy | swipe (docs/model.md)
    SwipeBalance swipe_balance = SwipeBalance::step;  // swipe: the step's slots, or each round's
    double capacity_factor     = 1.25;  // switch, gshard: expert capacity = ceil(cf * N * K / E)
    double jitter              = 0.0;   // router input times U[1 - jitter, 1 + jitter] in training
    double balance_bias_rate   = 0.0;   // per-expert choice bias step (moe/balance_bias.h); 0 = off
    BiasUpdate balance_bias_update = BiasUpdate::sign;  // the step: rate x sign or x relative error
    // Node-limited routing: the E experts form route_groups groups of E / route_groups
    // consecutive experts (set it to the nodes the expert-parallel group spans, so a group is a
    // node's experts), and each token's experts come from at most route_nodes groups, the best
    // by the sum of their top ceil(K / route_nodes) choice scores. 0 = unlimited.
    int route_nodes  = 0;
    int route_groups = 0;
    // Product-key gate: the router's logit of expert e = a E2 + b is u_a . x + v_b . x, with
    // product_keys rows u and E2 = n_experts / product_keys rows v (docs/model.md, "Product-key
    // gate"): 2 C (product_keys + E2) FLOPs and weights per token and layer instead of 2 C E.
    // 0 = one weight row per expert.
    int product_keys = 0;
    double init_std  = 0.02;
    // Rows each rank's local experts take per round, as a multiple of the balanced load (the
    // N*K rows a rank sends); more arriving rows are processed in further rounds through the
    // same buffers, with bitwise the same results. 0 = unbounded (sized for every routed row
    // of the EP group). docs/parallelism.md, "Bounded MoE memory".
    double moe_rows_budget = 2.0;
    // For tests and benchmarks only: force the routing choice (the gate's probabilities stay as
    // computed): "none", "one_expert" (slot k to expert k), "one_rank" (the experts of EP rank
    // 0), "zipf" (expert ranks drawn with P(i) ~ 1/(i+1)).
    RouteOverride route_override = RouteOverride::none;

    bool is_moe_block(int layer) const { return moe_every > 0 && (layer + 1) % moe_every == 0; }
    int head_size() const { return d_model / n_head; }
    int shared_width() const { return shared_d_ff > 0 ? shared_d_ff : d_ff; }
    int expert_width() const { return expert_d_ff > 0 ? expert_d_ff : d_ff; }
    // Rows of the gate's weight: E, or the product keys' u and v rows.
    int gate_rows() const { return gate_weight_rows(n_experts, product_keys); }
};

// Every [model] key once, in order: v(key, field, inference), where inference says whether the
// value changes what a trained model computes (its tensors or its routing at inference) rather
// than only how it trains. config.cpp reads and prints the TOML section with it, model_io.cpp
// the exported model's config.json.
template <typename M, typename V>
void visit_model_fields(M& m, V&& v) {
    v("vocab_size", m.vocab_size, true);
    v("d_model", m.d_model, true);
    v("n_layer", m.n_layer, true);
    v("n_head", m.n_head, true);
    v("seq_len", m.seq_len, true);
    v("d_ff", m.d_ff, true);
    v("n_experts", m.n_experts, true);
    v("top_k", m.top_k, true);
    // these two change the model, but a config.json without them is a model exported before
    // shared experts existed, which has none: they keep their defaults when absent
    v("n_shared_experts", m.n_shared_experts, false);
    v("shared_d_ff", m.shared_d_ff, false);
    // the same: absent from models exported before it, whose experts had the width d_ff
    v("expert_d_ff", m.expert_d_ff, false);
    v("moe_every", m.moe_every, true);
    v("aux_loss_coef", m.aux_loss_coef, false);
    v("balance_loss_scope", m.balance_loss_scope, false);
    v("router_z_loss_coef", m.router_z_loss_coef, false);
    // changes the model; absent from models exported before it existed, which used softmax
    v("router_score", m.router_score, false);
    v("gate", m.gate, true);
    // changes the routing in training only; absent from models exported before it (and from
    // checkpoints, which config_from_text reads as "round", the rule they trained with)
    v("swipe_balance", m.swipe_balance, false);
    v("capacity_factor", m.capacity_factor, false);
    v("jitter", m.jitter, false);
    v("balance_bias_rate", m.balance_bias_rate, false);
    v("balance_bias_update", m.balance_bias_update, false);
    // change the routing; absent from models exported before them, which had no limit
    v("route_nodes", m.route_nodes, false);
    v("route_groups", m.route_groups, false);
    // changes the gate's weight; absent from models exported before it, which had none
    v("product_keys", m.product_keys, false);
    v("init_std", m.init_std, false);
    v("moe_rows_budget", m.moe_rows_budget, false);
    v("route_override", m.route_override, false);
}

struct TrainSection {
    int64_t batch_size       = 32;  // global, in sequences
    int64_t micro_batch_size = 0;   // most sequences per rank per forward/backward; 0 = no cap
    int64_t steps            = 1000;
    double lr                = 1e-3;
    double min_lr            = 1e-4;  // the schedule decays from lr to min_lr
    int64_t warmup_steps     = 50;
    LrSchedule lr_schedule   = LrSchedule::cosine;  // after the warm-up (enums.h)
    int64_t decay_steps      = 0;                   // "wsd": the final decay's steps
    double weight_decay      = 0.1;
    double beta1             = 0.9;
    double beta2             = 0.95;
    double eps               = 1e-8;
    double grad_clip         = 1.0;  // global-norm clip; 0 disables
    uint64_t seed            = 1337;
    int64_t eval_every       = 100;  // steps; 0 = only at the end
    int64_t eval_batches     = 8;    // batches of micro_batch_size sequences from val
    int64_t log_every        = 10;
    int threads              = 0;      // compute workers; 0 = one per core in the affinity mask
    bool fused_head          = false;  // LM head + cross-entropy in row blocks (model/gpt.h)
    // refuse at start-up a run whose planned memory per rank, times the ranks sharing the
    // machine, exceeds what they may allocate (plan/memory_check.h)
    bool check_memory   = true;
    std::string run_dir = "";               // "" = runs/<config file stem>
    Recompute recompute = Recompute::none;  // none | moe | block (docs/model.md)
    // "" = initialise the weights (model.init_std); else an exported model or a run directory
    // whose weights a run from its first step starts with (a resumed run takes its checkpoint's)
    std::string init_from = "";
    // with init_from: an MoE block that is a dense block in that model starts with its MLP in
    // every expert (sparse upcycling; model/model_io.h)
    bool upcycle = false;
};

// data.readers: "auto" or a count of reader ranks (0 = every rank reads its own slice).
struct ReaderCount {
    static constexpr int kAuto = -1;
    int n                      = kAuto;
    bool automatic() const { return n == kAuto; }
    // The readers of a run whose ranks fill `nodes` nodes of consecutive ranks, as many a node
    // (0: not so, or not known): auto is one a node where there are several, else every rank.
    int resolve(int nodes) const { return automatic() ? (nodes > 1 ? nodes : 0) : n; }
    bool operator==(const ReaderCount&) const = default;
};

struct DataSection {
    std::string train               = "data/fortunes/train.bin";
    std::string val                 = "data/fortunes/val.bin";
    std::string tokenizer           = "data/fortunes/tokenizer.model";
    std::vector<std::string> corpus = {"/usr/share/games/fortunes"};
    // JSON corpus files (*.jsonl, *.ndjson, *.json, optionally .gz): the field holding a text
    std::string text_key = "text";
    // prepare trains the tokenizer on this many train entries (a uniform sample); 0 = all
    int64_t tokenizer_entries = 0;
    // prepare, where data.train or data.val holds a `*`: tokens a shard file holds (about)
    int64_t shard_tokens = 100'000'000;
    double val_fraction  = 0.01;
    // Training reads these splits (each a file, glob or directory like data.train) instead of
    // data.train, in the proportions blend_weights (one weight each, > 0, normalised): a data
    // mixture (data/sampler.h, "blends"). Empty: data.train alone.
    std::vector<std::string> blend;
    std::vector<double> blend_weights;
    // The splits training reads: data.blend's, else data.train alone.
    std::vector<std::string> train_splits() const {
        return blend.empty() ? std::vector{train} : blend;
    }
    // Ranks that read data.train from disk: 0 = every rank reads its own slice; N > 0 = the
    // first rank of each of N groups reads for its group and scatters (data/loader.h); auto
    // (the default) = one a node when the run spans several nodes of consecutive ranks, as
    // many each, else every rank.
    ReaderCount readers;
};

struct SampleSection {
    int n_samples                    = 3;
    int max_new_tokens               = 64;
    double temperature               = 0.8;
    int top_k                        = 40;
    uint64_t seed                    = 42;
    std::vector<std::string> prompts = {"", "The ", "人生"};
};

struct ParallelSection {
    int expert_parallel = 1;  // EP: ranks each MoE layer's experts are spread over
    // All-to-all via one leader per node: "auto" = when the run spans more than one node.
    NodeSwitch hierarchical_a2a = NodeSwitch::automatic;
    // Ranks per node: 0 = the MPI shared-memory split; N > 0 treats each N consecutive ranks as
    // one node (tests run 2 nodes of 2 ranks on one machine). Must divide the number of ranks.
    int ranks_per_node = 0;
    // ParO's reduce-scatter / all-gather and the replicated all-reduce inside the node first,
    // then across nodes: "auto" = when the run spans more than one node (docs/parallelism.md).
    NodeSwitch two_level = NodeSwitch::automatic;
    // The first level of those two-level reductions: groups of this many consecutive ranks (a
    // supernode's, so that the second level carries 1/group of the array across the
    // oversubscribed switches) instead of the node's ranks. 0 = the node. Must divide the
    // number of ranks; whole nodes are expected.
    int reduce_group = 0;
    // The algorithm of those reduce-scatters / all-gathers: "auto" (by size and ranks), "ring"
    // or "halving" (recursive halving/doubling, any number of ranks). docs/parallelism.md.
    Collectives collectives = Collectives::automatic;
    int virtual_workers     = 1;  // swipe: workers each rank of an EP group simulates
    // Pieces each MoE all-to-all is cut into and pipelined with the expert GEMMs, on a helper
    // thread (needs MPI_THREAD_MULTIPLE): 1 = no overlap. Bitwise the same results for any value
    // (docs/parallelism.md).
    int a2a_chunks = 1;
    // The network's switch group (a supernode) in ranks of the expert all-to-all's exchange (its
    // nodes' leaders when hierarchical, else the EP group's ranks): that exchange then runs in
    // two phases over rows of gcd(a2a_grid, its ranks) consecutive ranks, inside the row, then
    // inside the column (dist::alltoallv_grid): S - 1 + G - 1 messages a rank instead of P - 1,
    // each byte sent twice. 0, or a gcd of 1 or of all the ranks: the direct exchange. Same
    // results either way.
    int a2a_grid = 0;
    // Run the shared experts (model.n_shared_experts) while the routed tokens travel: the
    // dispatch goes to the all-to-all helper thread (needs MPI_THREAD_MULTIPLE). Results are
    // bitwise the same either way (docs/parallelism.md).
    bool overlap_shared = true;
    // The node-deduplicated exchange (moe/node_dispatcher.h): each token crosses to a node once
    // however many of its experts live there, and comes back summed. "auto" = when
    // model.route_nodes > 0 and the expert-parallel group spans more than one node.
    NodeSwitch node_dedup = NodeSwitch::automatic;
    // Reduce gradients on the helper thread during the last backward of each step (needs
    // MPI_THREAD_MULTIPLE; docs/parallelism.md). Results are bitwise the same either way.
    bool overlap_grad_reduce = true;
    // ParO's bucket target in MiB of floats (all ranks' pieces of one bucket together): each
    // bucket is one reduce-scatter and one all-gather (docs/parallelism.md).
    double bucket_mib = 4.0;
};

struct OptimizerSection {
    // ParO, the partitioned optimizer (docs/parallelism.md): "auto" = on when ranks > 1,
    // "on", "off".
    Partition partition = Partition::automatic;
};

// Sharded, asynchronous checkpoints (docs/checkpoint-format.md).
struct CheckpointSection {
    std::string dir = "";             // "" = <train.run_dir>/checkpoints
    int64_t every   = 0;              // steps between checkpoints (and one at the end); 0 = none
    int64_t keep    = 3;              // newest complete checkpoints kept; 0 = all
    Resume resume   = Resume::never;  // "auto": continue from the newest usable checkpoint
};

// Mixed precision (docs/precision.md). A level per layer class:
//   O0 everything float32;  O1 half-precision GEMMs, float32 weights and other ops;
//   O2 half-precision weights and activations, float32 master weights in the optimizer;
//   O3 everything half, no master weights (for experiments).
// dtype = "fp32" runs everything in float32 whatever the levels say (the built-in default).
struct PrecisionSection {
    Dtype dtype         = Dtype::float32;  // fp32 | bf16 | fp16
    Level embedding     = Level::O0;       // wte, wpe
    Level attention     = Level::O1;       // ln_1, c_attn, attention, c_proj
    Level ffn           = Level::O2;       // ln_2, dense MLPs, MoE experts (the gate stays float32)
    Level head          = Level::O1;       // ln_f, the LM head GEMM (its weight is wte)
    bool fp64_sensitive = false;           // softmax, layernorm, gelu, exp, sqrt, loss in FP64
    // The MoE router's weights are float32 at every level; its logits and their gradients are
    // computed in float32 (fp32), with every product and sum in double (fp64), or from operands
    // rounded to the half dtype with float32 accumulation (half; fp32 when dtype is fp32).
    RouterPrecision router = RouterPrecision::fp32;
    // ParO's gradient reduce-scatter of the half-stored tensors (O2 and up): float32, or in
    // their half type with online averaging (16-bit payloads, float32 folds; docs/precision.md)
    GradReduce grad_reduce = GradReduce::fp32;
    // AdamW's m and v of every tensor in a half-precision run: float32, or bf16 (half their
    // bytes; each update computed in float32 on the widened values and rounded back to nearest
    // even; train.beta1 and beta2 at most 1 - 2^-8 then; docs/precision.md). float32 when dtype
    // is "fp32".
    MomentDtype moments = MomentDtype::fp32;
    // Dynamic loss scaling, fp16 only: start at loss_scale; on an inf/NaN gradient skip the step
    // and multiply the scale by loss_scale_backoff; after loss_scale_window clean steps in a row
    // multiply it by loss_scale_growth.
    double loss_scale         = 65536.0;
    int64_t loss_scale_window = 1000;
    double loss_scale_growth  = 2.0;
    double loss_scale_backoff = 0.5;
};

struct TrainConfig {
    ModelConfig model;
    TrainSection train;
    DataSection data;
    SampleSection sample;
    ParallelSection parallel;
    OptimizerSection optimizer;
    CheckpointSection checkpoint;
    PrecisionSection precision;

    std::string source = "<defaults>";  // file the config came from, for error messages
    // the --set items applied over it ("section.key=value"), for error messages: a message that
    // names a key one of them set says so, rather than blaming the file for the value
    std::vector<std::string> overrides;
    std::string name = "default";  // stem of the config file

    // How a step's batch splits over `ranks` processes and their micro-steps (batch_split.h):
    // micro_batch_size caps a micro-batch (0: no cap). Needs 1 <= ranks <= batch_size.
    BatchSplit batch_split(int ranks = 1) const {
        const int64_t cap = train.micro_batch_size > 0 ? train.micro_batch_size : train.batch_size;
        return BatchSplit(train.batch_size, ranks, cap);
    }
    // The most sequences a rank trains in one forward pass, over `ranks` processes.
    int64_t micro_batch(int ranks = 1) const { return batch_split(ranks).max_rows(); }
    // Whether the optimizer state is partitioned over `ranks` processes (optimizer.partition).
    bool partition_optimizer(int ranks) const {
        return optimizer.partition == Partition::on ||
               (optimizer.partition == Partition::automatic && ranks > 1);
    }
    // parallel.node_dedup resolved for an expert-parallel group spanning ep_nodes nodes: "auto"
    // = when routing is node-limited (model.route_nodes > 0) and ep_nodes > 1.
    bool node_dedup(int ep_nodes) const {
        return switch_on(parallel.node_dedup, model.route_nodes > 0 && ep_nodes > 1);
    }
    // ParO's bucket target in floats (parallel.bucket_mib; at least 16).
    size_t bucket_floats() const {
        const double f = parallel.bucket_mib * 262144.0;
        return f < 16 ? size_t{16} : static_cast<size_t>(f + 0.5);
    }
    // Where checkpoints go: checkpoint.dir, or <run_dir>/checkpoints.
    std::string checkpoint_dir() const {
        return checkpoint.dir.empty() ? train.run_dir + "/checkpoints" : checkpoint.dir;
    }
    // Micro-batches per optimizer step, the same on every rank.
    int64_t grad_accum_steps(int ranks = 1) const { return batch_split(ranks).steps(); }
};

// Loads a TOML file, applies overrides ("section.key=value", value in TOML syntax or a bare
// string), validates. Throws InputError naming the file, key and value on any problem.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from TOML text (a checkpoint's resolved config); source names it in errors.
TrainConfig config_from_text(const std::string& toml_text, const std::string& source);
// Same, starting from the defaults with no file.
TrainConfig default_config(const std::vector<std::string>& overrides = {});
// Throws InputError when a value is out of range or values disagree.
void validate(const TrainConfig& cfg);
// The checks that depend on the number of ranks: batch and expert divisibility.
void validate_layout(const TrainConfig& cfg, int ranks);
// What a process that runs the model checks besides validate_layout: one rank's micro-batch
// activations (tokens x the widest row) fit the kernels' int32 indexing. `plan` does not call
// it: it sizes models no single process here could run.
void validate_micro_batch(const TrainConfig& cfg, int ranks);
// Settings that are valid but change nothing in this config: a key set away from its default
// whose feature another key has off (model.balance_bias_update with model.balance_bias_rate =
// 0, ...). One sentence each, for the trainer to warn of at start-up: the documented way to turn
// a feature off over a config is to set its switch alone, so these are not errors.
std::vector<std::string> ineffective_settings(const TrainConfig& cfg);
// The resolved configuration as TOML text (every key, including defaults).
std::string to_toml(const TrainConfig& cfg);
// The keys of `section` whose values differ between a and b, each with both values as TOML
// text, in declaration order.
struct KeyDifference {
    std::string key;  // "section.key"
    std::string a, b;
};
std::vector<KeyDifference> differing_keys(const TrainConfig& a, const TrainConfig& b,
                                          const std::string& section);

// One enumerated value (enums.h: GateKind, Level, Partition, Resume, Recompute, Dtype) from its
// spelling in a config file; InputError `<where> = "<text>": expected ...` for anything else.
template <typename E>
E parse_enum(const std::string& text, const std::string& where);

}  // namespace bagualu

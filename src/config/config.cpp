// TOML parsing, --set overrides, validation and TOML output of TrainConfig.
// Every key is declared once in visit_fields(); parsing, overriding and printing all use it,
// so a key cannot be readable but not printable, or settable but not checked for type.
#include "config/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>

#include "config/toml_file.h"
#include "core/error.h"
#include "core/numbers.h"
#include "core/suggest.h"
#include "core/thread_pool.h"

namespace bagualu {
namespace {

// Calls v(section, key, field) for every configuration key.
template <typename Cfg, typename V>
void visit_fields(Cfg& c, V&& v) {
    visit_model_fields(c.model,
                       [&](const char* key, auto& field, bool) { v("model", key, field); });

    v("train", "batch_size", c.train.batch_size);
    v("train", "micro_batch_size", c.train.micro_batch_size);
    v("train", "steps", c.train.steps);
    v("train", "lr", c.train.lr);
    v("train", "min_lr", c.train.min_lr);
    v("train", "warmup_steps", c.train.warmup_steps);
    v("train", "lr_schedule", c.train.lr_schedule);
    v("train", "decay_steps", c.train.decay_steps);
    v("train", "weight_decay", c.train.weight_decay);
    v("train", "beta1", c.train.beta1);
    v("train", "beta2", c.train.beta2);
    v("train", "eps", c.train.eps);
    v("train", "grad_clip", c.train.grad_clip);
    v("train", "seed", c.train.seed);
    v("train", "eval_every", c.train.eval_every);
    v("train", "eval_batches", c.train.eval_batches);
    v("train", "log_every", c.train.log_every);
    v("train", "threads", c.train.threads);
    v("train", "fused_head", c.train.fused_head);
    v("train", "check_memory", c.train.check_memory);
    v("train", "run_dir", c.train.run_dir);
    v("train", "recompute", c.train.recompute);
    v("train", "init_from", c.train.init_from);
    v("train", "upcycle", c.train.upcycle);

    v("data", "train", c.data.train);
    v("data", "val", c.data.val);
    v("data", "tokenizer", c.data.tokenizer);
    v("data", "corpus", c.data.corpus);
    v("data", "text_key", c.data.text_key);
    v("data", "tokenizer_entries", c.data.tokenizer_entries);
    v("data", "shard_tokens", c.data.shard_tokens);
    v("data", "val_fraction", c.data.val_fraction);
    v("data", "blend", c.data.blend);
    v("data", "blend_weights", c.data.blend_weights);
    v("data", "readers", c.data.readers);

    v("sample", "n_samples", c.sample.n_samples);
    v("sample", "max_new_tokens", c.sample.max_new_tokens);
    v("sample", "temperature", c.sample.temperature);
    v("sample", "top_k", c.sample.top_k);
    v("sample", "seed", c.sample.seed);
    v("sample", "prompts", c.sample.prompts);

    v("parallel", "expert_parallel", c.parallel.expert_parallel);
    v("parallel", "hierarchical_a2a", c.parallel.hierarchical_a2a);
    v("parallel", "ranks_per_node", c.parallel.ranks_per_node);
    v("parallel", "two_level", c.parallel.two_level);
    v("parallel", "collectives", c.parallel.collectives);
    v("parallel", "virtual_workers", c.parallel.virtual_workers);
    v("parallel", "a2a_chunks", c.parallel.a2a_chunks);
    v("parallel", "a2a_grid", c.parallel.a2a_grid);
    v("parallel", "reduce_group", c.parallel.reduce_group);
    v("parallel", "node_dedup", c.parallel.node_dedup);
    v("parallel", "overlap_shared", c.parallel.overlap_shared);
    v("parallel", "overlap_grad_reduce", c.parallel.overlap_grad_reduce);
    v("parallel", "bucket_mib", c.parallel.bucket_mib);

    v("optimizer", "partition", c.optimizer.partition);

    v("checkpoint", "dir", c.checkpoint.dir);
    v("checkpoint", "every", c.checkpoint.every);
    v("checkpoint", "keep", c.checkpoint.keep);
    v("checkpoint", "resume", c.checkpoint.resume);

    v("precision", "dtype", c.precision.dtype);
    v("precision", "embedding", c.precision.embedding);
    v("precision", "attention", c.precision.attention);
    v("precision", "ffn", c.precision.ffn);
    v("precision", "head", c.precision.head);
    v("precision", "fp64_sensitive", c.precision.fp64_sensitive);
    v("precision", "router", c.precision.router);
    v("precision", "grad_reduce", c.precision.grad_reduce);
    v("precision", "moments", c.precision.moments);
    v("precision", "loss_scale", c.precision.loss_scale);
    v("precision", "loss_scale_window", c.precision.loss_scale_window);
    v("precision", "loss_scale_growth", c.precision.loss_scale_growth);
    v("precision", "loss_scale_backoff", c.precision.loss_scale_backoff);
}

// The spellings of each enumerated value and the error's "expected ..." text.
template <typename E>
struct Spelling;
template <>
struct Spelling<GateKind> {
    static constexpr GateKind values[] = {GateKind::topk, GateKind::switch_top1, GateKind::gshard,
                                          GateKind::noisy, GateKind::swipe};
    static constexpr const char* expected = "topk, switch, gshard, noisy or swipe";
};
template <>
struct Spelling<RouterScore> {
    static constexpr RouterScore values[] = {RouterScore::softmax, RouterScore::sigmoid};
    static constexpr const char* expected = "\"softmax\" or \"sigmoid\"";
};
template <>
struct Spelling<SwipeBalance> {
    static constexpr SwipeBalance values[] = {SwipeBalance::round, SwipeBalance::step};
    static constexpr const char* expected  = "\"round\" or \"step\"";
};
template <>
struct Spelling<BiasUpdate> {
    static constexpr BiasUpdate values[]  = {BiasUpdate::sign, BiasUpdate::proportional};
    static constexpr const char* expected = "\"sign\" or \"proportional\"";
};
template <>
struct Spelling<BalanceScope> {
    static constexpr BalanceScope values[] = {BalanceScope::global, BalanceScope::micro_batch,
                                              BalanceScope::sequence};
    static constexpr const char* expected  = "\"global\", \"micro_batch\" or \"sequence\"";
};
template <>
struct Spelling<RouterPrecision> {
    static constexpr RouterPrecision values[] = {RouterPrecision::fp32, RouterPrecision::fp64,
                                                 RouterPrecision::half};
    static constexpr const char* expected     = "\"fp32\", \"fp64\" or \"half\"";
};
template <>
struct Spelling<GradReduce> {
    static constexpr GradReduce values[]  = {GradReduce::fp32, GradReduce::half};
    static constexpr const char* expected = "\"fp32\" or \"half\"";
};
template <>
struct Spelling<MomentDtype> {
    static constexpr MomentDtype values[] = {MomentDtype::fp32, MomentDtype::bfloat16};
    static constexpr const char* expected = "\"fp32\" or \"bf16\"";
};
template <>
struct Spelling<Level> {
    static constexpr Level values[]       = {Level::O0, Level::O1, Level::O2, Level::O3};
    static constexpr const char* expected = "\"O0\", \"O1\", \"O2\" or \"O3\"";
};
template <>
struct Spelling<Dtype> {
    static constexpr Dtype values[]       = {Dtype::float32, Dtype::bfloat16, Dtype::float16};
    static constexpr const char* expected = "\"fp32\", \"bf16\" or \"fp16\"";
};
template <>
struct Spelling<Partition> {
    static constexpr Partition values[]   = {Partition::automatic, Partition::on, Partition::off};
    static constexpr const char* expected = "\"auto\", \"on\" or \"off\"";
};
template <>
struct Spelling<RouteOverride> {
    static constexpr RouteOverride values[] = {RouteOverride::none, RouteOverride::one_expert,
                                               RouteOverride::one_rank, RouteOverride::zipf};
    static constexpr const char* expected   = "\"none\", \"one_expert\", \"one_rank\" or \"zipf\"";
};
template <>
struct Spelling<NodeSwitch> {
    static constexpr NodeSwitch values[] = {NodeSwitch::automatic, NodeSwitch::on, NodeSwitch::off};
    static constexpr const char* expected = "\"auto\", \"on\" or \"off\"";
};
template <>
struct Spelling<Collectives> {
    static constexpr Collectives values[] = {Collectives::automatic, Collectives::ring,
                                             Collectives::halving};
    static constexpr const char* expected = "\"auto\", \"ring\" or \"halving\"";
};
template <>
struct Spelling<Resume> {
    static constexpr Resume values[]      = {Resume::never, Resume::automatic};
    static constexpr const char* expected = "\"never\" or \"auto\"";
};

template <>
struct Spelling<Recompute> {
    static constexpr Recompute values[]   = {Recompute::none, Recompute::moe, Recompute::block};
    static constexpr const char* expected = "\"none\", \"moe\" or \"block\"";
};

template <>
struct Spelling<LrSchedule> {
    static constexpr LrSchedule values[]  = {LrSchedule::cosine, LrSchedule::linear,
                                             LrSchedule::constant, LrSchedule::wsd};
    static constexpr const char* expected = "\"cosine\", \"linear\", \"constant\" or \"wsd\"";
};

template <typename T>
constexpr const char* type_name() {
    if constexpr (std::is_same_v<T, bool>)
        return "a boolean";
    else if constexpr (std::is_integral_v<T>)
        return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
        return "a number";
    else if constexpr (std::is_same_v<T, std::string> || std::is_enum_v<T>)
        return "a string";
    else if constexpr (std::is_same_v<T, ReaderCount>)
        return "an integer or \"auto\"";
    else if constexpr (std::is_same_v<T, std::vector<double>>)
        return "an array of numbers";
    else
        return "an array of strings";
}

// A seed (train.seed, sample.seed): every uint64. TOML integers are signed 64-bit, so one from
// 2^63 up is written as a string of digits, as to_toml writes it.
uint64_t read_uint64(const toml::node& node, const std::string& where) {
    if (const auto v = node.value_exact<int64_t>(); v && *v >= 0) return static_cast<uint64_t>(*v);
    if (const auto text = node.value_exact<std::string>()) {
        if (const auto v = parse_uint64(*text)) return *v;
    }
    std::ostringstream got;
    node.visit([&](const auto& n) { got << n; });
    input_error(
        "{}: expected an integer from 0 to 18446744073709551615 (from 9223372036854775808 up "
        "in quotes), got {}",
        where, got.str());
}

// Reads one TOML node into a typed field; throws with `where` (file and key) on a type mismatch.
template <typename T>
void read_node(const toml::node& node, T& out, const std::string& where) {
    auto mismatch = [&] {
        std::ostringstream got;
        node.visit([&](const auto& n) { got << n; });
        input_error("{}: expected {}, got {}", where, type_name<T>(), got.str());
    };
    if constexpr (std::is_same_v<T, bool>) {
        auto v = node.value_exact<bool>();
        if (!v) mismatch();
        out = *v;
    } else if constexpr (std::is_same_v<T, uint64_t>) {
        out = read_uint64(node, where);
    } else if constexpr (std::is_same_v<T, ReaderCount>) {
        if (const auto text = node.value_exact<std::string>()) {
            if (*text != "auto") {
                input_error("{}: expected an integer >= 0 or \"auto\", got \"{}\"", where, *text);
            }
            out = ReaderCount{};
        } else {
            const auto v = node.value_exact<int64_t>();
            if (!v) mismatch();
            if (*v < 0 || *v > (int64_t{1} << 24)) {
                input_error("{} = {}: must be >= 0 (0 = every rank reads) and <= {}, or \"auto\"",
                            where, *v, int64_t{1} << 24);
            }
            out = ReaderCount{static_cast<int>(*v)};
        }
    } else if constexpr (std::is_integral_v<T>) {
        static_assert(std::is_signed_v<T>, "an unsigned key other than uint64_t");
        auto v = node.value_exact<int64_t>();
        if (!v) mismatch();
        if constexpr (sizeof(T) < sizeof(int64_t)) {
            if (*v < std::numeric_limits<T>::min() || *v > std::numeric_limits<T>::max()) {
                input_error("{}: {} is out of range for a {}-bit integer", where, *v,
                            8 * sizeof(T));
            }
        }
        out = static_cast<T>(*v);
    } else if constexpr (std::is_floating_point_v<T>) {
        if (node.is_integer()) {
            out = static_cast<T>(*node.value_exact<int64_t>());
        } else if (node.is_floating_point()) {
            out = static_cast<T>(*node.value_exact<double>());
            // TOML allows inf and nan; no key of ours means anything by them.
            if (!std::isfinite(out))
                input_error("{}: expected a finite number, got {}", where, out);
        } else {
            mismatch();
        }
    } else if constexpr (std::is_same_v<T, std::string>) {
        auto v = node.value_exact<std::string>();
        if (!v) mismatch();
        out = *v;
    } else if constexpr (std::is_enum_v<T>) {
        auto v = node.value_exact<std::string>();
        if (!v) mismatch();
        out = parse_enum<T>(*v, where);
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
        const toml::array* arr = node.as_array();
        if (!arr) mismatch();
        std::vector<double> values;
        for (const toml::node& el : *arr) {
            double v = 0;
            if (!el.is_number()) mismatch();
            read_node(el, v, where);
            values.push_back(v);
        }
        out = std::move(values);
    } else {
        const toml::array* arr = node.as_array();
        if (!arr) mismatch();
        std::vector<std::string> values;
        for (const toml::node& el : *arr) {
            auto s = el.value_exact<std::string>();
            if (!s) mismatch();
            values.push_back(*s);
        }
        out = std::move(values);
    }
}

// What a user who wrote an unknown key sec.key most likely meant: the same key in another
// section, else a near spelling of a known key, else the keys [sec] has.
std::string unknown_key_hint(const std::string& sec, const std::string& key,
                             const std::set<std::string>& known_keys) {
    for (const std::string& k : known_keys) {
        if (k.substr(k.find('.') + 1) == key) return fmt::format("{}{}?)", kDidYouMean, k);
    }
    if (std::string near = did_you_mean(sec + "." + key, known_keys); !near.empty()) return near;
    std::vector<std::string> in_section;
    for (const std::string& k : known_keys) {
        if (k.rfind(sec + ".", 0) == 0) in_section.push_back(k.substr(sec.size() + 1));
    }
    return fmt::format(" ([{}] has: {})", sec, fmt::join(in_section, ", "));
}

void apply_table(TrainConfig& cfg, const toml::table& root, const std::string& source) {
    std::set<std::string> known_sections;
    std::set<std::string> known_keys;
    visit_fields(cfg, [&](const char* sec, const char* key, auto&) {
        known_sections.insert(sec);
        known_keys.insert(std::string(sec) + "." + key);
    });
    for (const auto& [sec_key, sec_node] : root) {
        const std::string sec(sec_key.str());
        if (!known_sections.count(sec)) {
            const std::string near = nearest_name(sec, known_sections);
            if (!near.empty())
                input_error("{}: unknown section [{}]{}[{}]?)", source, sec, kDidYouMean, near);
            input_error("{}: unknown section [{}] (expected one of: {})", source, sec,
                        fmt::join(known_sections, ", "));
        }
        const toml::table* tbl = sec_node.as_table();
        if (!tbl) input_error("{}: '{}' must be a table [{}]", source, sec, sec);
        for (const auto& [key, node] : *tbl) {
            const std::string full = sec + "." + std::string(key.str());
            if (!known_keys.count(full))
                input_error("{}: unknown key {}{}", source, full,
                            unknown_key_hint(sec, std::string(key.str()), known_keys));
        }
    }
    visit_fields(cfg, [&](const char* sec, const char* key, auto& field) {
        const toml::node* node = root[sec][key].node();
        if (node)
            read_node(*node, field, fmt::format("{}: {}", source, std::string(sec) + "." + key));
    });
}

// Whether s is well-formed UTF-8, as every TOML document must be. toml++ checks config files;
// a --set value taken as a bare string does not go through its parser.
bool is_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        int n        = 0;  // continuation bytes
        char32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1, cp = c & 0x1Fu;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2, cp = c & 0x0Fu;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3, cp = c & 0x07u;
        } else {
            return false;
        }
        if (s.size() - i <= static_cast<size_t>(n)) return false;
        for (int k = 1; k <= n; ++k) {
            const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
            if ((b & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (b & 0x3Fu);
        }
        // overlong forms, surrogates, beyond U+10FFFF
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        i += static_cast<size_t>(n) + 1;
    }
    return true;
}

// Parses "section.key=value" into root, the value as TOML when it parses, else as a string.
void apply_override(toml::table& root, const std::string& item) {
    const size_t eq  = item.find('=');
    const size_t dot = item.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 ||
        dot + 1 == eq) {
        input_error("--set {}: expected section.key=value", item);
    }
    const std::string sec   = item.substr(0, dot);
    const std::string key   = item.substr(dot + 1, eq - dot - 1);
    const std::string value = item.substr(eq + 1);
    toml::table parsed;
    try {
        parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
        // a bare word: take it as a string
        if (!is_utf8(value)) input_error("--set {}: the value is not valid UTF-8", item);
        parsed.insert_or_assign("v", value);
    }
    if (!root.contains(sec)) root.insert(sec, toml::table{});
    toml::table* tbl = root[sec].as_table();
    if (!tbl) input_error("--set {}: '{}' is not a section", item, sec);
    tbl->insert_or_assign(key, *parsed["v"].node());
}

// Whether msg names `key` ("section.key") as a whole word: not inside a longer key.
bool names_key(const std::string& msg, const std::string& key) {
    const auto word = [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
    };
    for (size_t at = msg.find(key); at != std::string::npos; at = msg.find(key, at + 1)) {
        const size_t end = at + key.size();
        if ((at == 0 || !word(msg[at - 1])) && (end == msg.size() || !word(msg[end]))) return true;
    }
    return false;
}

// Whether an error message is about key: it names the key (a suggestion of another key, after
// "did you mean", does not count) or the key's section as unknown.
bool blames(const std::string& msg, const std::string& key) {
    const std::string said = msg.substr(0, msg.find(kDidYouMean));
    return names_key(said, key) ||
           said.find("unknown section [" + key.substr(0, key.find('.')) + "]") != std::string::npos;
}

// A file that only a --set item made wrong is not to blame: the ones whose keys the message
// names (the last item of each key, which is the one in effect) are put beside the file, or in
// its place when there is none (the defaults).
template <typename Check>
void blaming_overrides(const std::string& source, const std::vector<std::string>& overrides,
                       Check check) {
    try {
        check();
    } catch (const InputError& e) {
        std::vector<std::string> named;
        for (size_t i = overrides.size(); i-- > 0;) {
            const std::string key = overrides[i].substr(0, overrides[i].find('='));
            bool later            = false;  // this key set again after this item
            for (const std::string& n : named) later |= n.substr(0, n.find('=')) == key;
            if (!later && blames(e.what(), key)) named.insert(named.begin(), overrides[i]);
        }
        if (named.empty()) throw;
        const std::string msg  = e.what(),
                          sets = "--set " + fmt::format("{}", fmt::join(named, " --set "));
        if (source == "<defaults>" && msg.rfind(source + ": ", 0) == 0) {
            throw InputError(sets + msg.substr(source.size()));
        }
        if (msg.rfind(source + ": ", 0) == 0) {
            throw InputError(
                fmt::format("{} with {}: {}", source, sets, msg.substr(source.size() + 2)));
        }
        throw InputError(fmt::format("{} ({})", msg, sets));
    }
}

TrainConfig from_table(toml::table root, const std::string& source, const std::string& name,
                       const std::vector<std::string>& overrides) {
    for (const auto& o : overrides) apply_override(root, o);
    TrainConfig cfg;
    cfg.source    = source;
    cfg.name      = name;
    cfg.overrides = overrides;
    blaming_overrides(source, overrides, [&] {
        apply_table(cfg, root, source);
        if (cfg.train.run_dir.empty()) cfg.train.run_dir = "runs/" + name;
        validate(cfg);
    });
    return cfg;
}

// ---- upper bounds ----
// Kernels index activations with 32-bit integers and the trainer holds the per-rank
// micro-batch in an int, so every count a rank derives from the config must fit in int32;
// numbers past a bound no run could mean (a learning rate of 1e30, a million threads) are
// refused here rather than ending later in std::terminate or as "training diverged".
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

void validate_limits(const TrainConfig& c) {
    const std::string& src = c.source;
    auto at_most           = [&](const char* key, auto v, auto hi, const char* why) {
        if (v > hi) input_error("{}: {} = {}: must be <= {} ({})", src, key, v, hi, why);
    };
    const ModelConfig& m = c.model;
    at_most("model.vocab_size", m.vocab_size, 1 << 24, "token ids are stored as int32");
    at_most("model.d_model", m.d_model, 1 << 20, "model dimension");
    at_most("model.d_ff", m.d_ff, 1 << 22, "FFN width");
    at_most("model.seq_len", m.seq_len, 1 << 20, "sequence length");
    at_most("model.n_layer", m.n_layer, 1 << 12, "layers");
    at_most("model.n_experts", m.n_experts, 1 << 24, "experts per MoE layer");
    at_most("model.top_k", m.top_k, 256, "experts per token");
    at_most("model.n_shared_experts", m.n_shared_experts, 1 << 10, "shared experts per MoE layer");
    at_most("model.shared_d_ff", m.shared_d_ff, 1 << 22, "FFN width");
    at_most("model.expert_d_ff", m.expert_d_ff, 1 << 22, "FFN width");
    at_most("model.aux_loss_coef", m.aux_loss_coef, 100.0, "a weight of the loss");
    at_most("model.router_z_loss_coef", m.router_z_loss_coef, 100.0, "a weight of the loss");
    at_most("model.capacity_factor", m.capacity_factor, 1e6, "a multiple of the fair share");
    at_most("model.route_groups", m.route_groups, 1 << 24, "groups of experts");
    at_most("model.route_nodes", m.route_nodes, 1 << 24, "groups of experts");
    at_most("model.product_keys", m.product_keys, 1 << 24, "product-key rows");
    at_most("model.balance_bias_rate", m.balance_bias_rate, 1.0, "a step of the routing bias");
    at_most("model.init_std", m.init_std, 10.0, "initial weights' standard deviation");

    const TrainSection& t = c.train;
    at_most("train.batch_size", t.batch_size, kMaxInt32, "sequences per step");
    at_most("train.micro_batch_size", t.micro_batch_size, kMaxInt32, "sequences per micro-batch");
    at_most("train.lr", t.lr, 10.0, "a learning rate");
    at_most("train.weight_decay", t.weight_decay, 100.0, "decoupled weight decay");
    at_most("train.eps", t.eps, 1.0, "AdamW's epsilon");
    at_most("train.threads", t.threads, 4096, "compute threads per rank");
    at_most("train.eval_batches", t.eval_batches, kMaxInt32, "validation batches");

    at_most("parallel.expert_parallel", c.parallel.expert_parallel, 1 << 24, "ranks");
    at_most("parallel.ranks_per_node", c.parallel.ranks_per_node, 1 << 24, "ranks");
    at_most("parallel.virtual_workers", c.parallel.virtual_workers, 1 << 16, "workers per rank");
    at_most("parallel.a2a_chunks", c.parallel.a2a_chunks, 1 << 10, "pieces per all-to-all");
    at_most("parallel.a2a_grid", c.parallel.a2a_grid, 1 << 24, "ranks per switch group");
    at_most("parallel.reduce_group", c.parallel.reduce_group, 1 << 24, "ranks per group");
    at_most("parallel.bucket_mib", c.parallel.bucket_mib, 1048576.0, "1 TiB");
    at_most("precision.loss_scale", c.precision.loss_scale, 0x1p64, "2^64");
    at_most("precision.loss_scale_growth", c.precision.loss_scale_growth, 1024.0, "per window");
    at_most("sample.n_samples", c.sample.n_samples, 1 << 16, "samples");
    at_most("sample.max_new_tokens", c.sample.max_new_tokens, 1 << 24, "tokens per sample");
    at_most("sample.temperature", c.sample.temperature, 1e3, "a softmax temperature");
    at_most("sample.top_k", c.sample.top_k, 1 << 24, "candidates per token");
}

}  // namespace

TrainConfig config_from_text(const std::string& toml_text, const std::string& source) {
    toml::table root;
    try {
        root = toml::parse(toml_text, source);
    } catch (const toml::parse_error& e) {
        input_error("{}:{}:{}: invalid TOML: {}", source, e.source().begin.line,
                    e.source().begin.column, e.description());
    }
    // a checkpoint written before model.swipe_balance existed trained SWIPE with the round rule
    if (toml::table* m = root["model"].as_table(); m && !m->contains("swipe_balance")) {
        m->insert("swipe_balance", std::string(name_of(SwipeBalance::round)));
    }
    return from_table(std::move(root), source, "checkpoint", {});
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
    toml::table root = parse_toml_file(path, "config");
    return from_table(std::move(root), path, std::filesystem::path(path).stem().string(),
                      overrides);
}

TrainConfig default_config(const std::vector<std::string>& overrides) {
    return from_table(toml::table{}, "<defaults>", "default", overrides);
}

void validate(const TrainConfig& c) {
    const std::string& src = c.source;
    auto positive          = [&](const char* key, int64_t v) {
        if (v <= 0) input_error("{}: {} = {}: must be > 0", src, key, v);
    };
    auto non_negative = [&](const char* key, double v) {
        if (!(v >= 0)) input_error("{}: {} = {}: must be >= 0", src, key, v);
    };
    const ModelConfig& m = c.model;
    positive("model.vocab_size", m.vocab_size);
    positive("model.d_model", m.d_model);
    positive("model.n_layer", m.n_layer);
    positive("model.n_head", m.n_head);
    positive("model.seq_len", m.seq_len);
    positive("model.d_ff", m.d_ff);
    if (m.d_model % m.n_head != 0) {
        input_error("{}: model.d_model = {} must be divisible by model.n_head = {}", src, m.d_model,
                    m.n_head);
    }
    if (m.moe_every < 0) input_error("{}: model.moe_every = {}: must be >= 0", src, m.moe_every);
    if (m.moe_every > m.n_layer) {
        // blocks moe_every, 2 moe_every, ...: none among n_layer, and the MoE keys would be ignored
        input_error(
            "{}: model.moe_every = {} > model.n_layer = {} makes no block an MoE layer: use "
            "moe_every = 0 for a dense model",
            src, m.moe_every, m.n_layer);
    }
    if (m.moe_every > 0) {
        positive("model.n_experts", m.n_experts);
        positive("model.top_k", m.top_k);
        if (m.top_k > m.n_experts) {
            input_error("{}: model.top_k = {} must be <= model.n_experts = {}", src, m.top_k,
                        m.n_experts);
        }
    }
    {
        // Parameter and memory counts are 64-bit integers: a model whose weights' bytes (16 a
        // weight with gradient and moments) pass 2^63 would wrap them into small, plausible
        // numbers. At most 1e17 weights (600 times the largest BaGuaLu model); in double, the
        // weight matrices only (biases and norms are lower order).
        const double C = m.d_model, L = m.n_layer;
        const double moe_layers = m.moe_every > 0 ? std::floor(L / m.moe_every) : 0;
        const double weights    = double(m.vocab_size) * C + double(m.seq_len) * C + L * 4 * C * C +
                               (L - moe_layers) * 2 * C * m.d_ff +
                               moe_layers * (double(m.n_experts) * 2 * C * m.expert_width() +
                                             double(m.n_shared_experts) * 2 * C * m.shared_width());
        if (!(weights <= 1e17)) {
            input_error(
                "{}: this model has about {:.3g} weights (model.n_layer = {}, d_model = {}, "
                "n_experts = {}, ...): more than the 1e17 bagualu counts",
                src, weights, m.n_layer, m.d_model, m.n_experts);
        }
    }
    non_negative("model.aux_loss_coef", m.aux_loss_coef);
    if (m.moe_every > 0 && m.balance_loss_scope != BalanceScope::global &&
        m.gate == GateKind::noisy) {
        input_error(
            "{}: model.balance_loss_scope = \"{}\" needs a gate with the Switch balancing loss "
            "(the noisy gate's importance and load losses are over all tokens: use \"global\")",
            src, name_of(m.balance_loss_scope));
    }
    non_negative("model.router_z_loss_coef", m.router_z_loss_coef);
    non_negative("model.n_shared_experts", m.n_shared_experts);
    non_negative("model.shared_d_ff", m.shared_d_ff);
    non_negative("model.expert_d_ff", m.expert_d_ff);
    if (m.moe_every > 0 && m.router_score == RouterScore::sigmoid && m.gate != GateKind::topk &&
        m.gate != GateKind::swipe) {
        input_error(
            "{}: model.router_score = \"sigmoid\" needs model.gate = \"topk\" or \"swipe\" "
            "(model.gate = \"{}\" has its own weights)",
            src, name_of(m.gate));
    }
    non_negative("model.balance_bias_rate", m.balance_bias_rate);
    if (m.moe_every > 0 && m.gate == GateKind::switch_top1 && m.top_k != 1) {
        input_error("{}: model.gate = \"switch\" routes to one expert: set model.top_k = 1", src);
    }
    if (m.moe_every > 0 && m.gate == GateKind::gshard && m.top_k != 2) {
        input_error("{}: model.gate = \"gshard\" routes to two experts: set model.top_k = 2", src);
    }
    if (m.moe_every > 0 && m.gate == GateKind::noisy && m.top_k >= m.n_experts) {
        input_error("{}: model.gate = \"noisy\" needs model.top_k < model.n_experts", src);
    }
    if (!(m.capacity_factor > 0)) {
        input_error("{}: model.capacity_factor = {}: must be > 0", src, m.capacity_factor);
    }
    if (!(m.jitter >= 0 && m.jitter < 1))
        input_error("{}: model.jitter = {}: must be in [0, 1)", src, m.jitter);
    if (!(m.init_std > 0)) input_error("{}: model.init_std = {}: must be > 0", src, m.init_std);
    if (m.route_nodes < 0 || m.route_groups < 0) {
        input_error("{}: model.route_nodes = {}, model.route_groups = {}: must be >= 0", src,
                    m.route_nodes, m.route_groups);
    }
    if (m.moe_every > 0 && m.route_nodes > 0) {
        if (m.route_groups < 1 || m.n_experts % m.route_groups != 0) {
            input_error(
                "{}: model.route_groups = {}: model.route_nodes needs the number of expert groups "
                "(nodes), a divisor of model.n_experts = {}",
                src, m.route_groups, m.n_experts);
        }
        if (m.route_nodes > m.route_groups) {
            input_error("{}: model.route_nodes = {} must be <= model.route_groups = {}", src,
                        m.route_nodes, m.route_groups);
        }
        if (m.top_k > m.route_nodes * (m.n_experts / m.route_groups)) {
            input_error(
                "{}: model.top_k = {} experts do not fit in model.route_nodes = {} group(s) of {} "
                "expert(s)",
                src, m.top_k, m.route_nodes, m.n_experts / m.route_groups);
        }
        if (m.gate == GateKind::swipe || m.gate == GateKind::noisy) {
            input_error(
                "{}: model.route_nodes needs model.gate = \"topk\", \"switch\" or \"gshard\" "
                "(model.gate = \"{}\" may move a token to any expert)",
                src, name_of(m.gate));
        }
    }
    if (m.product_keys < 0)
        input_error("{}: model.product_keys = {}: must be >= 0", src, m.product_keys);
    if (m.moe_every > 0 && m.product_keys > 0) {
        if (m.n_experts % m.product_keys != 0) {
            input_error(
                "{}: model.product_keys = {} must divide model.n_experts = {} (expert a E2 + b "
                "has key rows a and b, E2 = n_experts / product_keys)",
                src, m.product_keys, m.n_experts);
        }
        if (m.gate == GateKind::noisy) {
            input_error(
                "{}: model.product_keys needs a gate without a noise weight (model.gate = "
                "\"noisy\" has one row per expert)",
                src);
        }
    }
    if (!(m.moe_rows_budget >= 0)) {
        input_error("{}: model.moe_rows_budget = {}: must be >= 0 (0 = unbounded)", src,
                    m.moe_rows_budget);
    }

    const TrainSection& t = c.train;
    if (t.recompute == Recompute::moe && m.moe_every == 0) {
        input_error("{}: train.recompute = \"moe\" needs MoE blocks (model.moe_every > 0)", src);
    }
    positive("train.batch_size", t.batch_size);
    if (t.micro_batch_size < 0) {
        input_error("{}: train.micro_batch_size = {}: must be >= 0 (0 = batch_size)", src,
                    t.micro_batch_size);
    }
    positive("train.steps", t.steps);
    // 0 trains nothing: the weights stay as they start (a probe of a model on fresh batches)
    if (!(t.lr >= 0)) input_error("{}: train.lr = {}: must be >= 0", src, t.lr);
    non_negative("train.min_lr", t.min_lr);
    if (t.min_lr > t.lr)
        input_error("{}: train.min_lr = {} must be <= train.lr = {}", src, t.min_lr, t.lr);
    non_negative("train.warmup_steps", static_cast<double>(t.warmup_steps));
    // wsd decays over the last decay_steps steps (at most those after the warm-up: a shorter
    // run, say --set train.steps=2, decays over what it has)
    if (t.lr_schedule == LrSchedule::wsd && t.decay_steps < 1) {
        input_error(
            "{}: train.decay_steps = {}: train.lr_schedule = \"wsd\" decays over the last "
            "decay_steps steps, at least 1 (without a decay, use \"constant\")",
            src, t.decay_steps);
    }
    if (t.upcycle && m.moe_every > 0 && m.n_shared_experts > 0) {
        input_error(
            "{}: train.upcycle with model.n_shared_experts = {}: a dense MLP goes into the routed "
            "experts only, and shared experts beside them would change what the block computes",
            src, m.n_shared_experts);
    }
    non_negative("train.decay_steps", static_cast<double>(t.decay_steps));
    non_negative("train.weight_decay", t.weight_decay);
    if (!(t.beta1 >= 0 && t.beta1 < 1))
        input_error("{}: train.beta1 = {}: must be in [0, 1)", src, t.beta1);
    if (!(t.beta2 >= 0 && t.beta2 < 1))
        input_error("{}: train.beta2 = {}: must be in [0, 1)", src, t.beta2);
    if (!(t.eps > 0)) input_error("{}: train.eps = {}: must be > 0", src, t.eps);
    if (c.precision.moments == MomentDtype::bfloat16 && c.precision.dtype != Dtype::float32) {
        // a bf16 moment x times beta rounds back to x when 1 - beta is below bf16's relative
        // rounding step (up to 2^-8): the moment would stop decaying
        constexpr double kMaxBeta = 1.0 - 1.0 / 256.0;
        for (const auto& [key, beta] : {std::pair{"beta1", t.beta1}, {"beta2", t.beta2}}) {
            if (beta > kMaxBeta) {
                input_error(
                    "{}: train.{} = {}: must be at most 0.99609375 (1 - 2^-8) with "
                    "precision.moments = \"bf16\" in a half-precision run (a bf16 moment cannot "
                    "decay by less than its rounding step)",
                    src, key, beta);
            }
        }
    }
    non_negative("train.grad_clip", t.grad_clip);
    non_negative("train.eval_every", static_cast<double>(t.eval_every));
    positive("train.eval_batches", t.eval_batches);
    positive("train.log_every", t.log_every);
    if (t.threads < 0)
        input_error("{}: train.threads = {}: must be >= 0 (0 = all cores)", src, t.threads);

    const DataSection& d = c.data;
    if (d.train.empty()) input_error("{}: data.train must not be empty", src);
    if (d.val.empty()) input_error("{}: data.val must not be empty", src);
    if (!(d.val_fraction > 0 && d.val_fraction < 1)) {
        input_error("{}: data.val_fraction = {}: must be in (0, 1)", src, d.val_fraction);
    }
    if (!d.readers.automatic() && d.readers.n < 0) {  // a program's value; read ones are checked
        input_error("{}: data.readers = {}: must be >= 0 (0 = every rank reads) or \"auto\"", src,
                    d.readers.n);
    }
    if (d.text_key.empty()) {
        input_error("{}: data.text_key must not be empty (the JSON field holding a text)", src);
    }
    if (d.blend_weights.size() != d.blend.size()) {
        input_error(
            "{}: data.blend_weights holds {} weight(s) for the {} split(s) of data.blend: give "
            "one weight a split",
            src, d.blend_weights.size(), d.blend.size());
    }
    for (size_t i = 0; i < d.blend.size(); ++i) {
        if (d.blend[i].empty()) input_error("{}: data.blend[{}] must not be empty", src, i);
        if (!(d.blend_weights[i] > 0)) {
            input_error("{}: data.blend_weights[{}] = {}: must be > 0", src, i, d.blend_weights[i]);
        }
    }
    if (d.shard_tokens < 1 || d.shard_tokens > 1'000'000'000) {
        input_error("{}: data.shard_tokens = {}: must be in [1, 1000000000]", src, d.shard_tokens);
    }
    if (d.tokenizer_entries < 0) {
        input_error("{}: data.tokenizer_entries = {}: must be >= 0 (0 = every train entry)", src,
                    d.tokenizer_entries);
    }

    if (c.parallel.expert_parallel < 1) {
        input_error("{}: parallel.expert_parallel = {}: must be >= 1", src,
                    c.parallel.expert_parallel);
    }
    if (!(c.parallel.bucket_mib > 0)) {
        input_error("{}: parallel.bucket_mib = {}: must be > 0", src, c.parallel.bucket_mib);
    }
    if (c.parallel.a2a_chunks < 1) {
        input_error("{}: parallel.a2a_chunks = {}: must be >= 1 (1 = no overlap)", src,
                    c.parallel.a2a_chunks);
    }
    if (c.parallel.virtual_workers < 1) {
        input_error("{}: parallel.virtual_workers = {}: must be >= 1", src,
                    c.parallel.virtual_workers);
    }
    if (m.moe_every > 0 && m.gate == GateKind::swipe &&
        m.n_experts % (c.parallel.expert_parallel * c.parallel.virtual_workers) != 0) {
        input_error(
            "{}: model.n_experts = {} must be divisible by parallel.expert_parallel x "
            "parallel.virtual_workers = {} (the swipe workers)",
            src, m.n_experts, c.parallel.expert_parallel * c.parallel.virtual_workers);
    }
    if (m.moe_every > 0 && m.n_experts % c.parallel.expert_parallel != 0) {
        input_error("{}: model.n_experts = {} must be divisible by parallel.expert_parallel = {}",
                    src, m.n_experts, c.parallel.expert_parallel);
    }

    non_negative("checkpoint.every", c.checkpoint.every);
    non_negative("checkpoint.keep", c.checkpoint.keep);
    const PrecisionSection& pr = c.precision;
    if (!(pr.loss_scale >= 1))
        input_error("{}: precision.loss_scale = {}: must be >= 1", src, pr.loss_scale);
    positive("precision.loss_scale_window", pr.loss_scale_window);
    if (!(pr.loss_scale_growth >= 1)) {
        input_error("{}: precision.loss_scale_growth = {}: must be >= 1", src,
                    pr.loss_scale_growth);
    }
    if (!(pr.loss_scale_backoff > 0 && pr.loss_scale_backoff < 1)) {
        input_error("{}: precision.loss_scale_backoff = {}: must be in (0, 1)", src,
                    pr.loss_scale_backoff);
    }

    const SampleSection& s = c.sample;
    non_negative("parallel.ranks_per_node", c.parallel.ranks_per_node);
    non_negative("parallel.a2a_grid", c.parallel.a2a_grid);
    non_negative("parallel.reduce_group", c.parallel.reduce_group);
    non_negative("sample.n_samples", s.n_samples);
    positive("sample.max_new_tokens", s.max_new_tokens);
    non_negative("sample.temperature", s.temperature);
    non_negative("sample.top_k", s.top_k);
    validate_limits(c);
}

namespace {

void check_layout(const TrainConfig& c, int ranks) {
    const std::string& src = c.source;
    const int ep           = c.parallel.expert_parallel;
    if (ranks % ep != 0) {
        input_error("{}: parallel.expert_parallel = {} must divide the number of ranks {}", src, ep,
                    ranks);
    }
    // Each rank lists its experts' tensors one by one, per MoE layer (the parameter layout, the
    // planner's footprint): millions of them on one rank took minutes and gigabytes before any
    // check of the memory they need could say no.
    constexpr int64_t kMaxLocalExpertFfns = int64_t{1} << 18;
    if (c.model.moe_every > 0 && ep > 0) {
        const int64_t local = c.model.n_experts / ep, layers = c.model.n_layer / c.model.moe_every;
        if (local * layers > kMaxLocalExpertFfns) {
            input_error(
                "{}: model.n_experts = {} over parallel.expert_parallel = {} in {} MoE layers puts "
                "{} expert FFNs on each rank: at most {} (raise parallel.expert_parallel)",
                src, c.model.n_experts, ep, layers, local * layers, kMaxLocalExpertFfns);
        }
    }
    const int rpn = c.parallel.ranks_per_node;
    if (rpn < 0 || (rpn > 0 && ranks % rpn != 0)) {
        input_error(
            "{}: parallel.ranks_per_node = {} must be 0 (detect) or divide the number of "
            "ranks {}",
            src, rpn, ranks);
    }
    const int rg = c.parallel.reduce_group;
    if (rg < 0 || (rg > 0 && ranks % rg != 0)) {
        input_error(
            "{}: parallel.reduce_group = {} must be 0 (the node) or divide the number of ranks {}",
            src, rg, ranks);
    }
    if (c.train.batch_size < ranks) {
        input_error(
            "{}: train.batch_size = {} is less than the number of ranks {} (every rank trains "
            "at least one sequence a step: raise train.batch_size or use fewer ranks)",
            src, c.train.batch_size, ranks);
    }
    const BatchSplit split = c.batch_split(ranks);
    if (split.has_empty()) {
        input_error(
            "{}: train.batch_size = {} over {} ranks leaves {} sequences on some ranks, fewer "
            "than the {} micro-batches of train.micro_batch_size = {} that the largest share "
            "needs (raise train.micro_batch_size to at least {})",
            src, c.train.batch_size, ranks, split.min_share(), split.steps(),
            c.train.micro_batch_size, (split.share(0) + split.min_share() - 1) / split.min_share());
    }
    if (c.data.readers.n > ranks) {
        input_error("{}: data.readers = {} exceeds the number of ranks {}", src, c.data.readers.n,
                    ranks);
    }
}

void check_micro_batch(const TrainConfig& c, int ranks) {
    const std::string& src = c.source;
    const int64_t mb       = c.micro_batch(ranks);
    // Tokens of one micro-batch, and the widest activation row over them, on one rank.
    const int64_t tokens = mb * int64_t{c.model.seq_len};
    const ModelConfig& m = c.model;
    const int64_t width  = std::max({int64_t{m.vocab_size}, 3 * int64_t{m.d_model}, int64_t{m.d_ff},
                                    m.moe_every > 0 ? int64_t{m.n_experts} : 0,
                                    m.moe_every > 0 ? m.top_k * int64_t{m.expert_width()} : 0,
                                     int64_t{m.shared_width()}});
    // (tokens is at most 2^31 x 2^20 and width at most 2^30 here: the product cannot overflow
    // once tokens is known to fit in int32)
    if (tokens > kMaxInt32 || tokens * width > kMaxInt32) {
        input_error(
            "{}: train.micro_batch_size = {} x model.seq_len = {} tokens per rank is too "
            "many for this model: an activation of (tokens x {}) values must hold at "
            "most {} (lower train.micro_batch_size)",
            src, mb, m.seq_len, width, kMaxInt32);
    }
    // The compute threads wait for each other by spinning: more of them than the CPUs this
    // process may use (its affinity mask) makes every step wait on the scheduler instead. (The
    // launcher's mask: a part of it shared with other ranks is warned of, cli/commands.cpp.)
    const int cpus = static_cast<int>(launcher_cpus().size());
    if (c.train.threads > cpus) {
        input_error(
            "{}: train.threads = {} exceeds the {} CPU(s) this process may run on (its "
            "affinity mask): use at most {}, or 0 for all of them",
            src, c.train.threads, cpus, cpus);
    }
}

}  // namespace

std::vector<std::string> ineffective_settings(const TrainConfig& c) {
    const ModelConfig& m = c.model;
    const ModelConfig d;  // the defaults
    std::vector<std::string> out;
    const auto add = [&](bool set, std::string what) {
        if (set) out.push_back(fmt::format("{}: {}", c.source, what));
    };
    add(m.balance_bias_update != d.balance_bias_update && m.balance_bias_rate == 0.0,
        fmt::format("model.balance_bias_update = \"{}\" has no effect: model.balance_bias_rate "
                    "= 0 (the balancing bias is off)",
                    name_of(m.balance_bias_update)));
    add(m.route_groups != d.route_groups && m.route_nodes == 0,
        fmt::format("model.route_groups = {} has no effect: model.route_nodes = 0 (routing is "
                    "not node-limited)",
                    m.route_groups));
    add(m.swipe_balance != d.swipe_balance && m.gate != GateKind::swipe && m.moe_every > 0,
        fmt::format("model.swipe_balance = \"{}\" has no effect: model.gate = \"{}\" is not "
                    "swipe",
                    name_of(m.swipe_balance), name_of(m.gate)));
    add(c.train.decay_steps != TrainSection{}.decay_steps && c.train.lr_schedule != LrSchedule::wsd,
        fmt::format("train.decay_steps = {} has no effect: train.lr_schedule = \"{}\" (only "
                    "\"wsd\" ends with a decay of its own length)",
                    c.train.decay_steps, name_of(c.train.lr_schedule)));
    add(c.train.upcycle && (c.train.init_from.empty() || m.moe_every == 0),
        c.train.init_from.empty()
            ? std::string("train.upcycle = true has no effect: train.init_from is empty")
            : std::string(
                  "train.upcycle = true has no effect: model.moe_every = 0 (no MoE block)"));
    const bool capacity_gate = m.gate == GateKind::switch_top1 || m.gate == GateKind::gshard;
    add(m.capacity_factor != d.capacity_factor && !capacity_gate && m.moe_every > 0,
        fmt::format("model.capacity_factor = {} has no effect: model.gate = \"{}\" has no "
                    "expert capacity (only switch and gshard drop over it)",
                    m.capacity_factor, name_of(m.gate)));
    return out;
}

void validate_layout(const TrainConfig& c, int ranks) {
    blaming_overrides(c.source, c.overrides, [&] { check_layout(c, ranks); });
}

void validate_micro_batch(const TrainConfig& c, int ranks) {
    blaming_overrides(c.source, c.overrides, [&] { check_micro_batch(c, ranks); });
}

namespace {

// tbl[key] = a config field's value as TOML.
template <typename T>
void insert_value(toml::table& tbl, const char* key, const T& field) {
    if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                  std::is_same_v<T, std::vector<double>>) {
        toml::array arr;
        for (const auto& s : field) arr.push_back(s);
        tbl.insert(key, std::move(arr));
    } else if constexpr (std::is_same_v<T, uint64_t>) {
        // beyond TOML's signed 64-bit integers: a string of digits (read_uint64 reads it back)
        if (field > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            tbl.insert(key, std::to_string(field));
        else
            tbl.insert(key, static_cast<int64_t>(field));
    } else if constexpr (std::is_enum_v<T>) {
        tbl.insert(key, std::string(name_of(field)));
    } else if constexpr (std::is_same_v<T, ReaderCount>) {
        if (field.automatic())
            tbl.insert(key, std::string("auto"));
        else
            tbl.insert(key, static_cast<int64_t>(field.n));
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        tbl.insert(key, static_cast<int64_t>(field));
    } else {
        tbl.insert(key, field);
    }
}

}  // namespace

std::string to_toml(const TrainConfig& cfg) {
    toml::table root;
    visit_fields(cfg, [&](const char* sec, const char* key, const auto& field) {
        if (!root.contains(sec)) root.insert(sec, toml::table{});
        insert_value(*root[sec].as_table(), key, field);
    });
    std::ostringstream out;
    out << root << "\n";
    return out.str();
}

std::vector<KeyDifference> differing_keys(const TrainConfig& a, const TrainConfig& b,
                                          const std::string& section) {
    // each side's values as to_toml prints them: what a checkpoint's config holds
    const auto values = [&](const TrainConfig& c) {
        std::vector<std::pair<std::string, std::string>> out;
        visit_fields(c, [&](const char* sec, const char* key, const auto& field) {
            if (section != sec) return;
            std::string v;
            if constexpr (std::is_floating_point_v<std::decay_t<decltype(field)>>) {
                // the shortest text that reads back as the value (toml++ writes 17 digits:
                // 0.10000000000000001), with a point where it has none, as TOML writes a float
                v = fmt::format("{}", field);
                if (std::isfinite(field) && v.find_first_of(".e") == std::string::npos) v += ".0";
            } else {
                toml::table t;
                insert_value(t, "v", field);
                std::ostringstream text;
                text << t;
                v = text.str();
                v = v.substr(v.find('=') + 1);
                v.erase(0, v.find_first_not_of(' '));
                while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
            }
            out.emplace_back(fmt::format("{}.{}", sec, key), std::move(v));
        });
        return out;
    };
    const auto va = values(a), vb = values(b);
    std::vector<KeyDifference> diff;
    for (size_t i = 0; i < va.size(); ++i) {
        if (va[i].second != vb[i].second) diff.push_back({va[i].first, va[i].second, vb[i].second});
    }
    return diff;
}

template <typename E>
E parse_enum(const std::string& text, const std::string& where) {
    for (const E e : Spelling<E>::values) {
        if (text == name_of(e)) return e;
    }
    input_error("{} = \"{}\": expected {}", where, text, Spelling<E>::expected);
}
template GateKind parse_enum<GateKind>(const std::string&, const std::string&);
template RouterScore parse_enum<RouterScore>(const std::string&, const std::string&);
template BiasUpdate parse_enum<BiasUpdate>(const std::string&, const std::string&);
template SwipeBalance parse_enum<SwipeBalance>(const std::string&, const std::string&);
template BalanceScope parse_enum<BalanceScope>(const std::string&, const std::string&);
template RouterPrecision parse_enum<RouterPrecision>(const std::string&, const std::string&);
template GradReduce parse_enum<GradReduce>(const std::string&, const std::string&);
template MomentDtype parse_enum<MomentDtype>(const std::string&, const std::string&);
template Level parse_enum<Level>(const std::string&, const std::string&);
template Dtype parse_enum<Dtype>(const std::string&, const std::string&);
template Partition parse_enum<Partition>(const std::string&, const std::string&);
template NodeSwitch parse_enum<NodeSwitch>(const std::string&, const std::string&);
template Resume parse_enum<Resume>(const std::string&, const std::string&);
template Collectives parse_enum<Collectives>(const std::string&, const std::string&);
template RouteOverride parse_enum<RouteOverride>(const std::string&, const std::string&);
template Recompute parse_enum<Recompute>(const std::string&, const std::string&);
template LrSchedule parse_enum<LrSchedule>(const std::string&, const std::string&);

}  // namespace bagualu

#include "model/model_io.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/gpt.h"
#include "model/param_layout.h"

namespace bagualu::model {

namespace fs = std::filesystem;

nlohmann::json model_config_to_json(const ModelConfig& m) {
    nlohmann::json j{{"model_type", "bagualu-moe-gpt"}, {"format_version", 1}};
    visit_model_fields(m, [&](const char* key, const auto& field, bool) {
        if constexpr (std::is_enum_v<std::decay_t<decltype(field)>>) {
            j[key] = name_of(field);
        } else {
            j[key] = field;
        }
    });
    j["layer_norm_epsilon"]  = 1e-5;
    j["activation"]          = "gelu_tanh";
    j["tie_word_embeddings"] = true;
    return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source) {
    if (!j.is_object()) input_error("{}: expected a JSON object", source);
    // value() would throw json's type_error on a model_type that is not a string
    if (!j.contains("model_type") || j["model_type"] != "bagualu-moe-gpt") {
        input_error("{}: model_type must be \"bagualu-moe-gpt\"", source);
    }
    // What model_config_to_json writes besides the fields: the format and the model's fixed
    // math. Absent is fine (hand-written configs); another value is a model this code would
    // run wrongly.
    const nlohmann::json fixed = model_config_to_json(ModelConfig{});
    for (const char* key :
         {"format_version", "layer_norm_epsilon", "activation", "tie_word_embeddings"}) {
        if (j.contains(key) && j[key] != fixed[key]) {
            input_error("{}: {} = {}: this version reads {} only", source, key, j[key].dump(),
                        fixed[key].dump());
        }
    }
    ModelConfig m;
    // A key that changes the model at inference must be there; the training-only ones keep
    // their defaults when absent (models exported before config.json held every key).
    visit_model_fields(m, [&](const char* key, auto& field, bool inference) {
        using T = std::decay_t<decltype(field)>;
        if (!inference && !j.contains(key)) return;
        const nlohmann::json* v = j.contains(key) ? &j[key] : nullptr;
        if constexpr (std::is_integral_v<T>) {
            if (!v || !v->is_number_integer())
                input_error("{}: {} must be an integer", source, key);
            // get<T> would wrap a value beyond 32 bits into another, valid-looking one
            const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX
                                  ? INT64_MAX
                                  : v->get<int64_t>();
            if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
                input_error("{}: {} = {} is out of range for a {}-bit integer", source, key,
                            v->dump(), 8 * sizeof(T));
            }
            field = static_cast<T>(x);
        } else if constexpr (std::is_floating_point_v<T>) {
            if (!v || !v->is_number()) input_error("{}: {} must be a number", source, key);
            field = v->get<T>();
        } else {
            if (!v || !v->is_string()) input_error("{}: {} must be a string", source, key);
            field = parse_enum<T>(v->get<std::string>(), fmt::format("{}: {}", source, key));
        }
    });
    TrainConfig check;
    check.model  = m;
    check.source = source;
    validate(check);
    return m;
}

std::string balance_bias_name(int layer) { return fmt::format("h.{}.moe.gate.bias", layer); }

namespace {
// The MoE blocks, in order: where the balancing biases belong.
std::vector<int> moe_blocks(const ModelConfig& m) {
    std::vector<int> out;
    for (int l = 0; l < m.n_layer; ++l) {
        if (m.is_moe_block(l)) out.push_back(l);
    }
    return out;
}
}  // namespace

void save_model(const std::string& dir, const ModelConfig& m, const float* params, bool bf16,
                const std::string& tokenizer_path,
                const std::map<std::string, std::string>& metadata,
                const moe::BalanceBiases& biases) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) input_error("{}: cannot create directory: {}", dir, ec.message());
    const ParamLayout layout = make_layout(m);
    std::vector<io::TensorRef> refs;
    std::vector<uint16_t> half;  // bf16 copies, one block for all tensors
    if (bf16) {
        half.resize(layout.total_floats());
        for (size_t i = 0; i < half.size(); ++i) half[i] = bf16_from_float(params[i]);
    }
    for (const ParamSpec& s : layout.specs()) {
        io::TensorRef r;
        r.name  = s.name;
        r.dtype = bf16 ? io::DType::BF16 : io::DType::F32;
        r.shape = s.shape;
        r.data  = bf16 ? static_cast<const void*>(half.data() + s.offset)
                       : static_cast<const void*>(params + s.offset);
        refs.push_back(std::move(r));
    }
    const std::vector<int> blocks = moe_blocks(m);
    if (m.balance_bias_rate > 0) {
        BGL_CHECK(biases.size() == blocks.size(), "{} balance biases for {} MoE blocks",
                  biases.size(), blocks.size());
        for (size_t i = 0; i < blocks.size(); ++i) {
            BGL_CHECK(biases[i].size() == static_cast<size_t>(m.n_experts),
                      "balance bias of {} values for {} experts", biases[i].size(), m.n_experts);
            io::TensorRef r;
            r.name  = balance_bias_name(blocks[i]);
            r.dtype = io::DType::F32;
            r.shape = {m.n_experts};
            r.data  = biases[i].data();
            refs.push_back(std::move(r));
        }
    }
    std::map<std::string, std::string> meta = metadata;
    meta["format"]                          = "pt";
    io::write_safetensors(dir + "/model.safetensors", refs, meta);
    {
        const std::string tmp = dir + "/config.json.tmp";
        std::ofstream f(tmp);
        f << model_config_to_json(m).dump(2) << "\n";
        f.close();
        if (!f) input_error("{}: cannot write", tmp);
        fs::rename(tmp, dir + "/config.json", ec);
        if (ec) input_error("{}/config.json: cannot write: {}", dir, ec.message());
    }
    if (!tokenizer_path.empty() && fs::exists(tokenizer_path)) {
        const fs::path dst = fs::path(dir) / "tokenizer.model";
        if (fs::absolute(tokenizer_path) != fs::absolute(dst)) {
            fs::copy_file(tokenizer_path, dst, fs::copy_options::overwrite_existing, ec);
            if (ec) input_error("{}: cannot copy tokenizer: {}", dst.string(), ec.message());
        }
    }
}

std::string model_dir_of(const std::string& dir_arg) {
    // "run/model/" and "run/model/." name run/model, whose parent holds the run's config.toml
    std::string dir = fs::path(dir_arg).lexically_normal().string();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (fs::exists(fs::path(dir) / "config.json")) return dir;
    if (fs::exists(fs::path(dir) / "model" / "config.json"))
        return (fs::path(dir) / "model").string();
    input_error("{}: neither an exported model (config.json) nor a run directory (model/)", dir);
}

namespace {

ModelConfig read_config_json(const std::string& dir) {
    const std::string cfg_path = dir + "/config.json";
    if (!fs::exists(cfg_path))
        input_error("{}: not found (is {} an exported model?)", cfg_path, dir);
    if (!fs::is_regular_file(cfg_path))
        input_error("{}: not a regular file", cfg_path);  // a FIFO blocks
    nlohmann::json j;
    {
        std::ifstream f(cfg_path);
        try {
            j = nlohmann::json::parse(f);
        } catch (const nlohmann::json::exception& e) {
            input_error("{}: invalid JSON: {}", cfg_path, json_error_text(e.what()));
        }
    }
    return model_config_from_json(j, cfg_path);
}

// a trained model's weights are finite: a NaN or infinity is a damaged file, whose evaluation,
// samples or further training would mean nothing
void check_finite(const io::SafetensorsFile& st, const std::vector<float>& v,
                  const std::string& name) {
    const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    if (bad != v.end()) {
        input_error("{}: tensor {} holds {} at element {}: expected finite weights", st.path(),
                    name, *bad, bad - v.begin());
    }
}

// Block l's routing bias (E values, finite), whose shape the model `against` implies.
std::vector<float> read_bias(const io::SafetensorsFile& st, int l, int64_t E, const char* against) {
    const std::string name = balance_bias_name(l);
    if (!st.contains(name)) input_error("{}: missing tensor {}", st.path(), name);
    if (st.info(name).shape != std::vector<int64_t>{E}) {
        input_error("{}: tensor {} has shape [{}], {} [{}]", st.path(), name,
                    fmt::join(st.info(name).shape, ", "), against, E);
    }
    std::vector<float> b = st.read_f32(name);
    check_finite(st, b, name);
    return b;
}

}  // namespace

LoadedModel load_model(const std::string& dir) {
    const std::string cfg_path = dir + "/config.json";
    LoadedModel out;
    out.config = read_config_json(dir);
    io::SafetensorsFile st(dir + "/model.safetensors");
    // The number of tensors the config implies must be the file's before the layout is built:
    // a crafted config.json (a million experts in each of thousands of layers) would otherwise
    // make us list more tensors than any file holds.
    uint64_t implied = 0;
    for_each_param_kind(out.config, 1, [&](const ParamSpec&, uint64_t count) { implied += count; });
    const std::vector<int> blocks = moe_blocks(out.config);
    if (out.config.balance_bias_rate > 0) implied += blocks.size();
    if (implied != st.names().size()) {
        input_error("{}: holds {} tensors, {} implies {}", st.path(), st.names().size(), cfg_path,
                    implied);
    }
    const ParamLayout layout = make_layout(out.config);
    // Every tensor the config implies is checked against the file before anything is
    // allocated, so a crafted config.json cannot make us allocate more than the file holds.
    for (const ParamSpec& s : layout.specs()) {
        if (!st.contains(s.name)) input_error("{}: missing tensor {}", st.path(), s.name);
        const io::TensorInfo& ti = st.info(s.name);
        if (ti.shape != s.shape) {
            input_error("{}: tensor {} has shape [{}], config.json implies [{}]", st.path(), s.name,
                        fmt::join(ti.shape, ", "), fmt::join(s.shape, ", "));
        }
    }
    out.params = Buffer<float>(layout.total_floats());
    for (const ParamSpec& s : layout.specs()) {
        const std::vector<float> v = st.read_f32(s.name);
        check_finite(st, v, s.name);
        std::copy(v.begin(), v.end(), out.params.data() + s.offset);
    }
    if (out.config.balance_bias_rate > 0) {
        for (const int l : blocks)
            out.biases.push_back(read_bias(st, l, out.config.n_experts, "config.json implies"));
    }
    for (const std::string& name : st.names()) {
        const bool bias = out.config.balance_bias_rate > 0 &&
                          std::any_of(blocks.begin(), blocks.end(),
                                      [&](int l) { return name == balance_bias_name(l); });
        if (!bias && !layout.find(name))
            input_error("{}: unexpected tensor {} for this config.json", st.path(), name);
    }
    return out;
}

InitWeights load_weights_into(const std::string& dir, const ModelConfig& m,
                              const ParamLayout& layout, float* params, bool upcycle) {
    const ModelConfig there = read_config_json(dir);
    io::SafetensorsFile st(dir + "/model.safetensors");
    // the [model] keys that differ, as the hint of a tensor that does not fit: the keys that
    // shape no tensor (top_k, the gate, the balancing) may differ and are not named alone
    const auto keys_hint = [&] {
        TrainConfig a, b;
        a.model                             = m;
        b.model                             = there;
        const std::vector<KeyDifference> ds = differing_keys(a, b, "model");
        std::vector<std::string> parts;
        for (const KeyDifference& d : ds)
            parts.push_back(fmt::format("{} = {} here, {} there", d.key, d.a, d.b));
        return parts.empty() ? std::string() : fmt::format(" ({})", fmt::join(parts, "; "));
    };
    InitWeights out;
    const std::vector<int> blocks = moe_blocks(m);
    // upcycling: the MoE blocks of m that are dense blocks in the file
    for (const int l : blocks) {
        if (upcycle && st.contains(fmt::format("h.{}.mlp.c_fc.weight", l)))
            out.upcycled.push_back(l);
    }
    // The file's tensor that tensor `name` of m is read from: its own, or in an upcycled block
    // the MLP's that every expert copies; "" for the rest of an upcycled block (the router's
    // weights), which keeps its initial value.
    const auto source = [&](const std::string& name) -> std::string {
        for (const int l : out.upcycled) {
            const std::string block = fmt::format("h.{}.moe.", l);
            if (name.rfind(block, 0) != 0) continue;
            const std::string experts = block + "experts.";
            if (name.rfind(experts, 0) != 0) return "";
            const size_t dot = name.find('.', experts.size());  // after the expert's number
            return fmt::format("h.{}.mlp{}", l, name.substr(dot));
        }
        return name;
    };
    // Every tensor of the whole model must be in the file with its shape, and the file may hold
    // no other weight: checked against the whole layout on every rank, so that all ranks agree.
    const ParamLayout full = make_layout(m);
    std::set<std::string> used;
    for (const ParamSpec& s : full.specs()) {
        const std::string src = source(s.name);
        if (src.empty()) continue;
        if (!st.contains(src)) {
            const bool dense_there =
                st.contains(s.name.substr(0, s.name.find(".moe.")) + ".mlp.c_fc.weight");
            input_error("{}: no tensor {}: a model of another shape{}{}", st.path(), src,
                        keys_hint(),
                        dense_there && !upcycle
                            ? " (train.upcycle = true makes an MoE block from a dense block's MLP)"
                            : "");
        }
        const io::TensorInfo& ti = st.info(src);
        if (ti.shape != s.shape) {
            input_error("{}: tensor {} has shape [{}], this config's model{} [{}]{}", st.path(),
                        src, fmt::join(ti.shape, ", "),
                        src == s.name ? std::string() : " (its " + s.name + ")",
                        fmt::join(s.shape, ", "), keys_hint());
        }
        used.insert(src);
    }
    const std::vector<int> blocks_there = moe_blocks(there);
    const auto is_bias                  = [&](const std::string& name) {
        return there.balance_bias_rate > 0 &&
               std::any_of(blocks_there.begin(), blocks_there.end(),
                                            [&](int l) { return name == balance_bias_name(l); });
    };
    for (const std::string& name : st.names()) {
        if (!is_bias(name) && !used.contains(name)) {
            input_error("{}: tensor {} has no place in this config's model{}", st.path(), name,
                        keys_hint());
        }
    }
    for (const ParamSpec& s : layout.specs()) {
        const ParamSpec* f = full.find(s.name);
        BGL_CHECK(f != nullptr && f->shape == s.shape, "{} is not a tensor of the whole model",
                  s.name);
        const std::string src = source(s.name);
        if (src.empty()) continue;
        const std::vector<float> v = st.read_f32(src);
        check_finite(st, v, src);
        std::copy(v.begin(), v.end(), params + s.offset);
    }
    // the routing biases of the MoE blocks the file's model routed with one; 0 elsewhere
    for (const int l : blocks) {
        if (!is_bias(balance_bias_name(l))) {
            out.biases.emplace_back(static_cast<size_t>(m.n_experts), 0.0f);
            continue;
        }
        out.biases.push_back(read_bias(st, l, m.n_experts, "this config's model"));
        ++out.biases_read;
    }
    return out;
}

}  // namespace bagualu::model

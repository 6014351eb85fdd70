#include "model/model_io.h"

#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/param_layout.h"
#include "model/gpt.h"

namespace bagualu::model {

namespace fs = std::filesystem;

nlohmann::json model_config_to_json(const ModelConfig& m) {
    return nlohmann::json{
        {"model_type", "bagualu-moe-gpt"},
        {"format_version", 1},
        {"vocab_size", m.vocab_size},
        {"d_model", m.d_model},
        {"n_layer", m.n_layer},
        {"n_head", m.n_head},
        {"seq_len", m.seq_len},
        {"d_ff", m.d_ff},
        {"n_experts", m.n_experts},
        {"top_k", m.top_k},
        {"moe_every", m.moe_every},
        {"aux_loss_coef", m.aux_loss_coef},
        {"gate", m.gate},
        {"init_std", m.init_std},
        {"layer_norm_epsilon", 1e-5},
        {"activation", "gelu_tanh"},
        {"tie_word_embeddings", true},
    };
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source) {
    if (!j.is_object()) input_error("{}: expected a JSON object", source);
    // value() would throw json's type_error on a model_type that is not a string
    if (!j.contains("model_type") || j["model_type"] != "bagualu-moe-gpt") {
        input_error("{}: model_type must be \"bagualu-moe-gpt\"", source);
    }
    ModelConfig m;
    auto get_int = [&](const char* key, int& out) {
        if (!j.contains(key) || !j[key].is_number_integer()) input_error("{}: {} must be an integer", source, key);
        // get<int> would wrap a value beyond 32 bits into another, valid-looking one
        const int64_t v = j[key].is_number_unsigned() && j[key].get<uint64_t>() > INT64_MAX
                              ? INT64_MAX
                              : j[key].get<int64_t>();
        if (v < INT_MIN || v > INT_MAX) input_error("{}: {} = {} is out of range", source, key, j[key].dump());
        out = static_cast<int>(v);
    };
    auto get_num = [&](const char* key, double& out) {
        if (!j.contains(key) || !j[key].is_number()) input_error("{}: {} must be a number", source, key);
        out = j[key].get<double>();
    };
    get_int("vocab_size", m.vocab_size);
    get_int("d_model", m.d_model);
    get_int("n_layer", m.n_layer);
    get_int("n_head", m.n_head);
    get_int("seq_len", m.seq_len);
    get_int("d_ff", m.d_ff);
    get_int("n_experts", m.n_experts);
    get_int("top_k", m.top_k);
    get_int("moe_every", m.moe_every);
    get_num("aux_loss_coef", m.aux_loss_coef);
    if (!j.contains("gate") || !j["gate"].is_string()) input_error("{}: gate must be a string", source);
    m.gate = j["gate"].get<std::string>();
    TrainConfig check;
    check.model  = m;
    check.source = source;
    validate(check);
    return m;
}

void save_model(const std::string& dir, const ModelConfig& m, const float* params, bool bf16,
                const std::string& tokenizer_path,
                const std::map<std::string, std::string>& metadata) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) input_error("{}: cannot create directory: {}", dir, ec.message());
    const ParamLayout           layout = make_layout(m);
    std::vector<io::TensorRef>  refs;
    std::vector<uint16_t>       half;  // bf16 copies, one block for all tensors
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
    std::map<std::string, std::string> meta = metadata;
    meta["format"]                          = "pt";
    io::write_safetensors(dir + "/model.safetensors", refs, meta);
    {
        const std::string tmp = dir + "/config.json.tmp";
        std::ofstream     f(tmp);
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

LoadedModel load_model(const std::string& dir) {
    const std::string cfg_path = dir + "/config.json";
    if (!fs::exists(cfg_path)) input_error("{}: not found (is {} an exported model?)", cfg_path, dir);
    nlohmann::json j;
    {
        std::ifstream f(cfg_path);
        try {
            j = nlohmann::json::parse(f);
        } catch (const nlohmann::json::exception& e) {
            input_error("{}: invalid JSON: {}", cfg_path, e.what());
        }
    }
    LoadedModel out;
    out.config = model_config_from_json(j, cfg_path);
    const ParamLayout     layout = make_layout(out.config);
    io::SafetensorsFile   st(dir + "/model.safetensors");
    out.params = Buffer<float>(layout.total_floats());
    for (const ParamSpec& s : layout.specs()) {
        if (!st.contains(s.name)) input_error("{}: missing tensor {}", st.path(), s.name);
        const io::TensorInfo& ti = st.info(s.name);
        if (ti.shape != s.shape) {
            input_error("{}: tensor {} has shape [{}], config.json implies [{}]", st.path(), s.name,
                        fmt::join(ti.shape, ", "), fmt::join(s.shape, ", "));
        }
        const std::vector<float> v = st.read_f32(s.name);
        std::copy(v.begin(), v.end(), out.params.data() + s.offset);
    }
    for (const std::string& name : st.names()) {
        if (!layout.find(name)) input_error("{}: unexpected tensor {} for this config.json", st.path(), name);
    }
    return out;
}

}  // namespace bagualu::model

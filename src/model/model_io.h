// The exported model: a directory holding
//   model.safetensors  every parameter under its name in docs/model.md (F32 or BF16)
//   config.json        the model hyper-parameters (the [model] section) plus format fields
//   tokenizer.model    the SentencePiece model, when one was given
// This is what `bagualu export` writes and `eval` / `sample` read.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "config/config.h"
#include "core/buffer.h"

namespace bagualu::model {

nlohmann::json model_config_to_json(const ModelConfig& m);
// Throws InputError naming `source` and the key on a missing, mistyped or invalid field.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);

// params: a flat array in make_layout(m) order.
void save_model(const std::string& dir, const ModelConfig& m, const float* params, bool bf16,
                const std::string& tokenizer_path,
                const std::map<std::string, std::string>& metadata = {});

struct LoadedModel {
    ModelConfig   config;
    Buffer<float> params;  // make_layout(config) order
};
// Throws InputError naming the file on a missing file, a missing tensor or a wrong shape.
LoadedModel load_model(const std::string& dir);

}  // namespace bagualu::model

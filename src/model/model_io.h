// The exported model: a directory holding
//   model.safetensors  every parameter under its name in docs/model.md (F32 or BF16)
//   config.json        the model hyper-parameters (the [model] section) plus format fields
//   tokenizer.model    the SentencePiece model, when one was given
// This is what `bagualu export` writes and `eval` / `sample` read.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "model/param_layout.h"
#include "moe/balance_bias.h"

namespace bagualu::model {

nlohmann::json model_config_to_json(const ModelConfig& m);
// Throws InputError naming `source` and the key on a missing, mistyped or invalid field.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);

// The name of block `layer`'s balancing bias in model.safetensors (moe/balance_bias.h).
std::string balance_bias_name(int layer);

// params: a flat array in make_layout(m) order. biases: with model.balance_bias_rate > 0, every
// MoE block's routing bias, written as h.{l}.moe.gate.bias (E), always F32: it decides the
// choice of experts, and rounding it would change that choice.
void save_model(const std::string& dir, const ModelConfig& m, const float* params, bool bf16,
                const std::string& tokenizer_path,
                const std::map<std::string, std::string>& metadata = {},
                const moe::BalanceBiases& biases                   = {});

struct LoadedModel {
    ModelConfig config;
    Buffer<float> params;       // make_layout(config) order
    moe::BalanceBiases biases;  // with model.balance_bias_rate > 0: one (E) per MoE block
};
// Throws InputError naming the file on a missing file, a missing tensor or a wrong shape.
LoadedModel load_model(const std::string& dir);

// The exported model directory a command-line or config argument names: an exported model
// (holding config.json) or a run directory (its model/). InputError for anything else.
std::string model_dir_of(const std::string& dir_arg);

// Training from an exported model's weights (train.init_from). The file must hold every tensor
// of make_layout(m), the whole model of this config, with its shape, and no other weight (the
// [model] keys that shape no tensor, such as top_k, the gate or the balancing, may differ from
// its config.json). Reads only the tensors of `layout`, one rank's part of that model (its
// dense tensors and its experts), into params at their offsets. With `upcycle` (sparse
// upcycling, train.upcycle), an MoE block of m that is a dense block in the file takes its MLP
// into every expert (c_fc and c_proj, weights and biases, of the shapes the experts have) and
// keeps its router's initial weights. Throws InputError naming the file, the tensor and the
// [model] keys that differ.
struct InitWeights {
    moe::BalanceBiases biases;  // one (E) per MoE block of m: the file's, or 0 where it has none
    int biases_read = 0;        // the MoE blocks whose bias the file holds
    std::vector<int> upcycled;  // the MoE blocks of m made from a dense block's MLP
};
InitWeights load_weights_into(const std::string& dir, const ModelConfig& m,
                              const ParamLayout& layout, float* params, bool upcycle = false);

}  // namespace bagualu::model

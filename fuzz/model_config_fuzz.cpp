// libFuzzer entry point for an exported model's config.json (src/model/model_io.cpp): the input
// is parsed as JSON the way load_model parses the file, and model_config_from_json reads and
// validates the [model] fields. Whatever is accepted must hold the file's values and come back
// unchanged through model_config_to_json. Any crash, sanitizer report or exception other than
// InputError is a bug. The tensors load_model reads next go through the safetensors reader
// (safetensors_fuzz). Build and run: fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/model_io.h"

namespace model = bagualu::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);  // as load_model: a parse error becomes an InputError
    } catch (const nlohmann::json::exception&) {
        return 0;
    }
    try {
        const bagualu::ModelConfig m = model::model_config_from_json(j, "config.json");
        const nlohmann::json back    = model::model_config_to_json(m);
        // Every field the file gave must hold its value, not a wrapped or rounded one (the
        // training-only keys may be absent: they keep their defaults).
        for (const char* key : {"vocab_size", "d_model", "n_layer", "n_head", "seq_len", "d_ff",
                                "n_experts", "top_k", "moe_every", "aux_loss_coef", "gate"}) {
            if (j.contains(key) && j[key] != back[key]) {
                std::fprintf(stderr, "%s: read %s from %s\n", key, back[key].dump().c_str(),
                             j[key].dump().c_str());
                std::abort();
            }
        }
        const bagualu::ModelConfig m2 = model::model_config_from_json(back, "round trip");
        if (model::model_config_to_json(m2) != back) {
            std::fprintf(stderr, "round trip changed config.json: %s\n", back.dump().c_str());
            std::abort();
        }
    } catch (const bagualu::InputError&) {
    }
    return 0;
}

#include "model/precision.h"

#include <fmt/format.h>

#include "core/error.h"

namespace bagualu::model {

namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool contains(const std::string& s, const char* p) { return s.find(p) != std::string::npos; }

bool is_layernorm(const std::string& name) {
    return starts_with(name, "ln_f.") || contains(name, ".ln_1.") || contains(name, ".ln_2.");
}
bool is_gate(const std::string& name) {
    return contains(name, ".moe.gate.") || contains(name, ".moe.noise.");
}

}  // namespace

PrecisionPolicy PrecisionPolicy::from_config(const PrecisionSection& p) {
    PrecisionPolicy r;
    r.dtype                                          = p.dtype;
    r.level[static_cast<int>(LayerClass::embedding)] = p.embedding;
    r.level[static_cast<int>(LayerClass::attention)] = p.attention;
    r.level[static_cast<int>(LayerClass::ffn)]       = p.ffn;
    r.level[static_cast<int>(LayerClass::head)]      = p.head;
    r.fp64_sensitive                                 = p.fp64_sensitive;
    return r;
}

PrecisionPolicy PrecisionPolicy::uniform(Dtype d, Level l, bool fp64) {
    PrecisionPolicy r;
    r.dtype = d;
    for (Level& x : r.level) x = l;
    r.fp64_sensitive = fp64;
    return r;
}

LayerClass PrecisionPolicy::class_of(const std::string& name) {
    if (name == "wte" || name == "wpe") return LayerClass::embedding;
    if (starts_with(name, "ln_f.")) return LayerClass::head;
    if (contains(name, ".ln_1.") || contains(name, ".attn.")) return LayerClass::attention;
    BGL_CHECK(contains(name, ".ln_2.") || contains(name, ".mlp.") || contains(name, ".moe."),
              "no layer class for parameter {}", name);
    return LayerClass::ffn;
}

Dtype PrecisionPolicy::storage_dtype(const ParamSpec& s) const {
    if (!mixed()) return Dtype::float32;  // any layout, whatever its tensors are called
    const Level l = of(class_of(s.name));
    if (l == Level::O3) return dtype;
    if (l == Level::O2 && !is_layernorm(s.name) && !is_gate(s.name)) return dtype;
    return Dtype::float32;
}

MasterMode PrecisionPolicy::master_mode(const ParamSpec& s) const {
    if (storage_dtype(s) == Dtype::float32) return MasterMode::none;
    return of(class_of(s.name)) == Level::O3 ? MasterMode::half : MasterMode::master;
}

Dtype PrecisionPolicy::compute_dtype(const ParamSpec& s) const {
    if (!mixed()) return Dtype::float32;
    const Dtype st = storage_dtype(s);
    if (st != Dtype::float32) return st;
    // float32-stored GEMM weights of an O1 class: rounded as GEMM operands. wte is the
    // embedding's table here; the LM head rounds its own copy (GPT).
    const LayerClass c = class_of(s.name);
    if (c == LayerClass::embedding || is_layernorm(s.name) || is_gate(s.name)) return Dtype::float32;
    const bool matrix = s.shape.size() == 2;
    return matrix ? gemm_dtype(c) : Dtype::float32;
}

std::string PrecisionPolicy::describe() const {
    if (!mixed()) return fmt::format("fp32{}", fp64_sensitive ? ", fp64 sensitive ops" : "");
    return fmt::format("{}: embedding {}, attention {}, ffn {}, head {}{}", dtype_name(dtype),
                       level_name(level[0]), level_name(level[1]), level_name(level[2]),
                       level_name(level[3]), fp64_sensitive ? ", fp64 sensitive ops" : "");
}

}  // namespace bagualu::model

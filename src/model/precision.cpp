#include "model/precision.h"

#include <fmt/format.h>

#include "core/error.h"

namespace bagualu::model {

namespace {

// The tensor table's row of a parameter; an error for a name that is not the model's.
const TensorDef& def_of(const std::string& name) {
    const std::optional<size_t> row = tensor_row_of(name);
    BGL_CHECK(row.has_value(), "no layer class for parameter {}", name);
    return tensor_def(*row);
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
    r.router                                         = p.router;
    r.half_reduce                                    = p.grad_reduce == GradReduce::half;
    // like every precision key, only in a half-precision run: dtype = "fp32" is float32 throughout
    r.moments = p.moments == MomentDtype::bfloat16 && p.dtype != Dtype::float32 ? Dtype::bfloat16
                                                                                : Dtype::float32;
    return r;
}

PrecisionPolicy PrecisionPolicy::uniform(Dtype d, Level l, bool fp64) {
    PrecisionPolicy r;
    r.dtype = d;
    for (Level& x : r.level) x = l;
    r.fp64_sensitive = fp64;
    return r;
}

LayerClass PrecisionPolicy::class_of(const std::string& name) { return def_of(name).cls; }

Dtype PrecisionPolicy::storage_dtype(const ParamSpec& s) const {
    if (!mixed()) return Dtype::float32;  // any layout, whatever its tensors are called
    const TensorDef& d = def_of(s.name);
    const Level l      = of(d.cls);
    if (d.role == Role::gate) return Dtype::float32;  // the router, at every level
    if (l == Level::O3) return dtype;
    if (l == Level::O2 && d.role == Role::plain) return dtype;  // not layernorm
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
    const TensorDef& d = def_of(s.name);
    const LayerClass c = d.cls;
    if (c == LayerClass::embedding || d.role != Role::plain) return Dtype::float32;
    const bool matrix = s.shape.size() == 2;
    return matrix ? gemm_dtype(c) : Dtype::float32;
}

std::string PrecisionPolicy::describe() const {
    const std::string extra =
        fmt::format("{}{}{}{}{}", fp64_sensitive ? ", fp64 sensitive ops" : "",
                    router_fp64() ? ", fp64 router" : "",
                    router_dtype() != Dtype::float32 ? ", half router" : "",
                    half_reduce && mixed() ? ", half gradient reduce-scatter" : "",
                    moments != Dtype::float32 && mixed() ? ", bf16 AdamW moments" : "");
    if (!mixed()) return "fp32" + extra;
    return fmt::format("{}: embedding {}, attention {}, ffn {}, head {}{}", dtype_name(dtype),
                       level_name(level[0]), level_name(level[1]), level_name(level[2]),
                       level_name(level[3]), extra);
}

}  // namespace bagualu::model

// The mixed-precision policy of a model (docs/precision.md): a level per layer class, the half
// type, and what follows from them for each parameter tensor and each GEMM. Half-precision
// values live in the model's float arrays rounded to the half type (kernels/mixed.h), so every
// kernel, collective and file format keeps working on floats; what the policy decides is where
// values are rounded and which tensors the optimizer keeps FP32 master weights for.
#pragma once
#include <cstddef>
#include <string>

#include "config/config.h"
#include "core/dtype.h"
#include "model/param_layout.h"
#include "model/tensor_table.h"

namespace bagualu::model {

using bagualu::Level;  // config/enums.h; LayerClass: model/tensor_table.h

// How the optimizer treats a tensor.
enum class MasterMode {
    none,    // float32 parameter, updated in place
    master,  // half parameter (O2): the optimizer keeps an FP32 master copy and rounds after the
             // update
    half,    // half parameter without a master (O3): updated in place, then rounded
};

struct PrecisionPolicy {
    Dtype dtype         = Dtype::float32;
    Level level[4]      = {Level::O0, Level::O0, Level::O0, Level::O0};  // by LayerClass
    bool fp64_sensitive = false;
    // precision.router: the router's products and softmax in float32, in FP64, or (in a
    // mixed-precision run only) on operands of the half type
    RouterPrecision router = RouterPrecision::fp32;
    bool half_reduce       = false;  // precision.grad_reduce = "half" (mixed precision only)
    // precision.moments: AdamW's m and v in float32 or (in a half-precision run only) bf16
    Dtype moments = Dtype::float32;
    // Bytes of one moment value (m or v): 4, or 2 for bf16.
    size_t moment_bytes() const { return moments == Dtype::float32 ? 4 : 2; }

    static PrecisionPolicy from_config(const PrecisionSection& p);
    // Every class at `l` (for tests and experiments).
    static PrecisionPolicy uniform(Dtype d, Level l, bool fp64 = false);

    // Anything below float32 anywhere.
    bool mixed() const { return dtype != Dtype::float32; }
    Level of(LayerClass c) const { return mixed() ? level[static_cast<int>(c)] : Level::O0; }
    // Operands of the class's GEMMs (O1 and up).
    Dtype gemm_dtype(LayerClass c) const { return of(c) >= Level::O1 ? dtype : Dtype::float32; }
    // The operands of the MoE router's products: float32, or the half type under
    // precision.router = "half" in a mixed-precision run.
    Dtype router_dtype() const {
        return router == RouterPrecision::half && mixed() ? dtype : Dtype::float32;
    }
    bool router_fp64() const { return router == RouterPrecision::fp64; }
    // Activations the class stores (O2 and up); the residual stream stays float32.
    Dtype act_dtype(LayerClass c) const { return of(c) >= Level::O2 ? dtype : Dtype::float32; }
    // Dynamic loss scaling runs for fp16 only.
    bool loss_scaling() const { return dtype == Dtype::float16; }

    // The class of a parameter tensor, from its name: its row of the tensor table.
    static LayerClass class_of(const std::string& name);
    // The dtype a tensor is stored in: the half type for GEMM weights and biases at O2 and up,
    // for every tensor of the class at O3 (layernorm parameters included); the MoE gate's is
    // float32 at every level;
    // float32 otherwise.
    Dtype storage_dtype(const ParamSpec& s) const;
    MasterMode master_mode(const ParamSpec& s) const;
    // The dtype a tensor's values enter the computation in: storage_dtype, or the GEMM dtype
    // for a float32-stored GEMM weight at O1 (never the gate's).
    Dtype compute_dtype(const ParamSpec& s) const;
    // One line for the log: "bf16: embedding O0, attention O1, ffn O2, head O1" or "fp32".
    std::string describe() const;
};

// Whether the replicated optimizer keeps an O2 tensor's FP32 master in the parameter itself
// instead of a master copy beside the rounded parameter: in bf16, whose products round their
// operands to bf16 themselves (kernels::half_products_convert), so forward computes with the
// rounded master either way; its other readers (biases, an O2 embedding) take rounded copies
// (GPT::keep_masters_in_place). ParO keeps its masters in its shards, fp16 beside the rounded
// parameters.
inline bool masters_in_place(const PrecisionPolicy& prec, bool partitioned) {
    return prec.dtype == Dtype::bfloat16 && !partitioned;
}

inline const char* level_name(Level l) { return name_of(l); }

}  // namespace bagualu::model

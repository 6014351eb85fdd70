// The model's parameter tensors, declared once (docs/model.md, Parameters, lists the same table
// and tests/unit/model/tensor_table_test.cpp checks that they agree). make_layout,
// for_each_param_kind, layout_size, resolve, init_params, the precision policy's layer classes
// and the exported model all read kTensorTable; a new tensor is one row (and its slot in
// BlockTensors or ModelTensors).
//
// Layout order: the model rows before the first block row, then block by block the block and
// expert rows the block has, in table order (an expert row: every expert of this rank, in id
// order, before the next row), then the model rows after the last block row. Tensor number i of
// the full (single-process) layout in that order initialises from Rng(seed, i + 1).
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "moe/experts.h"

namespace bagualu::model {

// The precision policy's layer classes (model/precision.h, docs/precision.md).
enum class LayerClass { embedding, attention, ffn, head };

// Pointers to one block's tensors inside a flat parameter (or gradient) array.
template <typename P>
struct BlockTensors {
    P* ln1_w  = nullptr;  // (C)
    P* ln1_b  = nullptr;  // (C)
    P* qkv_w  = nullptr;  // (3C, C)
    P* qkv_b  = nullptr;  // (3C)
    P* proj_w = nullptr;  // (C, C)
    P* proj_b = nullptr;  // (C)
    P* ln2_w  = nullptr;  // (C)
    P* ln2_b  = nullptr;  // (C)
    // dense MLP blocks
    P* fc_w     = nullptr;  // (F, C)
    P* fc_b     = nullptr;  // (F)
    P* fcproj_w = nullptr;  // (C, F)
    P* fcproj_b = nullptr;  // (C)
    // MoE blocks
    P* gate_w  = nullptr;  // (E, C)
    P* noise_w = nullptr;  // (E, C), noisy gate only
    moe::ExpertTensors<P> experts;
    moe::ExpertTensors<P> shared;  // the shared experts, every rank all of them
};

template <typename P>
struct ModelTensors {
    P* wte = nullptr;                     // (V, C), also the LM head
    P* wpe = nullptr;                     // (seq_len, C)
    std::vector<BlockTensors<P>> blocks;  // [n_layer]
    P* lnf_w = nullptr;
    P* lnf_b = nullptr;
};

// How many of a tensor there are: one per model, one per block that has it, one per expert of
// each MoE block, one per shared expert of each MoE block (model.n_shared_experts, dense: every
// rank holds all of them).
enum class Scope { model, block, expert, shared };
// The blocks that have a block or expert tensor.
enum class Blocks {
    every,
    dense,
    moe,
    moe_noisy,  // MoE blocks with model.gate = "noisy"
    moe_shared  // MoE blocks with model.n_shared_experts > 0
};
// A dimension as a function of the config: V vocab_size, T seq_len, C d_model, C3 = 3 d_model,
// F d_ff, E n_experts, FS the shared experts' width (model.shared_d_ff, else d_ff), FE the
// routed experts' width (model.expert_d_ff, else d_ff), G the gate's rows (E, or the product
// keys' rows, ModelConfig::gate_rows).
enum class Dim { V, T, C, C3, F, E, FS, FE, G };
// zeros, ones, N(0, init_std²), N(0, init_std² / (2 n_layer)) (GPT-2's residual projections).
enum class Init { zeros, ones, normal, normal_resid };
// What the precision policy needs to know beyond the class: layernorm and gate parameters stay
// float32 below O3 (docs/precision.md).
enum class Role { plain, layernorm, gate };

struct TensorDef {
    // The name in model.safetensors with {l} the block, {e} the expert id and {i} the shared
    // expert.
    const char* pattern;
    Scope scope;
    Blocks blocks;  // Blocks::every for model tensors
    Dim dims[2];    // dims[0 .. rank)
    int rank;
    bool decay;  // AdamW weight decay
    LayerClass cls;
    Init init;
    Role role;
};

template <typename P>
struct TensorRow {
    TensorDef def;
    P* ModelTensors<P>::*model_slot        = nullptr;  // Scope::model
    P* BlockTensors<P>::*block_slot        = nullptr;  // Scope::block
    P* moe::ExpertTensors<P>::*expert_slot = nullptr;  // Scope::expert (in experts) and
                                                       // Scope::shared (in shared): e0's
    size_t moe::ExpertTensors<P>::*stride_slot =
        nullptr;  //   and the floats from one expert to the next
};

// clang-format off
template <typename P>
inline constexpr TensorRow<P> kTensorTable[] = {
    {{"wte", Scope::model, Blocks::every,
      {Dim::V, Dim::C}, 2, true, LayerClass::embedding, Init::normal, Role::plain},
     &ModelTensors<P>::wte},
    {{"wpe", Scope::model, Blocks::every,
      {Dim::T, Dim::C}, 2, true, LayerClass::embedding, Init::normal, Role::plain},
     &ModelTensors<P>::wpe},
    {{"h.{l}.ln_1.weight", Scope::block, Blocks::every,
      {Dim::C}, 1, false, LayerClass::attention, Init::ones, Role::layernorm},
     nullptr, &BlockTensors<P>::ln1_w},
    {{"h.{l}.ln_1.bias", Scope::block, Blocks::every,
      {Dim::C}, 1, false, LayerClass::attention, Init::zeros, Role::layernorm},
     nullptr, &BlockTensors<P>::ln1_b},
    {{"h.{l}.attn.c_attn.weight", Scope::block, Blocks::every,
      {Dim::C3, Dim::C}, 2, true, LayerClass::attention, Init::normal, Role::plain},
     nullptr, &BlockTensors<P>::qkv_w},
    {{"h.{l}.attn.c_attn.bias", Scope::block, Blocks::every,
      {Dim::C3}, 1, false, LayerClass::attention, Init::zeros, Role::plain},
     nullptr, &BlockTensors<P>::qkv_b},
    {{"h.{l}.attn.c_proj.weight", Scope::block, Blocks::every,
      {Dim::C, Dim::C}, 2, true, LayerClass::attention, Init::normal_resid, Role::plain},
     nullptr, &BlockTensors<P>::proj_w},
    {{"h.{l}.attn.c_proj.bias", Scope::block, Blocks::every,
      {Dim::C}, 1, false, LayerClass::attention, Init::zeros, Role::plain},
     nullptr, &BlockTensors<P>::proj_b},
    {{"h.{l}.ln_2.weight", Scope::block, Blocks::every,
      {Dim::C}, 1, false, LayerClass::ffn, Init::ones, Role::layernorm},
     nullptr, &BlockTensors<P>::ln2_w},
    {{"h.{l}.ln_2.bias", Scope::block, Blocks::every,
      {Dim::C}, 1, false, LayerClass::ffn, Init::zeros, Role::layernorm},
     nullptr, &BlockTensors<P>::ln2_b},
    {{"h.{l}.moe.gate.weight", Scope::block, Blocks::moe,
      {Dim::G, Dim::C}, 2, true, LayerClass::ffn, Init::normal, Role::gate},
     nullptr, &BlockTensors<P>::gate_w},
    {{"h.{l}.moe.noise.weight", Scope::block, Blocks::moe_noisy,
      {Dim::E, Dim::C}, 2, true, LayerClass::ffn, Init::normal, Role::gate},
     nullptr, &BlockTensors<P>::noise_w},
    {{"h.{l}.moe.experts.{e}.c_fc.weight", Scope::expert, Blocks::moe,
      {Dim::FE, Dim::C}, 2, true, LayerClass::ffn, Init::normal, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::fc_w, &moe::ExpertTensors<P>::fc_w_stride},
    {{"h.{l}.moe.experts.{e}.c_fc.bias", Scope::expert, Blocks::moe,
      {Dim::FE}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::fc_b, &moe::ExpertTensors<P>::fc_b_stride},
    {{"h.{l}.moe.experts.{e}.c_proj.weight", Scope::expert, Blocks::moe,
      {Dim::C, Dim::FE}, 2, true, LayerClass::ffn, Init::normal_resid, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::proj_w, &moe::ExpertTensors<P>::proj_w_stride},
    {{"h.{l}.moe.experts.{e}.c_proj.bias", Scope::expert, Blocks::moe,
      {Dim::C}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::proj_b, &moe::ExpertTensors<P>::proj_b_stride},
    {{"h.{l}.moe.shared.{i}.c_fc.weight", Scope::shared, Blocks::moe_shared,
      {Dim::FS, Dim::C}, 2, true, LayerClass::ffn, Init::normal, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::fc_w, &moe::ExpertTensors<P>::fc_w_stride},
    {{"h.{l}.moe.shared.{i}.c_fc.bias", Scope::shared, Blocks::moe_shared,
      {Dim::FS}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::fc_b, &moe::ExpertTensors<P>::fc_b_stride},
    {{"h.{l}.moe.shared.{i}.c_proj.weight", Scope::shared, Blocks::moe_shared,
      {Dim::C, Dim::FS}, 2, true, LayerClass::ffn, Init::normal_resid, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::proj_w, &moe::ExpertTensors<P>::proj_w_stride},
    {{"h.{l}.moe.shared.{i}.c_proj.bias", Scope::shared, Blocks::moe_shared,
      {Dim::C}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, nullptr, &moe::ExpertTensors<P>::proj_b, &moe::ExpertTensors<P>::proj_b_stride},
    {{"h.{l}.mlp.c_fc.weight", Scope::block, Blocks::dense,
      {Dim::F, Dim::C}, 2, true, LayerClass::ffn, Init::normal, Role::plain},
     nullptr, &BlockTensors<P>::fc_w},
    {{"h.{l}.mlp.c_fc.bias", Scope::block, Blocks::dense,
      {Dim::F}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, &BlockTensors<P>::fc_b},
    {{"h.{l}.mlp.c_proj.weight", Scope::block, Blocks::dense,
      {Dim::C, Dim::F}, 2, true, LayerClass::ffn, Init::normal_resid, Role::plain},
     nullptr, &BlockTensors<P>::fcproj_w},
    {{"h.{l}.mlp.c_proj.bias", Scope::block, Blocks::dense,
      {Dim::C}, 1, false, LayerClass::ffn, Init::zeros, Role::plain},
     nullptr, &BlockTensors<P>::fcproj_b},
    {{"ln_f.weight", Scope::model, Blocks::every,
      {Dim::C}, 1, false, LayerClass::head, Init::ones, Role::layernorm},
     &ModelTensors<P>::lnf_w},
    {{"ln_f.bias", Scope::model, Blocks::every,
      {Dim::C}, 1, false, LayerClass::head, Init::zeros, Role::layernorm},
     &ModelTensors<P>::lnf_b},
};
// clang-format on

inline constexpr size_t kNumTensorDefs = std::size(kTensorTable<float>);
inline const TensorDef& tensor_def(size_t row) { return kTensorTable<float>[row].def; }

// Whether block `layer` of m has the block or expert tensor d (model tensors: true).
bool has_tensor(const TensorDef& d, const ModelConfig& m, int layer);
std::vector<int64_t> tensor_shape(const TensorDef& d, const ModelConfig& m);
// The pattern with {l} = layer and {e} or {i} = expert.
std::string tensor_name(const TensorDef& d, int layer, int64_t expert);
// The row whose pattern `name` instantiates (h.<l>., experts.<e>. and shared.<i>. replaced), if
// any.
std::optional<size_t> tensor_row_of(std::string_view name);

// One tensor kind in layout order: row, block (-1 for model tensors) and the experts
// [e0, e1) this rank holds (an expert row), the shared experts [0, n_shared_experts) (a shared
// row), else e0 = 0, e1 = 1.
struct TensorKind {
    size_t row;
    int layer;
    int64_t e0, e1;
};
// Every tensor kind of make_layout(m, ep_size, ep_rank) in layout order.
std::vector<TensorKind> tensor_kinds(const ModelConfig& m, int ep_size, int ep_rank);

}  // namespace bagualu::model

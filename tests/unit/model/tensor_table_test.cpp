// The tensor table (model/tensor_table.h) against docs/model.md and against the layouts built
// from it: the documented table lists the same tensors in the same order with the same shape,
// blocks, init, decay and layer class; every layout name maps back to its row; resolve puts
// every pointer of ModelTensors where make_layout put the tensor.
#include "model/tensor_table.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../../common/tiny_model.h"
#include "model/gpt.h"
#include "model/precision.h"

namespace bagualu::model {
namespace {

// ---- the table as docs/model.md writes it ----

std::string dim_text(Dim d) {
    switch (d) {
        case Dim::V:
            return "V";
        case Dim::T:
            return "T_max";
        case Dim::C:
            return "C";
        case Dim::C3:
            return "3C";
        case Dim::F:
            return "F";
        case Dim::E:
            return "E";
        case Dim::FS:
            return "FS";
        case Dim::FE:
            return "FE";
        case Dim::G:
            return "G";
    }
    return "?";
}

std::string shape_text(const TensorDef& d) {
    std::string s = "(";
    for (int i = 0; i < d.rank; ++i) s += (i ? ", " : "") + dim_text(d.dims[i]);
    return s + ")";
}

std::string blocks_text(const TensorDef& d) {
    if (d.scope == Scope::model) return "—";
    switch (d.blocks) {
        case Blocks::every:
            return "every";
        case Blocks::dense:
            return "dense";
        case Blocks::moe:
            return "MoE";
        case Blocks::moe_noisy:
            return "MoE, `gate = \"noisy\"`";
        case Blocks::moe_shared:
            return "MoE, `n_shared_experts > 0`";
    }
    return "?";
}

std::string init_text(Init i) {
    switch (i) {
        case Init::zeros:
            return "0";
        case Init::ones:
            return "1";
        case Init::normal:
            return "N(0, σ²)";
        case Init::normal_resid:
            return "N(0, σ²/(2L))";
    }
    return "?";
}

std::string class_text(LayerClass c) {
    switch (c) {
        case LayerClass::embedding:
            return "embedding";
        case LayerClass::attention:
            return "attention";
        case LayerClass::ffn:
            return "ffn";
        case LayerClass::head:
            return "head";
    }
    return "?";
}

std::string trim(const std::string& s) {
    const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The cells of a Markdown table row "| a | b |".
std::vector<std::string> cells(const std::string& line) {
    std::vector<std::string> out;
    std::string cell;
    std::istringstream in(line.substr(1));
    while (std::getline(in, cell, '|')) out.push_back(trim(cell));
    return out;
}

std::string read_doc() {
    std::ifstream f(std::string(BGL_SOURCE_DIR) + "/docs/model.md");
    EXPECT_TRUE(f.good()) << "docs/model.md not found";
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// The rows of the table whose header starts with "| name | shape | blocks |".
std::vector<std::vector<std::string>> doc_tensor_table(const std::string& doc) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(doc);
    bool inside = false;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("| name | shape | blocks |", 0) == 0) {
            EXPECT_EQ(cells(line), (std::vector<std::string>{"name", "shape", "blocks", "init",
                                                             "weight decay", "class"}));
            inside = true;
            std::getline(in, line);  // |---|...
            continue;
        }
        if (!inside) continue;
        if (line.empty() || line[0] != '|') break;
        rows.push_back(cells(line));
    }
    return rows;
}

TEST(TensorTable, DocsModelMdListsTheTable) {
    const auto rows = doc_tensor_table(read_doc());
    ASSERT_EQ(rows.size(), kNumTensorDefs) << "docs/model.md, Parameters: one row per tensor";
    for (size_t i = 0; i < kNumTensorDefs; ++i) {
        const TensorDef& d = tensor_def(i);
        ASSERT_EQ(rows[i].size(), 6u) << "row " << i;
        EXPECT_EQ(rows[i][0], std::string("`") + d.pattern + "`") << "row " << i;
        EXPECT_EQ(rows[i][1], shape_text(d)) << d.pattern;
        EXPECT_EQ(rows[i][2], blocks_text(d)) << d.pattern;
        EXPECT_EQ(rows[i][3], init_text(d.init)) << d.pattern;
        EXPECT_EQ(rows[i][4], d.decay ? "yes" : "no") << d.pattern;
        EXPECT_EQ(rows[i][5], class_text(d.cls)) << d.pattern;
    }
}

TEST(TensorTable, DocsModelMdListsEveryConfigJsonKey) {
    const std::string doc = read_doc();
    const size_t from     = doc.find("## Exported model");
    ASSERT_NE(from, std::string::npos);
    const std::string section = doc.substr(from);
    ModelConfig m;
    visit_model_fields(m, [&](const char* key, auto&, bool) {
        EXPECT_NE(section.find(std::string("`") + key + "`"), std::string::npos)
            << "docs/model.md, Exported model, does not name config.json's key " << key;
    });
}

// ---- the table against the layouts built from it ----

std::vector<ModelConfig> configs() {
    std::vector<ModelConfig> out;
    for (GateKind gate : {GateKind::topk, GateKind::noisy}) {
        for (int moe_every : {0, 1, 2}) {
            for (int shared : {0, 2}) {
                ModelConfig m      = testing::tiny_moe_config();
                m.gate             = gate;
                m.moe_every        = moe_every;
                m.n_shared_experts = shared;
                out.push_back(m);
            }
        }
    }
    return out;
}

TEST(TensorTable, EveryLayoutNameMapsBackToItsRow) {
    for (const ModelConfig& m : configs()) {
        std::set<size_t> seen;
        const ParamLayout L = make_layout(m, 2, 1);
        for (const ParamSpec& s : L.specs()) {
            const auto row = tensor_row_of(s.name);
            ASSERT_TRUE(row.has_value()) << s.name;
            const TensorDef& d = tensor_def(*row);
            EXPECT_EQ(tensor_shape(d, m), s.shape) << s.name;
            EXPECT_EQ(d.decay, s.decay) << s.name;
            EXPECT_EQ(d.scope == Scope::expert, s.expert) << s.name;
            EXPECT_EQ(PrecisionPolicy::class_of(s.name), d.cls) << s.name;
            seen.insert(*row);
        }
        // the noise row only with the noisy gate, the shared-expert rows only with shared
        // experts, the MLP rows only with dense blocks
        const bool noise  = m.gate == GateKind::noisy && m.moe_every > 0;
        const bool shared = m.n_shared_experts > 0 && m.moe_every > 0;
        EXPECT_EQ(seen.size(), kNumTensorDefs - (noise ? 0 : 1) - (shared ? 0 : 4) -
                                   (m.moe_every == 1 ? 4 : 0) - (m.moe_every == 0 ? 5 : 0))
            << "moe_every " << m.moe_every;
    }
    for (const char* bad :
         {"h.x.ln_1.weight", "h.0.ln_3.weight", "h.0.moe.experts.ln_1.weight", "wte.weight",
          "h.0.moe.experts.1.c_fc.weight.x", "h.0.moe.shared.x.c_fc.weight",
          "h.0.moe.shared.0.experts.0.c_fc.bias"}) {
        EXPECT_FALSE(tensor_row_of(bad).has_value()) << bad;
    }
}

TEST(TensorTable, ResolvePointsEverySlotAtItsTensor) {
    for (const ModelConfig& m : configs()) {
        for (const auto& [ep, rank] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{4, 3}}) {
            const ParamLayout L = make_layout(m, ep, rank);
            std::vector<float> params(L.total_floats());
            float* const base = params.data();
            const auto t      = resolve<float>(L, m, base, ep, rank);
            auto at           = [&](const std::string& name) -> const float* {
                const ParamSpec* s = L.find(name);
                return s ? base + s->offset : nullptr;
            };
            EXPECT_EQ(t.wte, at("wte"));
            EXPECT_EQ(t.wpe, at("wpe"));
            EXPECT_EQ(t.lnf_b, at("ln_f.bias"));
            const int e0 = m.n_experts / ep * rank;
            for (int l = 0; l < m.n_layer; ++l) {
                const auto& b       = t.blocks[static_cast<size_t>(l)];
                const std::string p = "h." + std::to_string(l) + ".";
                EXPECT_EQ(b.ln2_b, at(p + "ln_2.bias"));
                EXPECT_EQ(b.fcproj_b, at(p + "mlp.c_proj.bias"));
                EXPECT_EQ(b.noise_w, at(p + "moe.noise.weight"));
                EXPECT_EQ(b.shared.fc_b, at(p + "moe.shared.0.c_fc.bias"));
                if (m.is_moe_block(l) && m.n_shared_experts > 1) {
                    EXPECT_EQ(b.shared.fc_b + b.shared.fc_b_stride,
                              at(p + "moe.shared.1.c_fc.bias"));
                }
                const std::string e = p + "moe.experts.";
                EXPECT_EQ(b.experts.proj_w, at(e + std::to_string(e0) + ".c_proj.weight"));
                if (m.is_moe_block(l) && ep < m.n_experts) {
                    EXPECT_EQ(b.experts.proj_w + b.experts.proj_w_stride,
                              at(e + std::to_string(e0 + 1) + ".c_proj.weight"));
                }
            }
        }
    }
}

}  // namespace
}  // namespace bagualu::model

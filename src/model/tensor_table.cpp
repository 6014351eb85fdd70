#include "model/tensor_table.h"

#include <fmt/format.h>

#include <cctype>

namespace bagualu::model {

namespace {

// The rows of the blocks: [first, last] (model rows sit before and after them).
struct BlockRows {
    size_t first = kNumTensorDefs, last = 0;
};
BlockRows block_rows() {
    BlockRows r;
    for (size_t i = 0; i < kNumTensorDefs; ++i) {
        if (tensor_def(i).scope != Scope::model) {
            r.first = std::min(r.first, i);
            r.last  = i;
        }
    }
    return r;
}

int64_t dim_of(Dim d, const ModelConfig& m) {
    switch (d) {
        case Dim::V:
            return m.vocab_size;
        case Dim::T:
            return m.seq_len;
        case Dim::C:
            return m.d_model;
        case Dim::C3:
            return 3 * static_cast<int64_t>(m.d_model);
        case Dim::F:
            return m.d_ff;
        case Dim::E:
            return m.n_experts;
        case Dim::FS:
            return m.shared_width();
        case Dim::FE:
            return m.expert_width();
        case Dim::G:
            return m.gate_rows();
    }
    return 0;
}

// Moves `at` past the decimal number at s[at]; whether there was one and a '.' follows it.
bool skip_number(std::string_view s, size_t& at) {
    const size_t from = at;
    while (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at]))) ++at;
    return at > from && at < s.size() && s[at] == '.';
}

}  // namespace

bool has_tensor(const TensorDef& d, const ModelConfig& m, int layer) {
    switch (d.blocks) {
        case Blocks::every:
            return true;
        case Blocks::dense:
            return !m.is_moe_block(layer);
        case Blocks::moe:
            return m.is_moe_block(layer);
        case Blocks::moe_noisy:
            return m.is_moe_block(layer) && m.gate == GateKind::noisy;
        case Blocks::moe_shared:
            return m.is_moe_block(layer) && m.n_shared_experts > 0;
    }
    return false;
}

std::vector<int64_t> tensor_shape(const TensorDef& d, const ModelConfig& m) {
    std::vector<int64_t> s;
    for (int i = 0; i < d.rank; ++i) s.push_back(dim_of(d.dims[i], m));
    return s;
}

std::string tensor_name(const TensorDef& d, int layer, int64_t expert) {
    std::string out;
    for (const char* p = d.pattern; *p; ++p) {
        if (p[0] == '{' && p[1] && p[2] == '}') {
            out += std::to_string(p[1] == 'l' ? layer : expert);
            p += 2;
        } else {
            out += *p;
        }
    }
    return out;
}

std::optional<size_t> tensor_row_of(std::string_view name) {
    // h.<l>.rest -> h.{l}.rest; moe.experts.<e>.rest -> moe.experts.{e}.rest,
    // moe.shared.<i>.rest -> moe.shared.{i}.rest
    std::string pattern;
    size_t at = 0;
    if (name.substr(0, 2) == "h.") {
        at = 2;
        if (!skip_number(name, at)) return std::nullopt;
        pattern = "h.{l}";
        for (const auto& [prefix, with] :
             {std::pair<std::string_view, std::string_view>{".moe.experts.", ".moe.experts.{e}"},
              {".moe.shared.", ".moe.shared.{i}"}}) {
            if (name.substr(at, prefix.size()) != prefix) continue;
            size_t after = at + prefix.size();
            if (!skip_number(name, after)) return std::nullopt;
            pattern += with;
            at = after;
        }
    }
    pattern += name.substr(at);
    for (size_t i = 0; i < kNumTensorDefs; ++i) {
        if (pattern == tensor_def(i).pattern) return i;
    }
    return std::nullopt;
}

std::vector<TensorKind> tensor_kinds(const ModelConfig& m, int ep_size, int ep_rank) {
    const BlockRows b = block_rows();
    const int64_t El = m.n_experts / ep_size, e0 = El * ep_rank;
    std::vector<TensorKind> out;
    for (size_t i = 0; i < b.first && i < kNumTensorDefs; ++i) out.push_back({i, -1, 0, 1});
    for (int l = 0; l < m.n_layer; ++l) {
        for (size_t i = b.first; i <= b.last && i < kNumTensorDefs; ++i) {
            const TensorDef& d = tensor_def(i);
            if (!has_tensor(d, m, l)) continue;
            if (d.scope == Scope::expert) {
                out.push_back({i, l, e0, e0 + El});
            } else if (d.scope == Scope::shared) {
                out.push_back({i, l, 0, m.n_shared_experts});
            } else {
                out.push_back({i, l, 0, 1});
            }
        }
    }
    const size_t after = b.first < kNumTensorDefs ? b.last + 1 : kNumTensorDefs;
    for (size_t i = after; i < kNumTensorDefs; ++i) out.push_back({i, -1, 0, 1});
    return out;
}

}  // namespace bagualu::model

#include "model/param_layout.h"

namespace bagualu::model {

size_t ParamLayout::add(std::string name, std::vector<int64_t> shape, bool decay, bool expert) {
    ParamSpec s;
    s.name  = std::move(name);
    s.shape = std::move(shape);
    s.numel = 1;
    for (int64_t d : s.shape) s.numel *= static_cast<size_t>(d);
    s.offset = total_;
    s.decay  = decay;
    s.expert = expert;
    total_ += (s.numel + 15) / 16 * 16;  // keep every tensor 64-byte aligned
    specs_.push_back(std::move(s));
    return specs_.size() - 1;
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
    for (const auto& s : specs_) {
        if (s.name == name) return &s;
    }
    return nullptr;
}

size_t ParamLayout::num_params() const {
    size_t n = 0;
    for (const auto& s : specs_) n += s.numel;
    return n;
}

}  // namespace bagualu::model

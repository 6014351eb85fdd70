// The layout of all parameters of a model in one flat float array: name, shape and offset of
// every tensor. Gradients and optimizer moments use the same layout, so optimizers, clipping
// and (later) partitioning work on flat ranges.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bagualu::model {

struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    size_t offset = 0;  // in floats, 64-byte aligned
    size_t numel  = 0;
    bool decay    = false;  // AdamW weight decay applies (matrices and embeddings)
    bool expert   = false;  // belongs to one expert of an MoE layer
};

class ParamLayout {
   public:
    // Appends a tensor; returns its index.
    size_t add(std::string name, std::vector<int64_t> shape, bool decay, bool expert = false);
    const std::vector<ParamSpec>& specs() const { return specs_; }
    const ParamSpec& spec(size_t i) const { return specs_[i]; }
    // nullptr when absent.
    const ParamSpec* find(const std::string& name) const;
    size_t total_floats() const { return total_; }
    // Number of real parameters (without alignment padding).
    size_t num_params() const;

   private:
    std::vector<ParamSpec> specs_;
    size_t total_ = 0;
};

}  // namespace bagualu::model

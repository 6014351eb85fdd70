// Text samples from a model: each prompt is encoded, preceded by the document separator
// (the tokenizer's </s>), then continued with Generator + sample_token until </s>,
// max_new_tokens or the end of the context.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "moe/balance_bias.h"

namespace bagualu::train {

std::vector<std::string> generate_samples(const ModelConfig& m, const float* params,
                                          const std::string& tokenizer_path, const SampleSection& s,
                                          const moe::BalanceBiases& biases = {});
// biases: the MoE blocks' balancing biases (model/model_io.h), or none.
void print_samples(const ModelConfig& m, const float* params, const std::string& tokenizer_path,
                   const SampleSection& s, const moe::BalanceBiases& biases = {});

}  // namespace bagualu::train

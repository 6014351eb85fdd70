// Text samples from a model: each prompt is encoded, preceded by the document separator
// (the tokenizer's </s>), then continued with Generator + sample_token until </s>,
// max_new_tokens or the end of the context.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"

namespace bagualu::train {

std::vector<std::string> generate_samples(const ModelConfig& m, const float* params,
                                          const std::string& tokenizer_path,
                                          const SampleSection& s);
void print_samples(const ModelConfig& m, const float* params, const std::string& tokenizer_path,
                   const SampleSection& s);

}  // namespace bagualu::train

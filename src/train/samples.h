// Text samples from a model: each prompt is encoded, preceded by the document separator
// (the tokenizer's </s>, the start token), then continued with Generator + sample_token until
// </s>, max_new_tokens or the end of the context (seq_len tokens, the start token and the
// prompt's included), whichever comes first.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "moe/balance_bias.h"

namespace bagualu::data {
class Tokenizer;
}

namespace bagualu::train {

// InputError unless every prompt the samples of s use (sample i: prompts[i % size], or the empty
// prompt) fits m's context with the start token before it and room for one new token after.
// `where` names the prompts in the message: "--prompt", "<file>: sample.prompts".
void check_prompts_fit(const ModelConfig& m, const data::Tokenizer& tok, const SampleSection& s,
                       const std::string& where);

// Prints s.n_samples texts (prompt + continuation) on stdout, after check_prompts_fit; first,
// once, a note on stderr when a prompt and max_new_tokens need more than the context
// (generation stops at seq_len tokens: the samples are shorter than asked). biases: the MoE
// blocks' balancing biases (model/model_io.h), or none.
void print_samples(const ModelConfig& m, const float* params, const std::string& tokenizer_path,
                   const SampleSection& s, const std::string& where,
                   const moe::BalanceBiases& biases = {});

}  // namespace bagualu::train

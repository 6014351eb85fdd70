#include "train/samples.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "model/generate.h"

namespace bagualu::train {

namespace {

// The tokens each sample starts from: the start token, then its prompt's.
std::vector<std::vector<int32_t>> prompt_ids(const data::Tokenizer& tok, const SampleSection& s) {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < s.n_samples; ++i) {
        const std::string prompt = s.prompts.empty()
                                       ? std::string()
                                       : s.prompts[static_cast<size_t>(i) % s.prompts.size()];
        std::vector<int32_t> ids = {tok.eos_id()};
        for (int32_t t : tok.encode(prompt)) ids.push_back(t);
        out.push_back(std::move(ids));
    }
    return out;
}

std::vector<std::string> generate(const ModelConfig& m, const float* params,
                                  const data::Tokenizer& tok, const SampleSection& s,
                                  const std::vector<std::vector<int32_t>>& prompts,
                                  const moe::BalanceBiases& biases) {
    model::Generator gen(m, params, biases);
    Rng rng(s.seed, 0xA11CE);
    const model::SampleOptions opt{s.temperature, s.top_k};
    std::vector<std::string> out;
    for (const std::vector<int32_t>& ids : prompts) {
        gen.reset();
        const float* logits = nullptr;
        for (int32_t t : ids) logits = gen.step(t);
        std::vector<int32_t> text(ids.begin() + 1, ids.end());
        // the context holds seq_len tokens: the prompt's (checked to leave at least one) and
        // the new ones
        const int room = std::min(s.max_new_tokens, m.seq_len - static_cast<int>(ids.size()));
        for (int n = 0; n < room; ++n) {
            const int32_t next = model::sample_token(logits, m.vocab_size, opt, rng);
            if (next == tok.eos_id()) break;
            text.push_back(next);
            if (n + 1 < room) logits = gen.step(next);
        }
        out.push_back(tok.decode(text));
    }
    return out;
}

void check_fit(const ModelConfig& m, const SampleSection& s,
               const std::vector<std::vector<int32_t>>& prompts, const std::string& where) {
    for (size_t i = 0; i < prompts.size() && i < std::max<size_t>(s.prompts.size(), 1); ++i) {
        const size_t tokens = prompts[i].size() - 1;  // without the start token
        if (tokens + 2 > static_cast<size_t>(m.seq_len)) {
            input_error(
                "{}: prompt {} is {} tokens; with the start token and one new token it needs {}, "
                "more than the model's seq_len = {} (at most {} prompt tokens fit)",
                where, i + 1, tokens, tokens + 2, m.seq_len, std::max(m.seq_len - 2, 0));
        }
    }
}

}  // namespace

void check_prompts_fit(const ModelConfig& m, const data::Tokenizer& tok, const SampleSection& s,
                       const std::string& where) {
    check_fit(m, s, prompt_ids(tok, s), where);
}

void print_samples(const ModelConfig& m, const float* params, const std::string& tokenizer_path,
                   const SampleSection& s, const std::string& where,
                   const moe::BalanceBiases& biases) {
    const data::Tokenizer tok = data::Tokenizer::load(tokenizer_path);
    const auto prompts        = prompt_ids(tok, s);
    check_fit(m, s, prompts, where);
    // A sample cut short by the context looks like a fault of the model: say why, once.
    size_t longest = 0;  // index of the longest prompt
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (prompts[i].size() > prompts[longest].size()) longest = i;
    }
    if (!prompts.empty() && prompts[longest].size() + static_cast<size_t>(s.max_new_tokens) >
                                static_cast<size_t>(m.seq_len)) {
        log::note(
            "generation stops at the model's seq_len = {} tokens: the start token, prompt {} "
            "({} tokens) and {} new tokens would need {}",
            m.seq_len, longest % std::max<size_t>(s.prompts.size(), 1) + 1,
            prompts[longest].size() - 1, s.max_new_tokens,
            prompts[longest].size() + static_cast<size_t>(s.max_new_tokens));
    }
    const std::vector<std::string> samples = generate(m, params, tok, s, prompts, biases);
    for (size_t i = 0; i < samples.size(); ++i) {
        fmt::print("--- sample {} ---\n{}\n", i + 1, samples[i]);
    }
    std::fflush(stdout);
}

}  // namespace bagualu::train

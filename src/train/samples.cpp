#include "train/samples.h"

#include <fmt/format.h>

#include "core/rng.h"
#include "data/tokenizer.h"
#include "model/generate.h"

namespace bagualu::train {

std::vector<std::string> generate_samples(const ModelConfig& m, const float* params,
                                          const std::string& tokenizer_path, const SampleSection& s,
                                          const moe::BalanceBiases& biases) {
    const data::Tokenizer tok = data::Tokenizer::load(tokenizer_path);
    model::Generator gen(m, params, biases);
    Rng rng(s.seed, 0xA11CE);
    const model::SampleOptions opt{s.temperature, s.top_k};
    std::vector<std::string> out;
    for (int i = 0; i < s.n_samples; ++i) {
        const std::string prompt = s.prompts.empty()
                                       ? std::string()
                                       : s.prompts[static_cast<size_t>(i) % s.prompts.size()];
        std::vector<int32_t> ids = {tok.eos_id()};
        for (int32_t t : tok.encode(prompt)) ids.push_back(t);
        if (static_cast<int>(ids.size()) > m.seq_len) ids.resize(static_cast<size_t>(m.seq_len));
        gen.reset();
        const float* logits = nullptr;
        for (int32_t t : ids) logits = gen.step(t);
        std::vector<int32_t> text(ids.begin() + 1, ids.end());
        for (int n = 0; n < s.max_new_tokens && gen.position() < m.seq_len; ++n) {
            const int32_t next = model::sample_token(logits, m.vocab_size, opt, rng);
            if (next == tok.eos_id()) break;
            text.push_back(next);
            if (gen.position() == m.seq_len) break;
            logits = gen.step(next);
        }
        out.push_back(tok.decode(text));
    }
    return out;
}

void print_samples(const ModelConfig& m, const float* params, const std::string& tokenizer_path,
                   const SampleSection& s, const moe::BalanceBiases& biases) {
    const std::vector<std::string> samples = generate_samples(m, params, tokenizer_path, s, biases);
    for (size_t i = 0; i < samples.size(); ++i) {
        fmt::print("--- sample {} ---\n{}\n", i + 1, samples[i]);
    }
    std::fflush(stdout);
}

}  // namespace bagualu::train

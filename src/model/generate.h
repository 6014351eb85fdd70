// Autoregressive inference with a key/value cache: one token at a time, each step costs
// O(position) attention instead of re-running the whole prefix. Computes the same logits as
// GPT::forward on the prefix (tests check this). Single sequence, float32.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace bagualu::model {

class Generator {
   public:
    // params: a flat array in make_layout(cfg) order; must outlive the generator. biases: the
    // MoE blocks' balancing biases (model_io.h), added to the gate logits for the choice only.
    Generator(const ModelConfig& cfg, const float* params, moe::BalanceBiases biases = {});
    // Feeds the token at position pos (= number of tokens fed before); returns logits (V).
    const float* step(int32_t token);
    int position() const { return pos_; }
    void reset() { pos_ = 0; }

   private:
    ModelConfig cfg_;
    ParamLayout layout_;
    ModelTensors<const float> w_;
    Buffer<float> kcache_, vcache_;  // (L, seq_len, C) each
    Buffer<float> x_, ln_, qkv_, atty_, tmp_, h_, h2_, logits_, scores_;
    Buffer<float> gate_logits_;
    Buffer<float> gate_keys_;  // model.product_keys: the token's key scores
    std::vector<int32_t> order_;
    moe::BalanceBiases biases_;   // [MoE blocks][E] or empty
    std::vector<float> choice_;   // (E) gate logits + bias
    std::vector<float> limited_;  // (E) the choice kept to the token's best groups
    std::vector<float> softmax_;  // (E) switch: the full softmax
    std::vector<float> probs_;    // (K) the chosen experts' weights
    int pos_ = 0;
};

struct SampleOptions {
    double temperature = 0.8;  // 0 = greedy
    int top_k          = 40;   // 0 = whole vocabulary
};
// Draws a token from logits (V).
int32_t sample_token(const float* logits, int V, const SampleOptions& opt, Rng& rng);

}  // namespace bagualu::model

// The token data of a run: train and val splits plus the checks that they fit the model —
// every token id below model.vocab_size, the tokenizer's vocabulary equal to the model's, and
// each split long enough for one window of seq_len + 1 tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace bagualu::data {

struct Dataset {
    std::vector<int32_t> train, val;
    double               val_unigram_entropy = -1;  // from meta.json beside val; < 0 if absent
    bool                 has_tokenizer       = false;
};

// Throws InputError naming the file and what is expected.
Dataset load_dataset(const TrainConfig& cfg, bool need_train = true);

// Checks that a SentencePiece model at `path` has `vocab_size` pieces; throws InputError.
void check_tokenizer_vocab(const std::string& path, int vocab_size);

}  // namespace bagualu::data

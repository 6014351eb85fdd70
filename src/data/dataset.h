// What a run reads besides the train split (which the data loader, loader.h, reads on the ranks
// that read it): the val split, opened (token_shards.h), and the checks that the data fits the
// model — every token id below model.vocab_size, the tokenizer's vocabulary equal to the
// model's, and each split long enough for one window of seq_len + 1 tokens.
#pragma once
#include <string>

#include "config/config.h"
#include "data/token_shards.h"

namespace bagualu::data {

struct Dataset {
    TokenShards val;
    // of the val split, counted as its ids were checked, else from meta.json beside val;
    // < 0 where neither (a split checked at its head only, or by another rank, and no meta.json)
    double val_unigram_entropy = -1;
    bool has_tokenizer         = false;
};

// Throws InputError naming the file and what is expected. check_ids = false: the val split's
// token ids are left to another rank (token_shards.h; every window is checked as it is read).
Dataset load_dataset(const TrainConfig& cfg, bool check_ids = true);

// Checks that a SentencePiece model at `path` has `vocab_size` pieces; throws InputError.
void check_tokenizer_vocab(const std::string& path, int vocab_size);

}  // namespace bagualu::data

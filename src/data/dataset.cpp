#include "data/dataset.h"

#include <filesystem>

#include "core/error.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace bagualu::data {

void check_tokenizer_vocab(const std::string& path, int vocab_size) {
    const Tokenizer tok = Tokenizer::load(path);
    if (tok.vocab_size() != vocab_size) {
        input_error("{}: tokenizer has {} pieces but model.vocab_size = {} (they must agree)", path,
                    tok.vocab_size(), vocab_size);
    }
}

static void check_length(const std::vector<int32_t>& tokens, const std::string& path, int T) {
    if (static_cast<int64_t>(tokens.size()) < T + 1) {
        input_error("{}: {} tokens, fewer than model.seq_len + 1 = {} (one training window)", path,
                    tokens.size(), T + 1);
    }
}

Dataset load_dataset(const TrainConfig& cfg, bool need_train) {
    const int V = cfg.model.vocab_size, T = cfg.model.seq_len;
    Dataset   d;
    if (!cfg.data.tokenizer.empty() && std::filesystem::exists(cfg.data.tokenizer)) {
        check_tokenizer_vocab(cfg.data.tokenizer, V);
        d.has_tokenizer = true;
    }
    if (need_train) {
        d.train = read_token_file(cfg.data.train, V).tokens;
        check_length(d.train, cfg.data.train, T);
    }
    d.val = read_token_file(cfg.data.val, V).tokens;
    check_length(d.val, cfg.data.val, T);
    if (auto h = read_val_unigram_entropy(cfg.data.val)) d.val_unigram_entropy = *h;
    return d;
}

}  // namespace bagualu::data

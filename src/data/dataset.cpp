#include "data/dataset.h"

#include <filesystem>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace bagualu::data {

void check_tokenizer_vocab(const std::string& path, int vocab_size) {
    const Tokenizer tok = Tokenizer::load(path);
    if (tok.vocab_size() != vocab_size) {
        input_error("{}: tokenizer has {} pieces but model.vocab_size = {} (they must agree)", path,
                    tok.vocab_size(), vocab_size);
    }
}

Dataset load_dataset(const TrainConfig& cfg, bool check_ids) {
    const int V = cfg.model.vocab_size, T = cfg.model.seq_len;
    Dataset d;
    if (!cfg.data.tokenizer.empty() && std::filesystem::exists(cfg.data.tokenizer)) {
        if (!std::filesystem::is_regular_file(cfg.data.tokenizer)) {  // a FIFO would block
            input_error("data.tokenizer = \"{}\": not a regular file", cfg.data.tokenizer);
        }
        check_tokenizer_vocab(cfg.data.tokenizer, V);
        d.has_tokenizer = true;
    }
    // the split's unigram entropy from the ids the check reads (any val pattern: the parts of a
    // corpus prepared apart, each with its own meta.json), else from prepare's meta.json
    std::vector<int64_t> counts;
    d.val = TokenShards::open(cfg.data.val, "data.val", V, T, check_ids, &counts);
    if (!counts.empty()) {
        d.val_unigram_entropy = unigram_entropy_of_counts(counts);
    } else if (auto h = read_val_unigram_entropy(cfg.data.val)) {
        d.val_unigram_entropy = *h;
    }
    return d;
}

}  // namespace bagualu::data

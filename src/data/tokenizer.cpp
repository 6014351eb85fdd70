// sentencepiece wrapper and trainer settings (see tokenizer.h). Entries reach the trainer
// through a SentenceIterator rather than a text file, so newlines inside an entry stay part of
// it. sentencepiece logging is silenced (minloglevel 2); its errors become InputErrors.
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <type_traits>
#include <unordered_map>

#include "core/error.h"
#include "data/file_io.h"

namespace bagualu::data {

static_assert(std::is_same_v<int, int32_t>, "sentencepiece ids are int");

namespace {

// Feeds entries to the trainer as whole sentences, so '\n' inside an entry stays a character.
class EntryIterator : public sentencepiece::SentenceIterator {
   public:
    explicit EntryIterator(std::span<const std::string> entries) : entries_(entries) {}
    bool done() const override { return i_ >= entries_.size(); }
    void Next() override { ++i_; }
    const std::string& value() const override { return entries_[i_]; }
    sentencepiece::util::Status status() const override { return {}; }

   private:
    std::span<const std::string> entries_;
    size_t i_ = 0;
};

}  // namespace

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept            = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer()                               = default;

Tokenizer Tokenizer::load(const std::string& model_path) {
    if (!std::filesystem::is_regular_file(model_path)) {
        input_error("{}: no such tokenizer model file", model_path);
    }
    return from_model_bytes(read_file_bytes(model_path, "tokenizer model"), model_path);
}

Tokenizer Tokenizer::from_model_bytes(std::string_view bytes, const std::string& name) {
    Tokenizer t;
    t.path_                                  = name;
    const sentencepiece::util::Status status = t.sp_->LoadFromSerializedProto(bytes);
    if (!status.ok()) {
        input_error("{}: not a valid sentencepiece model: {}", name, status.ToString());
    }
    return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    const sentencepiece::util::Status status = sp_->Encode(text, &ids);
    BGL_CHECK(status.ok(), "{}: encode failed: {}", path_, status.ToString());
    return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    const int n = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n) {
            input_error("{}: token {} at position {} is outside the tokenizer vocab [0, {})", path_,
                        ids[i], i, n);
        }
    }
    std::string text;
    const sentencepiece::util::Status status =
        sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    BGL_CHECK(status.ok(), "{}: decode failed: {}", path_, status.ToString());
    return text;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }

void validate_vocab_size(int vocab_size) {
    if (vocab_size < kMinVocabSize) {
        input_error(
            "vocab_size {} is too small: byte fallback needs 256 byte pieces and 3 special "
            "ids, and at least 64 learned pieces (minimum {})",
            vocab_size, kMinVocabSize);
    }
}

std::string train_tokenizer_model(std::span<const std::string> entries, int vocab_size,
                                  uint64_t seed) {
    validate_vocab_size(vocab_size);
    if (entries.empty()) input_error("tokenizer training: no text entries to train on");
    size_t longest = 0;
    for (const std::string& e : entries) longest = std::max(longest, e.size());

    const std::unordered_map<std::string, std::string> args = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(vocab_size)},
        {"byte_fallback", "true"},
        {"character_coverage", "0.9995"},
        // Keep the text exactly: no NFKC, no whitespace collapsing, no dummy leading space.
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"add_dummy_prefix", "false"},
        {"allow_whitespace_only_pieces", "true"},
        {"split_digits", "true"},
        // Every entry is one sentence, however long (the default skips those over 4192 bytes).
        {"max_sentence_length", std::to_string(std::max<size_t>(longest, 4192))},
        // Determinism: one thread, all sentences, no shuffling.
        {"num_threads", "1"},
        {"input_sentence_size", "0"},
        {"shuffle_input_sentence", "false"},
        {"minloglevel", "2"},
    };
    sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(seed ^ (seed >> 32)));
    EntryIterator it(entries);
    std::string model;
    const sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (!status.ok()) {
        input_error("tokenizer training failed (vocab_size {}, {} entries): {}", vocab_size,
                    entries.size(), status.ToString());
    }
    return model;
}

void train_tokenizer(const std::vector<std::string>& entries, const std::string& model_prefix,
                     int vocab_size, uint64_t seed) {
    write_file_atomic(model_prefix + ".model", train_tokenizer_model(entries, vocab_size, seed));
}

}  // namespace bagualu::data

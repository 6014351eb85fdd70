// Byte-level BPE tokenizer: a thin wrapper over sentencepiece, plus the trainer settings that
// make decode(encode(x)) == x for any UTF-8 text (no normalization, whitespace and newlines
// kept, unseen characters falling back to byte pieces <0x00>..<0xFF>).
// Ids: unk 0, bos 1, eos 2 (sentencepiece defaults). Does not add bos/eos by itself.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace bagualu::data {

// Smallest vocab train_tokenizer accepts: 256 byte pieces, 3 special ids, 64 learned pieces.
inline constexpr int kMinVocabSize = 256 + 3 + 64;

// InputError unless kMinVocabSize <= vocab_size.
void validate_vocab_size(int vocab_size);

class Tokenizer {
   public:
    // Loads a sentencepiece .model file; InputError naming the file if missing or invalid.
    static Tokenizer load(const std::string& model_path);
    // From a serialized model (train_tokenizer_model's result); `name` stands for it in errors.
    static Tokenizer from_model_bytes(std::string_view bytes, const std::string& name);

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    std::vector<int32_t> encode(std::string_view text) const;
    // Control ids (bos, eos) decode to nothing. An id outside [0, vocab_size) is an InputError.
    std::string decode(std::span<const int32_t> ids) const;

    int vocab_size() const;
    int eos_id() const;
    int bos_id() const;

   private:
    Tokenizer();
    std::string path_;
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// Trains a BPE model on `entries` (each one document, newlines allowed) and returns the
// serialized sentencepiece model. Output depends only on the arguments: one thread, no sentence
// sampling, no paths embedded; `seed` seeds sentencepiece's generator.
std::string train_tokenizer_model(std::span<const std::string> entries, int vocab_size,
                                  uint64_t seed);

// train_tokenizer_model, written to `model_prefix + ".model"` (no .vocab file: pieces may hold
// newlines, which that format cannot represent).
void train_tokenizer(const std::vector<std::string>& entries, const std::string& model_prefix,
                     int vocab_size, uint64_t seed);

}  // namespace bagualu::data

// Two small token shards (train.bin, val.bin) written directly, without a tokenizer: 2000
// tokens with ids below 97 in a vocabulary of 128, for tests that run `bagualu train` on them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "run_command.h"

namespace bagualu::testing {

inline void write_small_shards(const TempDir& dir) {
    std::vector<int32_t> tokens(2000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 97);
    data::write_token_file(dir / "train.bin", tokens, 128);
    data::write_token_file(dir / "val.bin", tokens, 128);
}

}  // namespace bagualu::testing

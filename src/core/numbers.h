// Numbers from text a user wrote, read whole and exactly: a value out of range or with anything
// around it is refused (std::nullopt), never saturated or wrapped.
#pragma once
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bagualu {

// Decimal digits for a value in [0, 2^64-1]: no sign, no space, no exponent. (std::from_chars
// takes no '-' for an unsigned type, where strtoull reads "-1" as 2^64-1.)
inline std::optional<uint64_t> parse_uint64(std::string_view text) {
    uint64_t v           = 0;
    const char* end      = text.data() + text.size();
    const auto [at, err] = std::from_chars(text.data(), end, v);
    if (text.empty() || err != std::errc() || at != end) return std::nullopt;
    return v;
}

}  // namespace bagualu

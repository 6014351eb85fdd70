// Numbers from text a user wrote, read whole and exactly: a value out of range or with anything
// around it is refused (std::nullopt), never saturated or wrapped; and lists of numbers as text.
#pragma once
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// Ascending numbers with their runs as ranges, joined by sep: {1, 2, 3, 5} -> "1-3" sep "5".
inline std::string ranges_text(const std::vector<int>& sorted, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < sorted.size();) {
        size_t j = i;
        while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
        if (!out.empty()) out += sep;
        out += std::to_string(sorted[i]);
        if (j > i) out += '-' + std::to_string(sorted[j]);
        i = j + 1;
    }
    return out;
}

}  // namespace bagualu

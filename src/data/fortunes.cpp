// fortune(6) corpus reader (see fortunes.h). Works on bytes: ANSI stripping, line splitting
// and trimming look only at ASCII, so multi-byte UTF-8 passes through untouched. The UTF-8
// check follows RFC 3629 (no overlong forms, surrogates or code points past U+10FFFF).
#include "data/fortunes.h"

#include <algorithm>
#include <cstdint>
#include <span>

namespace bagualu::data {

namespace {

constexpr char kEsc = '\x1b';

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_blank(std::string_view line) { return std::all_of(line.begin(), line.end(), is_space); }

// A separator line is `%`, allowing trailing whitespace (e.g. a CRLF file's '\r').
bool is_separator(std::string_view line) {
    return !line.empty() && line[0] == '%' && is_blank(line.substr(1));
}

std::vector<std::string_view> split_lines(std::string_view text) {
    std::vector<std::string_view> lines;
    size_t start = 0;
    while (start < text.size()) {
        const size_t nl = text.find('\n', start);
        if (nl == std::string_view::npos) {
            lines.push_back(text.substr(start));
            break;
        }
        lines.push_back(text.substr(start, nl - start));
        start = nl + 1;
    }
    return lines;
}

// Joins lines with '\n', drops leading blank lines and trailing whitespace; "" if nothing left.
std::string make_entry(std::span<const std::string_view> lines) {
    size_t first = 0;
    while (first < lines.size() && is_blank(lines[first])) ++first;
    std::string entry;
    for (size_t i = first; i < lines.size(); ++i) {
        if (i > first) entry += '\n';
        entry.append(lines[i]);
    }
    while (!entry.empty() && is_space(entry.back())) entry.pop_back();
    return entry;
}

}  // namespace

std::string strip_ansi_escapes(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
        if (text[i] != kEsc) {
            out += text[i++];
            continue;
        }
        ++i;  // ESC
        if (i < text.size() && text[i] == '[') {
            // CSI: parameter bytes 0x30-0x3F, intermediate bytes 0x20-0x2F, final byte 0x40-0x7E.
            // A malformed sequence ends at the first byte outside those ranges, which is kept.
            ++i;
            while (i < text.size() && text[i] >= 0x20 && text[i] <= 0x3F) ++i;
            if (i < text.size() && text[i] >= 0x40 && text[i] <= 0x7E) ++i;
        }
        // A lone ESC (not followed by '[') is dropped by itself.
    }
    return out;
}

bool is_utf8_text(std::string_view bytes) {
    size_t i = 0;
    while (i < bytes.size()) {
        const auto c = static_cast<unsigned char>(bytes[i]);
        if (c == 0) return false;
        if (c < 0x80) {
            ++i;
            continue;
        }
        int len       = 0;
        uint32_t code = 0;
        if ((c & 0xE0) == 0xC0) {
            len  = 2;
            code = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len  = 3;
            code = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len  = 4;
            code = c & 0x07;
        } else {
            return false;
        }
        if (i + static_cast<size_t>(len) > bytes.size()) return false;
        for (int k = 1; k < len; ++k) {
            const auto cc = static_cast<unsigned char>(bytes[i + static_cast<size_t>(k)]);
            if ((cc & 0xC0) != 0x80) return false;
            code = (code << 6) | (cc & 0x3F);
        }
        const uint32_t min_code[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (code < min_code[len]) return false;              // overlong
        if (code > 0x10FFFF) return false;                   // beyond Unicode
        if (code >= 0xD800 && code <= 0xDFFF) return false;  // surrogate
        i += static_cast<size_t>(len);
    }
    return true;
}

std::vector<std::string> split_fortune_text(std::string_view text) {
    const std::vector<std::string_view> lines = split_lines(text);
    const bool has_separator = std::any_of(lines.begin(), lines.end(), is_separator);
    // Fortune files split on `%` lines; plain text splits on blank lines.
    auto is_break = has_separator ? is_separator : is_blank;

    std::vector<std::string> entries;
    size_t start = 0;
    for (size_t i = 0; i <= lines.size(); ++i) {
        if (i < lines.size() && !is_break(lines[i])) continue;
        std::string e = make_entry(std::span(lines).subspan(start, i - start));
        if (!e.empty()) entries.push_back(std::move(e));
        start = i + 1;
    }
    return entries;
}

}  // namespace bagualu::data

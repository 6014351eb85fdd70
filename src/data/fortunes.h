// Reads text entries from fortune(6) files: entries separated by lines holding a single `%`.
// A file with no `%` line is read as plain text, one entry per blank-line-separated paragraph.
// Cleaning: ANSI colour escapes (ESC [ ... final byte) are removed, leading blank lines and
// trailing whitespace of each entry are trimmed, empty entries are dropped; everything else
// (indentation, runs of spaces, inner newlines, control bytes such as backspace) is kept.
// Does not tokenize or deduplicate. Files and folders are read by corpus.h.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace bagualu::data {

std::string strip_ansi_escapes(std::string_view text);
bool is_utf8_text(std::string_view bytes);
std::vector<std::string> split_fortune_text(std::string_view text);

}  // namespace bagualu::data

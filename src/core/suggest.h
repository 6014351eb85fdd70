// "Did you mean" for names a user typed (config keys, section names): the candidate nearest by
// edit distance (adjacent transpositions count as one edit), where it is near enough to be the
// likely intent.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace bagualu {

// Edits (insertions, deletions, substitutions, swaps of adjacent characters) from a to b.
inline size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t sub = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j]          = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + sub});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    }
    return d[a.size()][b.size()];
}

// The candidate nearest to word, if it is at most a third of word's length away (at least one
// edit): a typo, not another name; "" when none is. The first of equally near ones.
template <typename Range>
std::string nearest_name(std::string_view word, const Range& candidates) {
    const size_t limit = std::max<size_t>(1, word.size() / 3);
    std::string best;
    size_t best_d = limit + 1;
    for (const auto& c : candidates) {
        const std::string_view cv(c);
        // at least the difference of the lengths apart: no table for a name too long or short
        const size_t gap =
            word.size() > cv.size() ? word.size() - cv.size() : cv.size() - word.size();
        if (gap >= best_d) continue;
        const size_t d = edit_distance(word, cv);
        if (d < best_d) {
            best_d = d;
            best   = std::string(c);
        }
    }
    return best;
}

// What an error message adds after a name a user typed: " (did you mean NEAR?)" with the
// nearest candidate, or "" when none is near. kDidYouMean starts it, for readers of messages.
inline constexpr std::string_view kDidYouMean = " (did you mean ";
template <typename Range>
std::string did_you_mean(std::string_view word, const Range& candidates) {
    const std::string near = nearest_name(word, candidates);
    return near.empty() ? std::string() : std::string(kDidYouMean) + near + "?)";
}

}  // namespace bagualu

// Checks of numeric command-line options whose messages say what is expected. CLI11's own
// (PositiveNumber, NonNegativeNumber, Range) print their bounds as doubles of 300 digits, say
// "0 to max" where 0 is refused, and let NaN through a Range.
#pragma once
#include <CLI/CLI.hpp>
#include <cfloat>
#include <cmath>
#include <string>

namespace bagualu::cli {

// A number in [lo, hi] (NaN is not), described as `what` in the error.
inline CLI::Validator number_in(double lo, double hi, const std::string& what) {
    return CLI::Validator(
        [lo, hi, what](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v) || !(v >= lo && v <= hi))
                return "expected " + what + ", got " + text;
            return {};
        },
        "");
}

inline CLI::Validator positive() {
    return number_in(std::nextafter(0.0, 1.0), DBL_MAX, "a positive number");
}
inline CLI::Validator non_negative() { return number_in(0.0, DBL_MAX, "a number >= 0"); }

}  // namespace bagualu::cli

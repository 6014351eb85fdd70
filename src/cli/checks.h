// Checks of numeric command-line options whose messages say what is expected. CLI11's own
// (PositiveNumber, NonNegativeNumber, Range) print their bounds as doubles of 300 digits, say
// "0 to max" where 0 is refused, and let NaN through a Range.
#pragma once
#include <CLI/CLI.hpp>
#include <cfloat>
#include <cmath>
#include <string>

#include "core/numbers.h"

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

// An integer in [0, 2^64-1] (a seed), described as `what` in the error. CLI11 reads an int64
// option of 2^63 or more as its largest value: such seeds all gave the same samples.
inline CLI::Validator uint64_number(const std::string& what) {
    return CLI::Validator(
        [what](std::string& text) -> std::string {
            if (!parse_uint64(text))
                return "expected " + what + ", an integer from 0 to 18446744073709551615, got " +
                       text;
            return {};
        },
        "");
}

inline CLI::Validator positive() {
    return number_in(std::nextafter(0.0, 1.0), DBL_MAX, "a positive number");
}
inline CLI::Validator non_negative() { return number_in(0.0, DBL_MAX, "a number >= 0"); }

}  // namespace bagualu::cli

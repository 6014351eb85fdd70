// Reading a TOML file with the project's one-line errors: a missing file or a syntax error
// becomes an InputError naming the file (and line:column). Shared by run configs and machine
// descriptions; what the keys mean is each caller's business.
#pragma once
#include <toml++/toml.h>

#include <filesystem>
#include <string>

#include "core/error.h"

namespace bagualu {

// what: the kind of file for the not-found message ("config", "machine").
inline toml::table parse_toml_file(const std::string& path, const char* what) {
    if (!std::filesystem::exists(path)) input_error("{}: {} file not found", path, what);
    // a directory would read as an empty table; a FIFO would block
    if (!std::filesystem::is_regular_file(path))
        input_error("{}: not a regular file (expected a {} file)", path, what);
    try {
        return toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        // toml++ says only "not representable in 64 bits" of an integer of 2^63 or more; the
        // only keys of a run config that take one are its seeds
        const bool too_big = std::string_view(what) == "config" &&
                             e.description().find("not representable") != std::string_view::npos;
        input_error("{}:{}:{}: invalid TOML: {}{}", path, e.source().begin.line,
                    e.source().begin.column, e.description(),
                    too_big ? " (TOML integers are signed 64-bit: a seed from "
                              "9223372036854775808 to 18446744073709551615 is written in quotes)"
                            : "");
    }
}

}  // namespace bagualu

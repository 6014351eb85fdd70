// Whole-file reads and atomic writes for the data pipeline. Errors are InputErrors naming the
// path and the OS reason. Writes go to `path + ".tmp"` and are renamed over `path` only after
// a successful close, so a crash never leaves a half-written file at `path`.
// No parsing or format knowledge lives here.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace bagualu::data {

// Opens the regular file at `path` for reading ("rb"); InputError naming it and `what` it should
// hold when it is missing, a directory, not a regular file (a FIFO or device would block or
// never end) or cannot be opened. The caller closes it.
std::FILE* open_regular_file(const std::string& path, std::string_view what);

// Reads the whole regular file at `path`. `what` names the expected content in errors
// ("token file", "fortune file").
std::string read_file_bytes(const std::string& path, std::string_view what);

// Writes `bytes` to `path` via `path + ".tmp"` and rename. Does not create parent folders.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Creates the parent folder of `path` (and its parents) if missing.
void create_parent_dirs(const std::string& path);

}  // namespace bagualu::data

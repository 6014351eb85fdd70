// A scratch directory for fuzz targets that must hand their input to a reader as a file:
// created once (mkdtemp under the system temp dir) and removed when the fuzzer exits.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace bagualu::fuzz {

inline std::string& scratch_dir_path() {
    static std::string dir;
    return dir;
}

// Creates the directory (prefix: its name under the temp dir) and returns its path.
inline const std::string& make_scratch_dir(const char* prefix) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mkdtemp");
        std::abort();
    }
    scratch_dir_path() = tmpl;
    std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(scratch_dir_path(), ec);
    });
    return scratch_dir_path();
}

}  // namespace bagualu::fuzz

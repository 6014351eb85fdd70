// A fresh directory for a benchmark's files, removed with everything in it when the object dies
// (on every exit, a one-line error's included).
#pragma once
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"

namespace bagualu::bench {

class ScratchDir {
   public:
    // Under parent ("": the system's temp directory), named prefix + six random characters.
    // what: how a one-line error names the parent, e.g. "io bench: --dir".
    ScratchDir(const std::string& parent, std::string_view prefix, std::string_view what) {
        namespace fs = std::filesystem;
        std::error_code ec;
        const fs::path base = parent.empty() ? fs::temp_directory_path(ec) : fs::path(parent);
        if (ec || !fs::is_directory(base, ec))
            input_error("{} {}: not a directory", what, base.string());
        std::string tmpl = (base / (std::string(prefix) + "XXXXXX")).string();
        if (::mkdtemp(tmpl.data()) == nullptr)
            input_error("{} {}: cannot create a directory in it: {}", what, base.string(),
                        std::strerror(errno));
        path_ = tmpl;
    }
    ScratchDir(const ScratchDir&)            = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string& str() const { return path_; }

   private:
    std::string path_;
};

}  // namespace bagualu::bench

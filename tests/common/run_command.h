// Test helpers that run the bagualu binary and temporary directories.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace bagualu::testing {

struct CommandResult {
    int status = -1;     // exit status, or -1 when killed by a signal
    std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
    CommandResult r;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return r;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
    const int st = pclose(p);
    r.status     = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

// `bagualu ARGS`, run from the source directory so configs/ paths resolve.
inline CommandResult bagualu(const std::string& args) {
    return run_command(std::string("cd ") + BGL_SOURCE_DIR + " && " + BGL_BINARY + " " + args);
}

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
   public:
    TempDir() {
        std::random_device rd;
        path_ = std::filesystem::temp_directory_path() /
                ("bagualu-test-" + std::to_string(rd()) + std::to_string(rd()));
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    std::string str() const { return path_.string(); }
    std::string operator/(const std::string& name) const { return (path_ / name).string(); }

   private:
    std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace bagualu::testing

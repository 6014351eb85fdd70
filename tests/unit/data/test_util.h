// Shared by the data tests: a fresh temporary folder per test (removed on destruction), file
// helpers, and a check that a call throws an InputError mentioning given facts.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace bagualu::data::testing {

class TempDir {
   public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = "bgl_";
        if (info != nullptr) name += std::string(info->test_suite_name()) + "_" + info->name();
        path_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&)            = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::string path(std::string_view name) const { return (path_ / name).string(); }
    std::string root() const { return path_.string(); }

    std::string write(std::string_view name, std::string_view bytes) const {
        const std::string p = path(name);
        std::filesystem::create_directories(std::filesystem::path(p).parent_path());
        std::ofstream(p, std::ios::binary)
            .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return p;
    }

   private:
    std::filesystem::path path_;
};

inline std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `f`, expects an InputError whose message contains every string in `parts`.
template <typename F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
    try {
        f();
        ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
        const std::string msg = e.what();
        for (const std::string& p : parts) {
            EXPECT_NE(msg.find(p), std::string::npos)
                << "message '" << msg << "' lacks '" << p << "'";
        }
    }
}

}  // namespace bagualu::data::testing

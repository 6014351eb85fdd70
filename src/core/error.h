// Errors. Two kinds:
//   InputError   bad input from the user (config, data, checkpoint, command line): the CLI prints
//                its one-line message and exits with status 2.
//   BGL_CHECK    an internal invariant; throws InternalError naming file:line and the expression.
// Library code throws; only src/cli/ turns exceptions into exit codes.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace bagualu {

class InputError : public std::runtime_error {
   public:
    explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public std::runtime_error {
   public:
    explicit InternalError(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
    throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

// A JSON parser's message without its exception tag ("[json.exception.parse_error.101] "), for
// an input error that names the file itself.
inline std::string json_error_text(const char* what) {
    const std::string s = what;
    const size_t end    = s.rfind("] ", s.find(' '));
    return s.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? s.substr(end + 2) : s;
}

}  // namespace bagualu

#define BGL_CHECK(cond, ...)                                                                    \
    do {                                                                                        \
        if (!(cond)) [[unlikely]] {                                                             \
            throw ::bagualu::InternalError(fmt::format("{}:{}: check failed: {}: {}", __FILE__, \
                                                       __LINE__, #cond,                         \
                                                       fmt::format(__VA_ARGS__)));              \
        }                                                                                       \
    } while (0)

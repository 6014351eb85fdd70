// Logging to stderr/stdout with an optional rank prefix. Library code does not print; the
// trainer and CLI do, through these helpers.
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace bagualu::log {

// Set once by the communication layer; -1 means "single process, no prefix".
inline int g_rank = -1;

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
    std::string msg = fmt::format(f, std::forward<Args>(args)...);
    if (g_rank >= 0) {
        fmt::print(stdout, "[{}] {}\n", g_rank, msg);
    } else {
        fmt::print(stdout, "{}\n", msg);
    }
    std::fflush(stdout);
}

// Rank-0-only line.
template <typename... Args>
void info0(fmt::format_string<Args...> f, Args&&... args) {
    if (g_rank <= 0) info(f, std::forward<Args>(args)...);
}

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
    std::string msg = fmt::format(f, std::forward<Args>(args)...);
    if (g_rank >= 0) {
        fmt::print(stderr, "[{}] warning: {}\n", g_rank, msg);
    } else {
        fmt::print(stderr, "warning: {}\n", msg);
    }
}

// A line on stderr about how a result is limited, where nothing is wrong with the input.
template <typename... Args>
void note(fmt::format_string<Args...> f, Args&&... args) {
    std::string msg = fmt::format(f, std::forward<Args>(args)...);
    std::fflush(stdout);  // after the lines before it, where both go to one terminal
    if (g_rank >= 0) {
        fmt::print(stderr, "[{}] note: {}\n", g_rank, msg);
    } else {
        fmt::print(stderr, "note: {}\n", msg);
    }
}

}  // namespace bagualu::log

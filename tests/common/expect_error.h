// The CLI's promise on bad input (docs/reliability.md), checked: exit status 2 and one line of
// output that holds every needle.
#pragma once
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "run_command.h"

namespace bagualu::testing {

// r: what `bagualu args` gave.
inline void expect_one_line_error(const CommandResult& r, const std::string& args,
                                  std::initializer_list<std::string> needles = {}) {
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    std::string line = r.output;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    EXPECT_EQ(line.find('\n'), std::string::npos) << args << ": expected one line, got:\n"
                                                  << r.output;
    for (const std::string& n : needles)
        EXPECT_NE(r.output.find(n), std::string::npos) << "'" << n << "' not in: " << r.output;
}

// Runs `bagualu args` and checks it as above.
inline void expect_one_line_error(const std::string& args,
                                  std::initializer_list<std::string> needles) {
    expect_one_line_error(bagualu(args), args, needles);
}

}  // namespace bagualu::testing

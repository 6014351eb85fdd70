// Every command the README shows runs as written. The README's code blocks hold three kinds of
// line: `make` targets (checked to exist with `make -n`), usage lines of `bagualu` with
// placeholders (every option they show must be one the subcommand's --help lists), and concrete
// command lines (`mpirun ... build/bagualu ...`), which run from a scratch directory holding the
// repository's configs, with the schedule cut to two steps and the run directory redirected:
// what is checked is that the command as written starts and trains on the shipped config.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_command.h"

namespace bagualu::testing {
namespace {

namespace fs = std::filesystem;

// The lines of every ``` block of README.md, with trailing `# comments` removed.
std::vector<std::string> readme_code_lines() {
    std::istringstream in(read_file(std::string(BGL_SOURCE_DIR) + "/README.md"));
    std::vector<std::string> out;
    bool code = false;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("```", 0) == 0) {
            code = !code;
            continue;
        }
        if (!code) continue;
        if (const size_t hash = line.find("  #"); hash != std::string::npos) line.resize(hash);
        while (!line.empty() && line.back() == ' ') line.pop_back();
        if (!line.empty()) out.push_back(line);
    }
    return out;
}

std::vector<std::string> lines_starting(const std::string& prefix) {
    std::vector<std::string> r;
    for (const std::string& l : readme_code_lines()) {
        if (l.rfind(prefix, 0) == 0) r.push_back(l);
    }
    return r;
}

TEST(Readme, HasCommandsOfEveryKind) {
    EXPECT_GE(lines_starting("make ").size(), 2u);
    EXPECT_GE(lines_starting("bagualu ").size(), 10u);
    EXPECT_GE(lines_starting("mpirun ").size(), 1u);
}

TEST(Readme, MakeTargetsExist) {
    for (const std::string& line : lines_starting("make ")) {
        const std::string target = line.substr(5, line.find(' ', 5) - 5);
        const CommandResult r =
            run_command(std::string("cd ") + BGL_SOURCE_DIR + " && make -n " + target);
        EXPECT_EQ(r.status, 0) << line << "\n" << r.output;
    }
}

// `bagualu bench train --config FILE [--steps N] ...`: the subcommand is the words before the
// first option or placeholder; every --option shown must appear in its --help.
TEST(Readme, UsageLinesMatchHelp) {
    const std::regex option("--[a-z][a-z0-9-]*");
    for (const std::string& line : lines_starting("bagualu ")) {
        std::istringstream words(line.substr(8));
        std::string sub, w;
        while (words >> w && std::islower(static_cast<unsigned char>(w[0]))) {
            sub += (sub.empty() ? "" : " ") + w;
        }
        ASSERT_FALSE(sub.empty()) << line;
        const CommandResult help = bagualu(sub + " --help");
        ASSERT_EQ(help.status, 0) << sub << " --help\n" << help.output;
        for (std::sregex_iterator it(line.begin(), line.end(), option), end; it != end; ++it) {
            const std::string opt = it->str();
            if (opt == "--set" && help.output.find("--set") == std::string::npos) {
                ADD_FAILURE() << line << ": --set not in help";
            }
            EXPECT_NE(help.output.find(opt), std::string::npos)
                << "README shows `" << opt << "` for `bagualu " << sub
                << "`, its --help does not:\n"
                << help.output;
        }
    }
}

// The concrete command lines run as written from a directory that has the repository's
// configs/ and the fortune corpus prepared (what `make train` does first).
TEST(Readme, CommandLinesRun) {
    TempDir dir;
    fs::create_directory_symlink(fs::path(BGL_SOURCE_DIR) / "configs", dir / "configs");
    fs::create_directories(dir / "build");
    fs::create_symlink(BGL_BINARY, dir / "build/bagualu");
    const std::string cd = "cd " + dir.str() + " && ";
    const CommandResult prep =
        run_command(cd + "build/bagualu prepare --config configs/default.toml");
    ASSERT_EQ(prep.status, 0) << prep.output;
    // The schedule is cut short and the outputs go to the scratch directory.
    const std::string shorter =
        " --set train.steps=2 --set train.eval_batches=1 "
        "--set sample.n_samples=0 --set train.threads=1 --run-dir " +
        (dir / "run") + " --force";
    const std::string mpirun = std::string(BGL_MPIEXEC) +
                               (geteuid() == 0 ? " --allow-run-as-root" : "") + " --oversubscribe";
    for (const std::string& line : lines_starting("mpirun ")) {
        const std::string cmd = cd + "timeout 300 " + mpirun + line.substr(6) + shorter;
        const CommandResult r = run_command(cmd);
        EXPECT_EQ(r.status, 0) << line << "\n" << r.output;
        EXPECT_TRUE(fs::exists(dir / "run/model/model.safetensors")) << line << "\n" << r.output;
    }
}

}  // namespace
}  // namespace bagualu::testing

// `bagualu plan` and `bagualu calibrate`: registered on the CLI app by one object, run when
// selected. plan predicts memory, time and FLOPS of a config on a machine (src/plan);
// calibrate measures the local machine and writes its machine file.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace bagualu::cli {

class PlanCommands {
   public:
    explicit PlanCommands(CLI::App& app);
    bool selected() const { return *plan_ || *calibrate_; }
    // Runs the selected subcommand; calibrate starts the MPI world when under mpirun.
    int run(int* argc, char*** argv);

   private:
    CLI::App* plan_      = nullptr;
    CLI::App* calibrate_ = nullptr;
    std::string config_, machine_, out_;
    std::vector<std::string> overrides_;
    int nodes_ = 1, ranks_per_node_ = 1, top_ = 10;
    double seconds_ = 2, overlap_ = -1, capacity_ = 0;
    bool sweep_ = false, json_ = false;
};

}  // namespace bagualu::cli

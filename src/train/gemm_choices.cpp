// GemmChoiceRecord: the auto GEMM choice table read from and written to the run directory.
#include "train/gemm_choices.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "kernels/gemm/choice.h"
#include "kernels/gemm/dispatch.h"
#include "train/run_dir.h"

namespace bagualu::train {

std::string gemm_choice_path(const std::string& run_dir, int rank) {
    return rank == 0 ? run_dir + "/gemm_choice.json"
                     : fmt::format("{}/gemm_choice.rank{}.json", run_dir, rank);
}

GemmChoiceRecord::GemmChoiceRecord(std::string path, bool active)
    : path_(std::move(path)),
      active_(active && kernels::gemm::active_path() == kernels::gemm::Path::automatic &&
              std::filesystem::is_directory(std::filesystem::path(path_).parent_path())) {}

GemmChoiceRecord::Loaded GemmChoiceRecord::load() {
    if (!active_) return Loaded::inactive;
    if (!std::filesystem::exists(path_)) return Loaded::absent;
    std::ifstream in(path_);
    if (!in) input_error("{}: cannot read", path_);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
        input_error("{}: not JSON: {}", path_, json_error_text(e.what()));
    }
    bool same_machine = false;
    try {
        same_machine = kernels::gemm::choice_table().from_json(j);
    } catch (const InputError& e) {
        input_error("{}: {}", path_, e.what());
    }
    if (!same_machine) return Loaded::foreign;
    saved_ = kernels::gemm::choice_table().size();
    return Loaded::loaded;
}

void GemmChoiceRecord::save_if_grown() {
    if (!active_) return;
    const size_t n = kernels::gemm::choice_table().size();
    if (n <= saved_) return;
    write_run_file(path_, kernels::gemm::choice_table().to_json().dump(1) + "\n");
    saved_ = n;
}

}  // namespace bagualu::train

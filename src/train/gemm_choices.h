// The GEMM choice table of BGL_GEMM=auto (kernels/gemm/choice.h) kept with a run: each rank
// writes its table into the run directory once it has grown (after the first step, and again
// when a later step or an evaluation meets new shapes), and a resumed run loads it before its
// first step, so that it runs every shape on the backend the interrupted run did (auto's choice
// is timed, so it may differ from one process to the next; a fixed choice gives bitwise-equal
// results). Without BGL_GEMM=auto it does nothing.
#pragma once
#include <cstddef>
#include <string>

namespace bagualu::train {

// Rank 0's table is <run_dir>/gemm_choice.json, rank r > 0's <run_dir>/gemm_choice.rank<r>.json.
std::string gemm_choice_path(const std::string& run_dir, int rank);

class GemmChoiceRecord {
   public:
    enum class Loaded { inactive, absent, loaded, foreign };

    GemmChoiceRecord() = default;  // inactive
    // Active when `active`, the process GEMM path is auto and the file's directory exists (a
    // rank on a node without the run directory keeps no table).
    GemmChoiceRecord(std::string path, bool active);

    // Replaces the process table with the file's when it was made on this CPU model, oneDNN
    // version and thread count (loaded), keeps it otherwise (foreign: the caller logs it). A
    // file that is not a choice table throws InputError naming the file and key.
    Loaded load();
    // Writes the process table to the file when it holds more shapes than at the last write.
    void save_if_grown();

    const std::string& path() const { return path_; }
    size_t saved_shapes() const { return saved_; }

   private:
    std::string path_;
    bool active_  = false;
    size_t saved_ = 0;
};

}  // namespace bagualu::train

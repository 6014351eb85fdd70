// Test helpers for the GEMM paths: the paths this CPU supports, and a guard that restores the
// active path when a test that forces one ends.
#pragma once
#include <vector>

#include "kernels/gemm/dispatch.h"

namespace bagualu::kernels::testing {

inline std::vector<gemm::Path> supported_paths() {
    std::vector<gemm::Path> out;
    for (gemm::Path p :
         {gemm::Path::ref, gemm::Path::generic, gemm::Path::avx2, gemm::Path::avx512,
          gemm::Path::amx, gemm::Path::openblas, gemm::Path::onednn, gemm::Path::automatic}) {
        if (gemm::path_supported(p)) out.push_back(p);
    }
    return out;
}

class PathGuard {
   public:
    PathGuard() : saved_(gemm::active_path()) {}
    ~PathGuard() { gemm::set_active_path(saved_); }
    PathGuard(const PathGuard&)            = delete;
    PathGuard& operator=(const PathGuard&) = delete;

   private:
    gemm::Path saved_;
};

}  // namespace bagualu::kernels::testing

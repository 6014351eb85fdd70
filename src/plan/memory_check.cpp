#include "plan/memory_check.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/dispatch.h"
#include "model/precision.h"

namespace bagualu::plan {

namespace {

// "1.61 GiB", or "27.4 MiB" below a GiB.
std::string size_text(double bytes) {
    constexpr double kMiB = 1048576.0, kGiB = 1024 * kMiB;
    return bytes >= kGiB ? fmt::format("{:.2f} GiB", bytes / kGiB)
                         : fmt::format("{:.2f} MiB", bytes / kMiB);
}

}  // namespace

Footprint run_footprint(const TrainConfig& cfg, int ranks, int ranks_per_node, int threads,
                        uint64_t order_bytes) {
    const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(cfg.precision);
    Layout L                            = make_layout(cfg, policy, ranks, ranks_per_node, threads);
    L.caches      = kernels::cache_sizes();  // this machine's kernels, as they will run
    L.gemm_path   = kernels::gemm::active_path();
    L.avx512_bf16 = kernels::cpu_features().avx512_bf16;
    return footprint(cfg, L, order_bytes, 0);
}

void check_memory_fits(const Memory& m, const std::string& where, int ranks_here,
                       const MemoryLeft& left) {
    if (left.bytes == UINT64_MAX) return;  // nothing to hold it against
    const double rank   = m.total();
    const double here   = rank * ranks_here;
    const double budget = static_cast<double>(left.bytes);
    if (here <= budget) return;
    input_error(
        "{}: the run needs about {} per rank (parameters {}, gradients {}, optimizer state {}, "
        "activations and buffers {}, data and checkpoint {}, GEMM packing {}; `bagualu plan` "
        "details it), {} for "
        "the {} rank(s) on this machine, which may allocate {} ({}): expected a smaller "
        "train.micro_batch_size, train.recompute = \"moe\" or \"block\", the ranks spread over "
        "more machines, or train.check_memory = false to start anyway",
        where, size_text(rank), size_text(m.parameters), size_text(m.gradients),
        size_text(m.optimizer), size_text(m.activations + m.comm_buffers),
        size_text(m.data + m.checkpoint), size_text(m.gemm_packing), size_text(here), ranks_here,
        size_text(budget), left.what);
}

std::string check_checkpoint_space(const TrainConfig& cfg, double one, const std::string& dir,
                                   uint64_t free_bytes) {
    if (cfg.checkpoint.every <= 0 || free_bytes == UINT64_MAX) return "";
    const double free = static_cast<double>(free_bytes);
    if (one > free) {
        input_error(
            "checkpoint.dir {}: one checkpoint of this run takes about {} (FP32 parameters, m and "
            "v), its file system has {} free: expected more space, another checkpoint.dir, or "
            "checkpoint.every = 0",
            dir, size_text(one), size_text(free));
    }
    // the checkpoints written: every `every` steps, and one at the end
    const int64_t written =
        cfg.train.steps / cfg.checkpoint.every + (cfg.train.steps % cfg.checkpoint.every ? 1 : 0);
    const int64_t kept =
        cfg.checkpoint.keep > 0 ? std::min(cfg.checkpoint.keep + 1, written) : written;
    if (one * static_cast<double>(kept) <= free) return "";
    return fmt::format(
        "checkpoint.dir {}: {} checkpoint(s) of about {} each may be on disk at once "
        "(checkpoint.keep = {}{}), its file system has {} free: the run will fail to write one "
        "unless space is freed",
        dir, kept, size_text(one), cfg.checkpoint.keep,
        cfg.checkpoint.keep > 0 ? ", and the one being written" : ": all of them", size_text(free));
}

}  // namespace bagualu::plan

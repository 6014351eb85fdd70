// The per-shape backend choice of BGL_GEMM=auto: for each GEMM (dtype, op, M, N, K) either the
// best of our kernels or oneDNN, whichever was faster when first timed in this process (a few
// calls of each on the real operands, into a scratch C), or what a table loaded from JSON says.
// The table is tied to the machine and library it was timed on: cpu_model, the oneDNN version
// and the thread count; a table from elsewhere is not loaded. Saving it with a run and loading
// it on resume makes an auto run reproducible (a fixed choice per shape gives bitwise-equal
// results at a fixed thread count). Thread-safe.
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"

namespace bagualu::kernels::gemm {

struct GemmKey {
    bool bf16 = false;
    Trans ta = Trans::N, tb = Trans::N;
    int m = 0, n = 0, k = 0;
    auto tie() const { return std::tuple(bf16, ta, tb, m, n, k); }
    bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

class ChoiceTable {
   public:
    std::optional<Path> find(const GemmKey& key) const;
    void set(const GemmKey& key, Path p);
    size_t size() const;
    void clear();

    // {"cpu_model", "onednn_version", "threads", "choices": [{"dtype": "f32"|"bf16",
    //  "op": "NT", "m", "n", "k", "backend": "avx512"|"onednn"|...}]}
    nlohmann::json to_json() const;
    // Replaces the table with j's choices and returns true when j was made on this CPU model,
    // oneDNN version and thread count; returns false and keeps the table otherwise. A malformed
    // table or a backend this CPU cannot run throws InputError naming the key and value.
    bool from_json(const nlohmann::json& j);

   private:
    mutable std::mutex mutex_;
    std::map<GemmKey, Path> choices_;
};

// The process-wide table BGL_GEMM=auto fills and reads.
ChoiceTable& choice_table();

}  // namespace bagualu::kernels::gemm

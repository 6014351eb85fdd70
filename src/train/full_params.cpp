#include "train/full_params.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace bagualu::train {

Buffer<float> gather_full_params(const model::GPT& gpt, dist::ParallelContext* par) {
    return gather_full_params(gpt, gpt.params(), par);
}

Buffer<float> gather_full_params(const model::GPT& gpt, const float* params,
                                 dist::ParallelContext* par) {
    const ModelConfig& m          = gpt.config();
    const model::ParamLayout full = model::make_layout(m);
    Buffer<float> out(full.total_floats());
    const int EP = par ? par->ep_size() : 1;
    // every rank's whole local parameter array, gathered within the EP group
    std::vector<float> all(gpt.n_floats() * static_cast<size_t>(EP));
    if (EP > 1) {
        par->ep().allgather(params, sizeof(float) * gpt.n_floats(), all.data());
    } else {
        std::copy(params, params + gpt.n_floats(), all.begin());
    }
    for (int q = 0; q < EP; ++q) {
        const model::ParamLayout local = model::make_layout(m, EP, q);
        BGL_CHECK(local.total_floats() == gpt.n_floats(), "layouts of ranks differ in size");
        const float* src = all.data() + gpt.n_floats() * static_cast<size_t>(q);
        for (const model::ParamSpec& s : local.specs()) {
            if (!s.expert && q > 0) continue;  // dense tensors are the same on every rank
            const model::ParamSpec* d = full.find(s.name);
            BGL_CHECK(d != nullptr, "no {} in the full layout", s.name);
            std::copy(src + s.offset, src + s.offset + s.numel, out.data() + d->offset);
        }
    }
    return out;
}

}  // namespace bagualu::train

#include "dist/paro/grad_sync.h"

#include <cmath>
#include <span>

#include "kernels/ops.h"
#include "optim/grad_clip.h"

namespace bagualu::dist::paro {

std::vector<Segment> make_segments(const model::ParamLayout& layout) {
    std::vector<Segment> segs;
    for (const model::ParamSpec& s : layout.specs()) {
        const size_t end = s.offset + (s.numel + 15) / 16 * 16;
        if (!segs.empty() && segs.back().expert == s.expert && segs.back().end == s.offset) {
            segs.back().end = end;
        } else {
            segs.push_back(Segment{s.offset, end, s.expert});
        }
    }
    return segs;
}

double global_grad_norm(const float* grads, const std::vector<Segment>& segs,
                        dist::ParallelContext* par) {
    double dense = 0, expert = 0;
    for (const Segment& s : segs) {
        (s.expert ? expert : dense) += kernels::sum_squares(grads + s.begin, s.end - s.begin);
    }
    return optim::global_norm(dense, expert, par && par->ep_size() > 1 ? &par->ep() : nullptr);
}

void scale_floats(float* x, float s, size_t n, bool on_helper) {
    if (!on_helper) {
        kernels::scale_inplace(x, s, n);
        return;
    }
    for (size_t i = 0; i < n; ++i) x[i] *= s;
}

std::unique_ptr<dist::Comm> reduction_comm(dist::Comm& c) {
    std::unique_ptr<dist::Comm> d = c.split(0, c.rank());
    d->set_background(true);
    return d;
}

}  // namespace bagualu::dist::paro

// ShardMap: shard sizes, the per-tensor pieces of this rank's shard and the bucket copy lists,
// all computed once at start-up; pack/unpack are plain copies in the step loop.
#include "dist/paro/shard_map.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace bagualu::dist::paro {

namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

ShardGeometry shard_geometry(size_t n, int ranks, size_t bucket_floats) {
    BGL_CHECK(ranks >= 1 && bucket_floats > 0, "shard_geometry: {} ranks, bucket {}", ranks,
              bucket_floats);
    if (n == 0) return {};
    const auto P = static_cast<size_t>(ranks);
    ShardGeometry g;
    g.q  = ceil_div(ceil_div(n, P * ceil_div(n, bucket_floats)), 16) * 16;
    g.nb = ceil_div(n, P * g.q);  // rounding q up may leave the last buckets empty: none
    return g;
}

ShardMap::ShardMap(std::vector<FlatRun> runs, const model::ParamLayout& layout, int ranks, int rank,
                   size_t bucket_floats)
    : runs_(std::move(runs)), ranks_(ranks), rank_(rank) {
    BGL_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
    BGL_CHECK(bucket_floats > 0, "bucket_floats must be > 0");
    // [run i] -> position of its first float in the space
    std::vector<size_t> vstart;
    for (size_t i = 0; i < runs_.size(); ++i) {
        const FlatRun& r = runs_[i];
        BGL_CHECK(r.begin < r.end && r.end <= layout.total_floats(), "bad run [{}, {})", r.begin,
                  r.end);
        BGL_CHECK(i == 0 || runs_[i - 1].end <= r.begin, "runs must ascend and not overlap");
        vstart.push_back(n_);
        n_ += r.end - r.begin;
    }
    copies_.clear();
    if (n_ == 0) return;
    const auto P          = static_cast<size_t>(ranks);
    const ShardGeometry g = shard_geometry(n_, ranks, bucket_floats);
    q_                    = g.q;
    nb_                   = g.nb;
    S_                    = nb_ * q_;
    const size_t Gq       = P * q_;  // floats of the space per bucket

    // ---- pieces: every tensor inside a run, cut to this rank's part of each bucket ----
    const size_t k                             = static_cast<size_t>(rank);
    const std::vector<model::ParamSpec>& specs = layout.specs();
    for (size_t si = 0; si < specs.size(); ++si) {
        const model::ParamSpec& s = specs[si];
        const auto before         = [](size_t off, const FlatRun& r) { return off < r.begin; };
        auto it                   = std::upper_bound(runs_.begin(), runs_.end(), s.offset, before);
        if (it == runs_.begin()) continue;
        const size_t ri = static_cast<size_t>(it - runs_.begin()) - 1;
        if (s.offset >= runs_[ri].end) continue;  // not in this space
        BGL_CHECK(s.offset + s.numel <= runs_[ri].end, "tensor {} crosses a run boundary", s.name);
        if (s.numel == 0) continue;
        const size_t v0 = vstart[ri] + (s.offset - runs_[ri].begin), v1 = v0 + s.numel;
        for (size_t b = v0 / Gq; b <= (v1 - 1) / Gq; ++b) {
            const size_t x0 = b * Gq + k * q_;
            const size_t a = std::max(v0, x0), e = std::min(v1, x0 + q_);
            if (a >= e) continue;
            pieces_.push_back(
                ShardPiece{si, a - v0, s.offset + (a - v0), b * q_ + (a - x0), e - a, s.decay});
        }
    }

    // ---- bucket copies: bucket b is [b*G*q, (b+1)*G*q) of the space, owner r its r-th q ----
    copies_.resize(nb_);
    for (size_t b = 0; b < nb_; ++b) {
        for (size_t r = 0; r < P; ++r) {
            const size_t x0 = b * Gq + r * q_, x1 = std::min(x0 + q_, n_);
            for (size_t i = 0; i < runs_.size() && x0 < x1; ++i) {
                const size_t r0 = vstart[i], r1 = r0 + (runs_[i].end - runs_[i].begin);
                const size_t a = std::max(x0, r0), e = std::min(x1, r1);
                if (a >= e) continue;
                copies_[b].push_back(BucketCopy{r * q_ + (a - x0), runs_[i].begin + (a - r0), e - a,
                                                static_cast<int>(r)});
            }
        }
    }
}

void ShardMap::pack(size_t b, const float* flat, float* buf) const {
    size_t covered = 0;
    for (const BucketCopy& c : copies_[b]) covered += c.len;
    if (covered < bucket_size()) std::memset(buf, 0, bucket_size() * sizeof(float));
    for (const BucketCopy& c : copies_[b]) {
        std::memcpy(buf + c.buf_offset, flat + c.flat_offset, c.len * sizeof(float));
    }
}

void ShardMap::pack_own(size_t b, const float* flat, float* buf) const {
    std::memset(buf + static_cast<size_t>(rank_) * q_, 0, q_ * sizeof(float));
    for (const BucketCopy& c : copies_[b]) {
        if (c.owner != rank_) continue;
        std::memcpy(buf + c.buf_offset, flat + c.flat_offset, c.len * sizeof(float));
    }
}

void ShardMap::unpack(size_t b, const float* buf, float* flat, bool own) const {
    for (const BucketCopy& c : copies_[b]) {
        if ((c.owner == rank_) != own) continue;
        std::memcpy(flat + c.flat_offset, buf + c.buf_offset, c.len * sizeof(float));
    }
}

}  // namespace bagualu::dist::paro

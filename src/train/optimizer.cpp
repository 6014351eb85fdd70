// The replicated AdamW (all-reduce, full m and v on every rank) and ParO (reduce-scatter in
// buckets, AdamW on this rank's shard, all-gather). The gradient scaling of both is that of
// grad_sync.h: dense gradients are the mean over all P ranks, expert gradients the sum over
// their edp group / P, i.e. the edp mean / EP.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <span>
#include <string>

#include "core/error.h"
#include "dist/comm/collectives.h"
#include "kernels/ops.h"
#include "train/grad_sync.h"

namespace bagualu::train {

namespace {

class ReplicatedAdamW final : public Optimizer {
   public:
    ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                    const AdamWHyper& hyper)
        : layout_(layout),
          par_(par),
          hyper_(hyper),
          segs_(make_segments(layout)),
          m_(layout.total_floats()),
          v_(layout.total_floats()),
          maps_(make_space_maps(layout, par, PartitionedAdamW::kDefaultBucketFloats)) {}

    double step(float* params, float* grads, double lr, int64_t step) override {
        reduce_gradients(grads, segs_, par_);
        const double norm = global_grad_norm(grads, segs_, &par_);
        if (hyper_.grad_clip > 0 && norm > hyper_.grad_clip) {
            kernels::scale_inplace(grads, static_cast<float>(hyper_.grad_clip / norm),
                                   layout_.total_floats());
        }
        for (const model::ParamSpec& s : layout_.specs()) {
            kernels::adamw_update(params + s.offset, grads + s.offset, m_.data() + s.offset,
                                  v_.data() + s.offset, s.numel, static_cast<float>(lr),
                                  hyper_.beta1, hyper_.beta2, hyper_.eps,
                                  s.decay ? hyper_.weight_decay : 0.0f, static_cast<int>(step));
        }
        return norm;
    }
    MemoryFootprint footprint() const override {
        const size_t bytes = layout_.total_floats() * sizeof(float);
        return MemoryFootprint{bytes, bytes, 2 * bytes, 0};
    }
    bool partitioned() const override { return false; }
    std::vector<StateSpace> state_spaces() override {
        return {StateSpace{&maps_[0], &par_.world(), m_.data(), v_.data(), true},
                StateSpace{&maps_[1], &par_.edp(), m_.data(), v_.data(), true}};
    }

   private:
    const model::ParamLayout& layout_;
    dist::ParallelContext&    par_;
    AdamWHyper                hyper_;
    std::vector<Segment>      segs_;
    Buffer<float>             m_, v_;  // [layout floats]
    std::vector<ShardMap>     maps_;   // checkpoint pieces only
};

}  // namespace

PartitionedAdamW::PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                   const AdamWHyper& hyper, size_t bucket_floats)
    : par_(par), hyper_(hyper), n_floats_(layout.total_floats()) {
    std::vector<FlatRun> runs[2];  // [dense, expert]
    for (const Segment& s : make_segments(layout)) runs[s.expert].push_back({s.begin, s.end});
    const float inv_ep = 1.0f / static_cast<float>(par.ep_size());
    shards_.push_back(ShardState{ShardMap(std::move(runs[0]), layout, par.size(), par.rank(),
                                          bucket_floats),
                                 {}, {}, 1.0f});
    shards_.push_back(ShardState{ShardMap(std::move(runs[1]), layout, par.edp_size(),
                                          par.edp_rank(), bucket_floats),
                                 {}, {}, inv_ep});
    size_t max_bucket = 0;
    for (ShardState& st : shards_) {
        st.m = Buffer<float>(st.map.shard_size());
        st.v = Buffer<float>(st.map.shard_size());
        if (st.map.ranks() > 1) max_bucket = std::max(max_bucket, st.map.bucket_size());
    }
    bucket_ = Buffer<float>(max_bucket);
}

std::vector<StateSpace> PartitionedAdamW::state_spaces() {
    std::vector<StateSpace> out;
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        out.push_back(StateSpace{&shards_[sp].map, &comm_of(sp), shards_[sp].m.data(),
                                 shards_[sp].v.data(), false});
    }
    return out;
}

std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, dist::ParallelContext& par,
                                      size_t bucket_floats) {
    std::vector<FlatRun> runs[2];  // [dense, expert]
    for (const Segment& s : make_segments(layout)) runs[s.expert].push_back({s.begin, s.end});
    std::vector<ShardMap> maps;
    maps.emplace_back(std::move(runs[0]), layout, par.size(), par.rank(), bucket_floats);
    maps.emplace_back(std::move(runs[1]), layout, par.edp_size(), par.edp_rank(), bucket_floats);
    return maps;
}

dist::Comm& PartitionedAdamW::comm_of(size_t space) {
    return space == 0 ? par_.world() : par_.edp();
}

double PartitionedAdamW::step(float* params, float* grads, double lr, int64_t step) {
    // ---- reduce-scatter: this rank's shard of the mean gradient, back into grads ----
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        const ShardState& st = shards_[sp];
        const ShardMap&   map = st.map;
        if (map.numel() == 0) continue;
        if (map.ranks() == 1) {  // nothing to reduce; only the scaling
            if (st.grad_scale != 1.0f) {
                for (const FlatRun& r : map.runs()) {
                    kernels::scale_inplace(grads + r.begin, st.grad_scale, r.end - r.begin);
                }
            }
            continue;
        }
        float* own = bucket_.data() + static_cast<size_t>(map.rank()) * map.piece_size();
        for (size_t b = 0; b < map.num_buckets(); ++b) {
            map.pack(b, grads, bucket_.data());
            dist::reduce_scatter_mean(comm_of(sp), {bucket_.data(), map.bucket_size()},
                                      {own, map.piece_size()});
            if (st.grad_scale != 1.0f) kernels::scale_inplace(own, st.grad_scale, map.piece_size());
            map.unpack(b, bucket_.data(), grads, true);
        }
    }

    // ---- global norm: every float of every tensor lies in exactly one rank's shard ----
    double sq = 0;
    for (const ShardState& st : shards_) {
        for (const ShardPiece& p : st.map.pieces()) {
            sq += kernels::sum_squares(grads + p.flat_offset, p.len);
        }
    }
    if (par_.size() > 1) par_.world().allreduce_sum(std::span<double>(&sq, 1));
    const double norm = std::sqrt(sq);
    const float  clip = hyper_.grad_clip > 0 && norm > hyper_.grad_clip
                            ? static_cast<float>(hyper_.grad_clip / norm)
                            : 1.0f;

    // ---- AdamW on the shard; the parameters are the FP32 master weights ----
    for (ShardState& st : shards_) {
        for (const ShardPiece& p : st.map.pieces()) {
            if (clip != 1.0f) kernels::scale_inplace(grads + p.flat_offset, clip, p.len);
            kernels::adamw_update(params + p.flat_offset, grads + p.flat_offset,
                                  st.m.data() + p.shard_offset, st.v.data() + p.shard_offset, p.len,
                                  static_cast<float>(lr), hyper_.beta1, hyper_.beta2, hyper_.eps,
                                  p.decay ? hyper_.weight_decay : 0.0f, static_cast<int>(step));
        }
    }

    // ---- all-gather: every rank's updated shard into the full local parameter array ----
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        const ShardMap& map = shards_[sp].map;
        if (map.numel() == 0 || map.ranks() == 1) continue;
        const float* own = bucket_.data() + static_cast<size_t>(map.rank()) * map.piece_size();
        for (size_t b = 0; b < map.num_buckets(); ++b) {
            map.pack_own(b, params, bucket_.data());
            dist::all_gather(comm_of(sp), {own, map.piece_size()},
                             {bucket_.data(), map.bucket_size()});
            map.unpack(b, bucket_.data(), params, false);
        }
    }
    return norm;
}

MemoryFootprint PartitionedAdamW::footprint() const {
    MemoryFootprint f;
    f.param_bytes = n_floats_ * sizeof(float);
    f.grad_bytes  = n_floats_ * sizeof(float);
    for (const ShardState& st : shards_) f.optim_bytes += (st.m.size() + st.v.size()) * sizeof(float);
    f.comm_bytes = bucket_.size() * sizeof(float);
    return f;
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par) {
    const TrainSection& t = cfg.train;
    const AdamWHyper    hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                           static_cast<float>(t.eps), static_cast<float>(t.weight_decay),
                           t.grad_clip};
    if (cfg.partition_optimizer(par.size())) {
        return std::make_unique<PartitionedAdamW>(layout, par, hyper);
    }
    return std::make_unique<ReplicatedAdamW>(layout, par, hyper);
}

size_t peak_rss_bytes() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    }
    return 0;
}

}  // namespace bagualu::train

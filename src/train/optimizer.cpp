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

void Optimizer::begin_reduction(float* grads) {
    BGL_CHECK(!schedule_->armed(), "begin_reduction twice before step()");
    grads_ = grads;
    schedule_->begin();
}

void Optimizer::finish_reduction(float* grads) {
    BGL_CHECK(!schedule_->armed() || grads == grads_,
              "step() got another gradient array than begin_reduction()");
    grads_         = grads;
    reduce_wait_s_ = schedule_->finish();
}

namespace {

// x *= s elementwise: the compute pool's kernel on the main thread, a plain loop on the helper
// (which must not use the pool). One multiply per float either way: the same bits.
void scale_floats(float* x, float s, size_t n, bool on_helper) {
    if (!on_helper) {
        kernels::scale_inplace(x, s, n);
        return;
    }
    for (size_t i = 0; i < n; ++i) x[i] *= s;
}

// A communicator of the same ranks as c, for the reductions alone; in background mode (its
// all-reduce is the nonblocking one on whichever thread runs the unit: the same bits).
std::unique_ptr<dist::Comm> duplicate(dist::Comm& c) {
    std::unique_ptr<dist::Comm> d = c.split(0, c.rank());
    d->set_background(true);
    return d;
}

// The replicated reduction (grad_sync.h), one unit per segment: sum over world (dense) or the
// edp group (experts), then / P.
class ReplicatedAdamW final : public Optimizer {
   public:
    ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                    const AdamWHyper& hyper, HelperThread* helper)
        : layout_(layout),
          par_(par),
          hyper_(hyper),
          segs_(make_segments(layout)),
          m_(layout.total_floats()),
          v_(layout.total_floats()),
          maps_(make_space_maps(layout, par, PartitionedAdamW::kDefaultBucketFloats)),
          reduce_world_(duplicate(par.world())),
          reduce_edp_(duplicate(par.edp())) {
        std::vector<size_t> ready;
        for (const Segment& s : segs_) ready.push_back(s.begin);
        schedule_ = std::make_unique<ReduceSchedule>(
            std::move(ready), helper, [this](size_t u, bool on_helper) { reduce_segment(u, on_helper); });
    }
    ~ReplicatedAdamW() override { schedule_->drain(); }

    double step(float* params, float* grads, double lr, int64_t step) override {
        finish_reduction(grads);
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
    void reduce_segment(size_t i, bool on_helper) {
        if (par_.size() == 1) return;
        const Segment&   s = segs_[i];
        std::span<float> g(grads_ + s.begin, s.end - s.begin);
        if (s.expert) {
            if (par_.edp_size() > 1) reduce_edp_->allreduce_sum(g);
        } else {
            reduce_world_->allreduce_sum(g);
        }
        scale_floats(g.data(), 1.0f / static_cast<float>(par_.size()), g.size(), on_helper);
    }

    const model::ParamLayout&   layout_;
    dist::ParallelContext&      par_;
    AdamWHyper                  hyper_;
    std::vector<Segment>        segs_;
    Buffer<float>               m_, v_;  // [layout floats]
    std::vector<ShardMap>       maps_;  // checkpoint pieces only
    std::unique_ptr<dist::Comm> reduce_world_, reduce_edp_;
};

}  // namespace

PartitionedAdamW::PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                   const AdamWHyper& hyper, size_t bucket_floats,
                                   HelperThread* helper)
    : par_(par),
      reduce_world_(duplicate(par.world())),
      reduce_edp_(duplicate(par.edp())),
      hyper_(hyper),
      n_floats_(layout.total_floats()) {
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
    // one unit per bucket of a space that is split over more than one rank
    std::vector<size_t> ready;
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        const ShardMap& map = shards_[sp].map;
        if (map.numel() == 0 || map.ranks() == 1) continue;
        for (size_t b = 0; b < map.num_buckets(); ++b) {
            units_.push_back(Unit{sp, b});
            ready.push_back(map.first_flat(b));
        }
    }
    schedule_ = std::make_unique<ReduceSchedule>(
        std::move(ready), helper,
        [this](size_t u, bool on_helper) { reduce_bucket(units_[u], on_helper); });
}

PartitionedAdamW::~PartitionedAdamW() { schedule_->drain(); }

void PartitionedAdamW::reduce_bucket(const Unit& u, bool on_helper) {
    const ShardState& st  = shards_[u.space];
    const ShardMap&   map = st.map;
    float*            own = bucket_.data() + static_cast<size_t>(map.rank()) * map.piece_size();
    map.pack(u.bucket, grads_, bucket_.data());
    dist::reduce_scatter_mean(u.space == 0 ? *reduce_world_ : *reduce_edp_,
                              {bucket_.data(), map.bucket_size()}, {own, map.piece_size()});
    if (st.grad_scale != 1.0f) scale_floats(own, st.grad_scale, map.piece_size(), on_helper);
    map.unpack(u.bucket, bucket_.data(), grads_, true);
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
    // ---- reduce-scatter: this rank's shard of the mean gradient, back into grads (the buckets
    // were maybe started during backward); a space of one rank is only scaled ----
    finish_reduction(grads);
    for (const ShardState& st : shards_) {
        if (st.map.numel() == 0 || st.map.ranks() > 1 || st.grad_scale == 1.0f) continue;
        for (const FlatRun& r : st.map.runs()) {
            kernels::scale_inplace(grads + r.begin, st.grad_scale, r.end - r.begin);
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
                                          dist::ParallelContext& par, HelperThread* helper) {
    const TrainSection& t = cfg.train;
    const AdamWHyper    hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                           static_cast<float>(t.eps), static_cast<float>(t.weight_decay),
                           t.grad_clip};
    if (cfg.partition_optimizer(par.size())) {
        return std::make_unique<PartitionedAdamW>(layout, par, hyper,
                                                  PartitionedAdamW::kDefaultBucketFloats, helper);
    }
    return std::make_unique<ReplicatedAdamW>(layout, par, hyper, helper);
}

size_t peak_rss_bytes() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    }
    return 0;
}

}  // namespace bagualu::train

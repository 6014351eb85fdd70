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
#include "kernels/mixed.h"
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

using model::MasterMode;

std::vector<MasterMode> master_modes(const model::ParamLayout& layout,
                                     const model::PrecisionPolicy& prec) {
    std::vector<MasterMode> modes;
    for (const model::ParamSpec& s : layout.specs()) modes.push_back(prec.master_mode(s));
    return modes;
}

// AdamW on n elements of one tensor under its precision mode: a float32 parameter in place; a
// half one (O2) on its FP32 master, then the parameter = the master rounded to dtype; a half
// one without master (O3) on half gradients in place, then rounded again.
void update(MasterMode mode, Dtype dtype, bool fp64, float* param, float* master, float* grad,
            float* m, float* v, size_t n, float lr, const AdamWHyper& h, bool decay, int step) {
    const auto adamw = fp64 ? kernels::adamw_update_f64 : kernels::adamw_update;
    const float wd   = decay ? h.weight_decay : 0.0f;
    switch (mode) {
        case MasterMode::none:
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            break;
        case MasterMode::master:
            adamw(master, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            kernels::round_copy(param, master, n, dtype);
            break;
        case MasterMode::half:
            kernels::round_inplace(grad, n, dtype);
            adamw(param, grad, m, v, n, lr, h.beta1, h.beta2, h.eps, wd, step);
            kernels::round_inplace(param, n, dtype);
            break;
    }
}

// The replicated reduction (grad_sync.h), one unit per segment: sum over world (dense) or the
// edp group (experts), then / P.
class ReplicatedAdamW final : public Optimizer {
   public:
    ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                    const AdamWHyper& hyper, HelperThread* helper,
                    const model::PrecisionPolicy& prec)
        : layout_(layout),
          par_(par),
          hyper_(hyper),
          prec_(prec),
          modes_(master_modes(layout, prec)),
          segs_(make_segments(layout)),
          m_(layout.total_floats()),
          v_(layout.total_floats()),
          maps_(make_space_maps(layout, par, PartitionedAdamW::kDefaultBucketFloats)),
          reduce_world_(duplicate(par.world())),
          reduce_edp_(duplicate(par.edp())) {
        // FP32 masters of the O2 tensors only, one after the other
        size_t n = 0;
        for (size_t i = 0; i < modes_.size(); ++i) {
            master_at_.push_back(n);
            if (modes_[i] == MasterMode::master) n += layout.spec(i).numel;
        }
        master_ = Buffer<float>(n);
        std::vector<size_t> ready;
        for (const Segment& s : segs_) ready.push_back(s.begin);
        schedule_ = std::make_unique<ReduceSchedule>(
            std::move(ready), helper, [this](size_t u, bool on_helper) { reduce_segment(u, on_helper); });
    }
    ~ReplicatedAdamW() override { schedule_->drain(); }

    double step(float* params, float* grads, double lr, int64_t step) override {
        finish_reduction(grads);
        if (loss_scale_ != 1) {
            kernels::scale_inplace(grads, static_cast<float>(1.0 / loss_scale_), layout_.total_floats());
        }
        const double norm = global_grad_norm(grads, segs_, &par_);
        skipped_          = !std::isfinite(norm);
        if (skipped_) {
            ++n_skipped_;
            return norm;
        }
        if (hyper_.grad_clip > 0 && norm > hyper_.grad_clip) {
            kernels::scale_inplace(grads, static_cast<float>(hyper_.grad_clip / norm),
                                   layout_.total_floats());
        }
        for (size_t i = 0; i < layout_.specs().size(); ++i) {
            const model::ParamSpec& s = layout_.spec(i);
            float* master = master_.data() + master_at_[i];
            if (modes_[i] == MasterMode::master && !masters_ready_) {
                std::copy(params + s.offset, params + s.offset + s.numel, master);
            }
            update(modes_[i], prec_.dtype, prec_.fp64_sensitive, params + s.offset, master,
                   grads + s.offset, m_.data() + s.offset, v_.data() + s.offset, s.numel,
                   static_cast<float>(lr), hyper_, s.decay, static_cast<int>(step - n_skipped_));
        }
        masters_ready_ = true;
        return norm;
    }
    MemoryFootprint footprint() const override {
        const size_t bytes = layout_.total_floats() * sizeof(float);
        return MemoryFootprint{bytes, bytes, 2 * bytes + master_.size() * sizeof(float), 0};
    }
    const float* master_of(size_t, const ShardPiece& p) const override {
        if (modes_[p.spec] != MasterMode::master || !masters_ready_) return nullptr;
        return master_.data() + master_at_[p.spec] + p.elem_offset;
    }
    void masters_loaded(float* params) override {
        for (size_t i = 0; i < modes_.size(); ++i) {
            if (modes_[i] != MasterMode::master) continue;
            const model::ParamSpec& s = layout_.spec(i);
            float* master = master_.data() + master_at_[i];
            std::copy(params + s.offset, params + s.offset + s.numel, master);
            kernels::round_copy(params + s.offset, master, s.numel, prec_.dtype);
        }
        masters_ready_ = true;
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
    model::PrecisionPolicy      prec_;
    std::vector<MasterMode>     modes_;  // [layout specs]
    std::vector<Segment>        segs_;
    Buffer<float>               m_, v_;      // [layout floats]
    Buffer<float>               master_;     // FP32 masters of the O2 tensors
    std::vector<size_t>         master_at_;  // [layout specs] offset of a tensor's master
    bool                        masters_ready_ = false;
    std::vector<ShardMap>       maps_;  // checkpoint pieces only
    std::unique_ptr<dist::Comm> reduce_world_, reduce_edp_;
};

}  // namespace

namespace {

// ParO's spaces as flat runs: [dense, expert] of float32 tensors, then [dense, expert] of
// half-stored ones (each tensor with its padding to 16 floats), and which hold O2 tensors.
struct SpaceRuns {
    std::vector<FlatRun> runs[4];
    bool                 master[4] = {false, false, false, false};
    bool                 any_half  = false;
    int count() const { return any_half ? 4 : 2; }
};

SpaceRuns paro_space_runs(const model::ParamLayout& layout, const std::vector<MasterMode>& modes) {
    SpaceRuns r;
    for (size_t i = 0; i < layout.specs().size(); ++i) {
        const model::ParamSpec& s = layout.spec(i);
        const bool half = modes[i] != MasterMode::none;
        r.any_half      = r.any_half || half;
        const int sp    = (half ? 2 : 0) + (s.expert ? 1 : 0);
        r.master[sp]    = r.master[sp] || modes[i] == MasterMode::master;
        std::vector<FlatRun>& runs = r.runs[sp];
        const size_t end           = s.offset + (s.numel + 15) / 16 * 16;
        if (!runs.empty() && runs.back().end == s.offset) {
            runs.back().end = end;
        } else {
            runs.push_back({s.offset, end});
        }
    }
    return r;
}

size_t run_floats(const std::vector<FlatRun>& runs) {
    size_t n = 0;
    for (const FlatRun& r : runs) n += r.end - r.begin;
    return n;
}

}  // namespace

std::vector<ParoSpace> paro_spaces(const model::ParamLayout& layout, const model::PrecisionPolicy& prec,
                                   int world_size, int world_rank, int edp_size, int edp_rank,
                                   size_t bucket_floats) {
    const std::vector<MasterMode> modes = master_modes(layout, prec);
    SpaceRuns                     r     = paro_space_runs(layout, modes);
    std::vector<ParoSpace>        spaces;
    for (int sp = 0; sp < r.count(); ++sp) {
        const bool expert = sp % 2 == 1;
        ShardMap   map(std::move(r.runs[sp]), layout, expert ? edp_size : world_size,
                       expert ? edp_rank : world_rank, bucket_floats);
        bool master = false;
        for (const ShardPiece& p : map.pieces()) master = master || modes[p.spec] == MasterMode::master;
        spaces.push_back(ParoSpace{std::move(map), expert, sp >= 2 ? prec.dtype : Dtype::float32, master});
    }
    return spaces;
}

// Sizes only (shard_geometry, as ShardMap computes them): no maps, so a layout of billions of
// floats over 100,000 ranks costs microseconds.
MemoryFootprint optimizer_footprint(const model::ParamLayout& layout,
                                    const model::PrecisionPolicy& prec, bool partitioned,
                                    int world_size, int edp_size, size_t bucket_floats) {
    const size_t                  n     = layout.total_floats();
    const std::vector<MasterMode> modes = master_modes(layout, prec);
    MemoryFootprint               f{n * sizeof(float), n * sizeof(float), 0, 0};
    if (!partitioned) {  // ReplicatedAdamW: m and v of every float, masters of the O2 tensors
        size_t masters = 0;
        for (size_t i = 0; i < modes.size(); ++i) {
            if (modes[i] == MasterMode::master) masters += layout.spec(i).numel;
        }
        f.optim_bytes = (2 * n + masters) * sizeof(float);
        return f;
    }
    const SpaceRuns r          = paro_space_runs(layout, modes);
    size_t          max_bucket = 0, max_half_bucket = 0;
    for (int sp = 0; sp < r.count(); ++sp) {
        const int           P = sp % 2 == 1 ? edp_size : world_size;
        const ShardGeometry g = shard_geometry(run_floats(r.runs[sp]), P, bucket_floats);
        f.optim_bytes += (r.master[sp] ? 3 : 2) * g.nb * g.q * sizeof(float);
        if (P > 1) {
            max_bucket = std::max(max_bucket, g.q * static_cast<size_t>(P));
            if (sp >= 2) max_half_bucket = std::max(max_half_bucket, g.q * static_cast<size_t>(P));
        }
    }
    f.comm_bytes = max_bucket * sizeof(float) + max_half_bucket * sizeof(uint16_t);
    return f;
}

PartitionedAdamW::PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                   const AdamWHyper& hyper, size_t bucket_floats,
                                   HelperThread* helper, const model::PrecisionPolicy& prec)
    : layout_(layout),
      par_(par),
      reduce_world_(duplicate(par.world())),
      reduce_edp_(duplicate(par.edp())),
      hyper_(hyper),
      prec_(prec),
      modes_(master_modes(layout, prec)),
      n_floats_(layout.total_floats()) {
    const float inv_ep = 1.0f / static_cast<float>(par.ep_size());
    size_t      max_bucket = 0, max_half_bucket = 0;
    for (ParoSpace& sp : paro_spaces(layout, prec, par.size(), par.rank(), par.edp_size(),
                                     par.edp_rank(), bucket_floats)) {
        const size_t S = sp.map.shard_size();
        if (sp.map.ranks() > 1) {
            max_bucket = std::max(max_bucket, sp.map.bucket_size());
            if (sp.dtype != Dtype::float32) max_half_bucket = std::max(max_half_bucket, sp.map.bucket_size());
        }
        shards_.push_back(ShardState{std::move(sp.map), Buffer<float>(S), Buffer<float>(S),
                                     sp.expert ? inv_ep : 1.0f, sp.expert, sp.dtype,
                                     sp.master ? Buffer<float>(S) : Buffer<float>()});
    }
    bucket_   = Buffer<float>(max_bucket);
    bucket16_ = Buffer<uint16_t>(max_half_bucket);
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
    dist::reduce_scatter_mean(st.expert ? *reduce_edp_ : *reduce_world_,
                              {bucket_.data(), map.bucket_size()}, {own, map.piece_size()});
    // the mean's scaling, and unscaling by the loss scale, on this rank's shard only
    const float scale = st.grad_scale * static_cast<float>(1.0 / loss_scale_);
    if (scale != 1.0f) scale_floats(own, scale, map.piece_size(), on_helper);
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

std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, int world_size, int world_rank,
                                      int edp_size, int edp_rank, size_t bucket_floats) {
    std::vector<FlatRun> runs[2];  // [dense, expert]
    for (const Segment& s : make_segments(layout)) runs[s.expert].push_back({s.begin, s.end});
    std::vector<ShardMap> maps;
    maps.emplace_back(std::move(runs[0]), layout, world_size, world_rank, bucket_floats);
    maps.emplace_back(std::move(runs[1]), layout, edp_size, edp_rank, bucket_floats);
    return maps;
}

std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, dist::ParallelContext& par,
                                      size_t bucket_floats) {
    return make_space_maps(layout, par.size(), par.rank(), par.edp_size(), par.edp_rank(), bucket_floats);
}

size_t state_piece_floats(const model::ParamLayout& layout, const model::PrecisionPolicy& prec,
                          bool partitioned, int world_size, int edp_size, size_t bucket_floats) {
    // shards of equal size S = NB * q on every rank (ShardMap); the pieces are S less the
    // tensor padding and, on the last ranks, the space's own padding
    std::vector<std::pair<size_t, int>> spaces;  // (floats, ranks)
    if (partitioned) {
        const SpaceRuns r = paro_space_runs(layout, master_modes(layout, prec));
        for (int sp = 0; sp < r.count(); ++sp) {
            spaces.emplace_back(run_floats(r.runs[sp]), sp % 2 == 1 ? edp_size : world_size);
        }
    } else {
        // ReplicatedAdamW's maps (make_space_maps), always of the default bucket size
        bucket_floats = PartitionedAdamW::kDefaultBucketFloats;
        size_t dense = 0, expert = 0;
        for (const Segment& s : make_segments(layout)) (s.expert ? expert : dense) += s.end - s.begin;
        spaces = {{dense, world_size}, {expert, edp_size}};
    }
    size_t floats = 0;
    for (const auto& [n, P] : spaces) {
        const ShardGeometry g = shard_geometry(n, P, bucket_floats);
        floats += g.nb * g.q;
    }
    return floats;
}

dist::Comm& PartitionedAdamW::comm_of(size_t space) {
    return shards_[space].expert ? par_.edp() : par_.world();
}

const float* PartitionedAdamW::master_of(size_t space, const ShardPiece& p) const {
    const ShardState& st = shards_[space];
    if (modes_[p.spec] != MasterMode::master || !masters_ready_ || st.master.size() == 0) return nullptr;
    return st.master.data() + p.shard_offset;
}

void PartitionedAdamW::masters_loaded(float* params) {
    for (ShardState& st : shards_) {
        for (const ShardPiece& p : st.map.pieces()) {
            if (modes_[p.spec] != MasterMode::master) continue;
            std::copy(params + p.flat_offset, params + p.flat_offset + p.len,
                      st.master.data() + p.shard_offset);
        }
    }
    for (size_t i = 0; i < modes_.size(); ++i) {  // every rank's copy of the parameters: rounded
        if (modes_[i] != MasterMode::master) continue;
        const model::ParamSpec& s = layout_.spec(i);
        kernels::round_inplace(params + s.offset, s.numel, prec_.dtype);
    }
    masters_ready_ = true;
}

double PartitionedAdamW::step(float* params, float* grads, double lr, int64_t step) {
    // ---- reduce-scatter: this rank's shard of the mean gradient, back into grads (the buckets
    // were maybe started during backward); a space of one rank is only scaled ----
    finish_reduction(grads);
    for (const ShardState& st : shards_) {
        const float scale = st.grad_scale * static_cast<float>(1.0 / loss_scale_);
        if (st.map.numel() == 0 || st.map.ranks() > 1 || scale == 1.0f) continue;
        for (const FlatRun& r : st.map.runs()) {
            kernels::scale_inplace(grads + r.begin, scale, r.end - r.begin);
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
    skipped_          = !std::isfinite(norm);  // the same on every rank: sq is all-reduced
    if (skipped_) {
        ++n_skipped_;
        return norm;
    }
    const float  clip = hyper_.grad_clip > 0 && norm > hyper_.grad_clip
                            ? static_cast<float>(hyper_.grad_clip / norm)
                            : 1.0f;

    // ---- AdamW on the shard: on the parameters (float32) or on the FP32 master shard ----
    for (ShardState& st : shards_) {
        for (const ShardPiece& p : st.map.pieces()) {
            if (clip != 1.0f) kernels::scale_inplace(grads + p.flat_offset, clip, p.len);
            float* master = st.master.size() > 0 ? st.master.data() + p.shard_offset : nullptr;
            if (modes_[p.spec] == MasterMode::master && !masters_ready_) {
                std::copy(params + p.flat_offset, params + p.flat_offset + p.len, master);
            }
            update(modes_[p.spec], st.dtype, prec_.fp64_sensitive, params + p.flat_offset, master,
                   grads + p.flat_offset, st.m.data() + p.shard_offset,
                   st.v.data() + p.shard_offset, p.len, static_cast<float>(lr), hyper_, p.decay,
                   static_cast<int>(step - n_skipped_));
        }
    }
    masters_ready_ = true;

    // ---- all-gather: every rank's updated shard into the full local parameter array ----
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        const ShardMap& map = shards_[sp].map;
        if (map.numel() == 0 || map.ranks() == 1) continue;
        const size_t own_at = static_cast<size_t>(map.rank()) * map.piece_size();
        const Dtype  dt     = shards_[sp].dtype;
        for (size_t b = 0; b < map.num_buckets(); ++b) {
            map.pack_own(b, params, bucket_.data());
            if (dt == Dtype::float32) {
                dist::all_gather(comm_of(sp), {bucket_.data() + own_at, map.piece_size()},
                                 {bucket_.data(), map.bucket_size()});
            } else {
                // half payload: the shard's parameters already hold values of dtype (exact)
                const bool bf  = dt == Dtype::bfloat16;
                float*     buf = bucket_.data();
                uint16_t*  h   = bucket16_.data();
                for (size_t i = own_at; i < own_at + map.piece_size(); ++i) {
                    h[i] = bf ? bf16_from_float(buf[i]) : fp16_from_float(buf[i]);
                }
                dist::all_gather(comm_of(sp), std::span<const uint16_t>(h + own_at, map.piece_size()),
                                 std::span<uint16_t>(h, map.bucket_size()));
                for (size_t i = 0; i < map.bucket_size(); ++i) {
                    buf[i] = bf ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
                }
            }
            map.unpack(b, bucket_.data(), params, false);
        }
    }
    return norm;
}

MemoryFootprint PartitionedAdamW::footprint() const {
    MemoryFootprint f;
    f.param_bytes = n_floats_ * sizeof(float);
    f.grad_bytes  = n_floats_ * sizeof(float);
    for (const ShardState& st : shards_) {
        f.optim_bytes += (st.m.size() + st.v.size() + st.master.size()) * sizeof(float);
    }
    f.comm_bytes = bucket_.size() * sizeof(float) + bucket16_.size() * sizeof(uint16_t);
    return f;
}

size_t paro_bucket_floats(const TrainConfig& cfg, int ranks) {
    return std::max(cfg.bucket_floats(), static_cast<size_t>(ranks) * kMinPieceFloats);
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par, const model::PrecisionPolicy& prec,
                                          HelperThread* helper) {
    const TrainSection& t = cfg.train;
    const AdamWHyper    hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                           static_cast<float>(t.eps), static_cast<float>(t.weight_decay),
                           t.grad_clip};
    if (cfg.partition_optimizer(par.size())) {
        return std::make_unique<PartitionedAdamW>(layout, par, hyper, paro_bucket_floats(cfg, par.size()), helper,
                                                  prec);
    }
    return std::make_unique<ReplicatedAdamW>(layout, par, hyper, helper, prec);
}

size_t peak_rss_bytes() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    }
    return 0;
}

}  // namespace bagualu::train

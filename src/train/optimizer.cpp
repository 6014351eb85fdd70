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

namespace {

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

class ReplicatedAdamW final : public Optimizer {
   public:
    ReplicatedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                    const AdamWHyper& hyper, const model::PrecisionPolicy& prec)
        : layout_(layout),
          par_(par),
          hyper_(hyper),
          prec_(prec),
          modes_(master_modes(layout, prec)),
          segs_(make_segments(layout)),
          m_(layout.total_floats()),
          v_(layout.total_floats()) {
        // FP32 masters of the O2 tensors only, one after the other
        size_t n = 0;
        for (size_t i = 0; i < modes_.size(); ++i) {
            master_at_.push_back(n);
            if (modes_[i] == MasterMode::master) n += layout.spec(i).numel;
        }
        master_ = Buffer<float>(n);
    }

    double step(float* params, float* grads, double lr, int64_t step) override {
        reduce_gradients(grads, segs_, par_);
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
    bool partitioned() const override { return false; }

   private:
    const model::ParamLayout& layout_;
    dist::ParallelContext&    par_;
    AdamWHyper                hyper_;
    model::PrecisionPolicy    prec_;
    std::vector<MasterMode>   modes_;  // [layout specs]
    std::vector<Segment>      segs_;
    Buffer<float>             m_, v_;    // [layout floats]
    Buffer<float>             master_;     // FP32 masters of the O2 tensors
    std::vector<size_t>       master_at_;  // [layout specs] offset of a tensor's master
    bool                      masters_ready_ = false;
};

}  // namespace

PartitionedAdamW::PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                   const AdamWHyper& hyper, size_t bucket_floats,
                                   const model::PrecisionPolicy& prec)
    : par_(par),
      hyper_(hyper),
      prec_(prec),
      modes_(master_modes(layout, prec)),
      n_floats_(layout.total_floats()) {
    // spaces: [dense, expert] of float32 tensors, then [dense, expert] of half-stored ones
    std::vector<FlatRun> runs[4];
    bool                 any_half = false;
    for (size_t i = 0; i < layout.specs().size(); ++i) {
        const model::ParamSpec& s = layout.spec(i);
        const bool half = modes_[i] != MasterMode::none;
        any_half        = any_half || half;
        std::vector<FlatRun>& r = runs[(half ? 2 : 0) + (s.expert ? 1 : 0)];
        const size_t end        = s.offset + (s.numel + 15) / 16 * 16;
        if (!r.empty() && r.back().end == s.offset) {
            r.back().end = end;
        } else {
            r.push_back({s.offset, end});
        }
    }
    const float inv_ep = 1.0f / static_cast<float>(par.ep_size());
    for (int sp = 0; sp < (any_half ? 4 : 2); ++sp) {
        const bool expert = sp % 2 == 1;
        shards_.push_back(ShardState{ShardMap(std::move(runs[sp]), layout,
                                              expert ? par.edp_size() : par.size(),
                                              expert ? par.edp_rank() : par.rank(), bucket_floats),
                                     {}, {}, expert ? inv_ep : 1.0f, expert,
                                     sp >= 2 ? prec.dtype : Dtype::float32, {}});
    }
    size_t max_bucket = 0, max_half_bucket = 0;
    for (ShardState& st : shards_) {
        st.m = Buffer<float>(st.map.shard_size());
        st.v = Buffer<float>(st.map.shard_size());
        for (const ShardPiece& p : st.map.pieces()) {
            if (modes_[p.spec] == MasterMode::master && st.master.size() == 0) {
                st.master = Buffer<float>(st.map.shard_size());
            }
        }
        if (st.map.ranks() > 1) {
            max_bucket = std::max(max_bucket, st.map.bucket_size());
            if (st.dtype != Dtype::float32) max_half_bucket = std::max(max_half_bucket, st.map.bucket_size());
        }
    }
    bucket_   = Buffer<float>(max_bucket);
    bucket16_ = Buffer<uint16_t>(max_half_bucket);
}

dist::Comm& PartitionedAdamW::comm_of(size_t space) {
    return shards_[space].expert ? par_.edp() : par_.world();
}

double PartitionedAdamW::step(float* params, float* grads, double lr, int64_t step) {
    // ---- reduce-scatter: this rank's shard of the mean gradient, back into grads ----
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        const ShardState& st = shards_[sp];
        const ShardMap&   map = st.map;
        if (map.numel() == 0) continue;
        // the mean's scaling, and unscaling by the loss scale, on this rank's shard only
        const float scale = st.grad_scale * static_cast<float>(1.0 / loss_scale_);
        if (map.ranks() == 1) {  // nothing to reduce; only the scaling
            if (scale != 1.0f) {
                for (const FlatRun& r : map.runs()) {
                    kernels::scale_inplace(grads + r.begin, scale, r.end - r.begin);
                }
            }
            continue;
        }
        float* own = bucket_.data() + static_cast<size_t>(map.rank()) * map.piece_size();
        for (size_t b = 0; b < map.num_buckets(); ++b) {
            map.pack(b, grads, bucket_.data());
            dist::reduce_scatter_mean(comm_of(sp), {bucket_.data(), map.bucket_size()},
                                      {own, map.piece_size()});
            if (scale != 1.0f) kernels::scale_inplace(own, scale, map.piece_size());
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

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, const model::ParamLayout& layout,
                                          dist::ParallelContext& par) {
    const TrainSection& t = cfg.train;
    const AdamWHyper    hyper{static_cast<float>(t.beta1), static_cast<float>(t.beta2),
                           static_cast<float>(t.eps), static_cast<float>(t.weight_decay),
                           t.grad_clip};
    const model::PrecisionPolicy prec = model::PrecisionPolicy::from_config(cfg.precision);
    if (cfg.partition_optimizer(par.size())) {
        return std::make_unique<PartitionedAdamW>(layout, par, hyper,
                                                  PartitionedAdamW::kDefaultBucketFloats, prec);
    }
    return std::make_unique<ReplicatedAdamW>(layout, par, hyper, prec);
}

size_t peak_rss_bytes() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
    }
    return 0;
}

}  // namespace bagualu::train

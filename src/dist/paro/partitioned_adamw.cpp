// ParO: gradients reduce-scattered in buckets, AdamW on this rank's shard of each space, the
// updated parameters all-gathered. Gradient scaling as grad_sync.h: dense gradients are the mean
// over all P ranks, expert gradients the sum over their edp group / P, i.e. the edp mean / EP.
#include "dist/paro/partitioned_adamw.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "dist/comm/collectives.h"
#include "dist/paro/grad_sync.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "optim/grad_clip.h"

namespace bagualu::dist::paro {

using model::MasterMode;

PartitionedAdamW::PartitionedAdamW(const model::ParamLayout& layout, dist::ParallelContext& par,
                                   const optim::AdamWHyper& hyper, size_t bucket_floats,
                                   HelperThread* helper, const model::PrecisionPolicy& prec)
    : layout_(layout),
      par_(par),
      reduce_world_(reduction_comm(par.world())),
      reduce_edp_(reduction_comm(par.edp())),
      hyper_(hyper),
      prec_(prec),
      modes_(optim::master_modes(layout, prec)),
      n_floats_(layout.total_floats()) {
    const float inv_ep = 1.0f / static_cast<float>(par.ep_size());
    size_t max_bucket = 0, max_half_bucket = 0;
    for (ParoSpace& sp : paro_spaces(layout, prec, par.size(), par.rank(), par.edp_size(),
                                     par.edp_rank(), bucket_floats)) {
        const size_t S = sp.map.shard_size();
        if (sp.map.ranks() > 1) {
            max_bucket = std::max(max_bucket, sp.map.bucket_size());
            if (sp.dtype != Dtype::float32)
                max_half_bucket = std::max(max_half_bucket, sp.map.bucket_size());
        }
        shards_.push_back(ShardState{std::move(sp.map), optim::Moments(S, prec.moments),
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
    const ShardState& st = shards_[u.space];
    const ShardMap& map  = st.map;
    float* own           = bucket_.data() + static_cast<size_t>(map.rank()) * map.piece_size();
    map.pack(u.bucket, grads_, bucket_.data());
    dist::Comm& comm = st.expert ? *reduce_edp_ : *reduce_world_;
    if (prec_.half_reduce && st.dtype != Dtype::float32) {
        // precision.grad_reduce = "half": the bucket in the space's half type, reduce-scattered
        // with online averaging (float32 folds, each hop rounded once), this rank's piece back
        // to floats
        const size_t n = map.bucket_size(), piece = map.piece_size();
        const size_t own_at = static_cast<size_t>(map.rank()) * piece;
        uint16_t* h         = bucket16_.data();
        to_half(st.dtype, bucket_.data(), h, n);
        const std::span<const uint16_t> in(h, n);
        const std::span<uint16_t> out(h + own_at, piece);
        if (st.dtype == Dtype::bfloat16) {
            dist::reduce_scatter_mean_bf16(comm, nodes_of(u.space), par_.two_level(), in, out,
                                           par_.coll_algo());
        } else {
            dist::reduce_scatter_mean_fp16(comm, nodes_of(u.space), par_.two_level(), in, out,
                                           par_.coll_algo());
        }
        from_half(st.dtype, h + own_at, own, piece);
    } else {
        dist::reduce_scatter_mean(comm, nodes_of(u.space), par_.two_level(),
                                  {bucket_.data(), map.bucket_size()}, {own, map.piece_size()},
                                  par_.coll_algo());
    }
    // the mean's scaling, and unscaling by the loss scale, on this rank's shard only
    const float scale = st.grad_scale * static_cast<float>(1.0 / loss_scale_);
    if (scale != 1.0f) scale_floats(own, scale, map.piece_size(), on_helper);
    map.unpack(u.bucket, bucket_.data(), grads_, true);
}

std::vector<StateSpace> PartitionedAdamW::state_spaces() {
    std::vector<StateSpace> out;
    for (size_t sp = 0; sp < shards_.size(); ++sp) {
        out.push_back(StateSpace{&shards_[sp].map, &comm_of(sp), shards_[sp].moments.ref(), false});
    }
    return out;
}

dist::Comm& PartitionedAdamW::comm_of(size_t space) {
    return shards_[space].expert ? par_.edp() : par_.world();
}

const dist::NodeLayout& PartitionedAdamW::nodes_of(size_t space) const {
    return shards_[space].expert ? par_.edp_nodes() : par_.world_nodes();
}

const float* PartitionedAdamW::master_of(size_t space, const ShardPiece& p) const {
    const ShardState& st = shards_[space];
    if (modes_[p.spec] != MasterMode::master || !masters_ready_ || st.master.size() == 0)
        return nullptr;
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
    // reduce-scatter: this rank's shard of the mean gradient, back into grads (the buckets were
    // maybe started during backward)
    finish_reduction(grads);
    scale_unsplit_spaces(grads);
    const double norm = shard_grad_norm(grads);
    skipped_ = !std::isfinite(norm);  // the same on every rank: the squares are all-reduced
    if (skipped_) {
        ++n_skipped_;
        return norm;
    }
    update_shards(params, grads, static_cast<float>(lr), static_cast<int>(step - n_skipped_),
                  optim::clip_factor(norm, hyper_.grad_clip));
    for (size_t sp = 0; sp < shards_.size(); ++sp) all_gather_space(sp, params);
    return norm;
}

void PartitionedAdamW::scale_unsplit_spaces(float* grads) {
    // a space of one rank has no reduce-scatter: only the mean's and the loss scale's scaling
    for (const ShardState& st : shards_) {
        const float scale = st.grad_scale * static_cast<float>(1.0 / loss_scale_);
        if (st.map.numel() == 0 || st.map.ranks() > 1 || scale == 1.0f) continue;
        for (const FlatRun& r : st.map.runs()) {
            kernels::scale_inplace(grads + r.begin, scale, r.end - r.begin);
        }
    }
}

double PartitionedAdamW::shard_grad_norm(const float* grads) {
    // every float of every tensor lies in exactly one rank's shard; the squares of each piece
    // summed as sum_squares sums them, the pieces in order, in one pass over the threads
    norm_at_.clear();
    norm_len_.clear();
    for (const ShardState& st : shards_) {
        for (const ShardPiece& p : st.map.pieces()) {
            norm_at_.push_back(grads + p.flat_offset);
            norm_len_.push_back(p.len);
        }
    }
    const double sq = kernels::sum_squares_runs(norm_at_.data(), norm_len_.data(), norm_at_.size());
    return optim::global_norm(0.0, sq, par_.size() > 1 ? &par_.world() : nullptr);
}

void PartitionedAdamW::update_shards(float* params, float* grads, float lr, int step, float clip) {
    // AdamW on the shard: on the parameters (float32) or on the FP32 master shard
    for (ShardState& st : shards_) {
        const std::vector<ShardPiece>& pieces = st.map.pieces();
        const auto joins                      = [&](size_t i) {
            const ShardPiece &a = pieces[i - 1], &b = pieces[i];
            return modes_[b.spec] == modes_[a.spec] && b.decay == a.decay &&
                   b.flat_offset == a.flat_offset + a.len &&
                   b.shard_offset == a.shard_offset + a.len;
        };
        optim::for_each_run(pieces.size(), joins, [&](size_t first, size_t end) {
            const ShardPiece& p = pieces[first];
            const size_t n      = pieces[end - 1].flat_offset + pieces[end - 1].len - p.flat_offset;
            float* master = st.master.size() > 0 ? st.master.data() + p.shard_offset : nullptr;
            if (modes_[p.spec] == MasterMode::master && !masters_ready_) {
                std::copy(params + p.flat_offset, params + p.flat_offset + n, master);
            }
            optim::adamw_update(modes_[p.spec], st.dtype, prec_.fp64_sensitive,
                                params + p.flat_offset, master, grads + p.flat_offset,
                                st.moments.ref().at(p.shard_offset), n, lr, hyper_, p.decay, step,
                                clip);
        });
    }
    masters_ready_ = true;
}

void PartitionedAdamW::all_gather_space(size_t sp, float* params) {
    // every rank's updated shard into the full local parameter array
    const ShardMap& map = shards_[sp].map;
    if (map.numel() == 0 || map.ranks() == 1) return;
    const size_t own_at = static_cast<size_t>(map.rank()) * map.piece_size();
    const Dtype dt      = shards_[sp].dtype;
    for (size_t b = 0; b < map.num_buckets(); ++b) {
        map.pack_own(b, params, bucket_.data());
        if (dt == Dtype::float32) {
            dist::all_gather(comm_of(sp), nodes_of(sp), par_.two_level(),
                             {bucket_.data() + own_at, map.piece_size()},
                             {bucket_.data(), map.bucket_size()}, par_.coll_algo());
        } else {
            // half payload: the shard's parameters already hold values of dtype (exact)
            float* buf  = bucket_.data();
            uint16_t* h = bucket16_.data();
            to_half(dt, buf + own_at, h + own_at, map.piece_size());
            dist::all_gather(comm_of(sp), nodes_of(sp), par_.two_level(),
                             std::span<const uint16_t>(h + own_at, map.piece_size()),
                             std::span<uint16_t>(h, map.bucket_size()), par_.coll_algo());
            from_half(dt, h, buf, map.bucket_size());
        }
        map.unpack(b, bucket_.data(), params, false);
    }
}

MemoryFootprint PartitionedAdamW::footprint() const {
    MemoryFootprint f;
    f.param_bytes = n_floats_ * sizeof(float);
    f.grad_bytes  = n_floats_ * sizeof(float);
    for (const ShardState& st : shards_) {
        f.optim_bytes += st.moments.bytes() + st.master.size() * sizeof(float);
    }
    f.comm_bytes = bucket_.size() * sizeof(float) + bucket16_.size() * sizeof(uint16_t);
    return f;
}

}  // namespace bagualu::dist::paro

// ParO's spaces and their sizes, from the layout alone: the flat runs of each space, the shard
// maps PartitionedAdamW builds, and the footprint and checkpoint sizes `bagualu plan` predicts.
#include "dist/paro/spaces.h"

#include <algorithm>
#include <utility>

#include "dist/paro/grad_sync.h"
#include "optim/adamw.h"

namespace bagualu::dist::paro {

using model::MasterMode;
using optim::master_modes;

namespace {

// ParO's spaces as flat runs: [dense, expert] of float32 tensors, then [dense, expert] of
// half-stored ones (each tensor with its padding to 16 floats), and which hold O2 tensors.
struct SpaceRuns {
    std::vector<FlatRun> runs[4];
    bool master[4] = {false, false, false, false};
    bool any_half  = false;
    int count() const { return any_half ? 4 : 2; }
};

SpaceRuns paro_space_runs(const model::ParamLayout& layout, const std::vector<MasterMode>& modes) {
    SpaceRuns r;
    for (size_t i = 0; i < layout.specs().size(); ++i) {
        const model::ParamSpec& s  = layout.spec(i);
        const bool half            = modes[i] != MasterMode::none;
        r.any_half                 = r.any_half || half;
        const int sp               = (half ? 2 : 0) + (s.expert ? 1 : 0);
        r.master[sp]               = r.master[sp] || modes[i] == MasterMode::master;
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

std::vector<ParoSpace> paro_spaces(const model::ParamLayout& layout,
                                   const model::PrecisionPolicy& prec, int world_size,
                                   int world_rank, int edp_size, int edp_rank,
                                   size_t bucket_floats) {
    const std::vector<MasterMode> modes = master_modes(layout, prec);
    SpaceRuns r                         = paro_space_runs(layout, modes);
    std::vector<ParoSpace> spaces;
    for (int sp = 0; sp < r.count(); ++sp) {
        const bool expert = sp % 2 == 1;
        ShardMap map(std::move(r.runs[sp]), layout, expert ? edp_size : world_size,
                     expert ? edp_rank : world_rank, bucket_floats);
        bool master = false;
        for (const ShardPiece& p : map.pieces())
            master = master || modes[p.spec] == MasterMode::master;
        spaces.push_back(
            ParoSpace{std::move(map), expert, sp >= 2 ? prec.dtype : Dtype::float32, master});
    }
    return spaces;
}

// Sizes only (shard_geometry, as ShardMap computes them): no maps, so a layout of billions of
// floats over 100,000 ranks costs microseconds.
MemoryFootprint optimizer_footprint(const model::ParamLayout& layout,
                                    const model::PrecisionPolicy& prec, bool partitioned,
                                    int world_size, int edp_size, size_t bucket_floats) {
    const size_t n = layout.total_floats();
    const std::vector<MasterMode> modes =
        master_modes(layout, prec, model::masters_in_place(prec, partitioned));
    MemoryFootprint f{n * sizeof(float), n * sizeof(float), 0, 0};
    const size_t moment_bytes = prec.moment_bytes();
    if (!partitioned) {  // ReplicatedAdamW: m and v of every float, masters of the O2 tensors
                         // (none where they are kept in place)
        size_t masters = 0;
        for (size_t i = 0; i < modes.size(); ++i) {
            if (modes[i] == MasterMode::master) masters += layout.spec(i).numel;
        }
        f.optim_bytes = 2 * n * moment_bytes + masters * sizeof(float);
        return f;
    }
    const SpaceRuns r = paro_space_runs(layout, modes);
    size_t max_bucket = 0, max_half_bucket = 0;
    for (int sp = 0; sp < r.count(); ++sp) {
        const int P           = sp % 2 == 1 ? edp_size : world_size;
        const ShardGeometry g = shard_geometry(run_floats(r.runs[sp]), P, bucket_floats);
        f.optim_bytes += g.nb * g.q * (2 * moment_bytes + (r.master[sp] ? sizeof(float) : 0));
        if (P > 1) {
            max_bucket = std::max(max_bucket, g.q * static_cast<size_t>(P));
            if (sp >= 2) max_half_bucket = std::max(max_half_bucket, g.q * static_cast<size_t>(P));
        }
    }
    f.comm_bytes = max_bucket * sizeof(float) + max_half_bucket * sizeof(uint16_t);
    return f;
}

std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, int world_size,
                                      int world_rank, int edp_size, int edp_rank,
                                      size_t bucket_floats) {
    std::vector<FlatRun> runs[2];  // [dense, expert]
    for (const Segment& s : make_segments(layout)) runs[s.expert].push_back({s.begin, s.end});
    std::vector<ShardMap> maps;
    maps.emplace_back(std::move(runs[0]), layout, world_size, world_rank, bucket_floats);
    maps.emplace_back(std::move(runs[1]), layout, edp_size, edp_rank, bucket_floats);
    return maps;
}

std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, dist::ParallelContext& par,
                                      size_t bucket_floats) {
    return make_space_maps(layout, par.size(), par.rank(), par.edp_size(), par.edp_rank(),
                           bucket_floats);
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
        bucket_floats = kDefaultBucketFloats;
        size_t dense = 0, expert = 0;
        for (const Segment& s : make_segments(layout))
            (s.expert ? expert : dense) += s.end - s.begin;
        spaces = {{dense, world_size}, {expert, edp_size}};
    }
    size_t floats = 0;
    for (const auto& [n, P] : spaces) {
        const ShardGeometry g = shard_geometry(n, P, bucket_floats);
        floats += g.nb * g.q;
    }
    return floats;
}

size_t paro_bucket_floats(const TrainConfig& cfg, int ranks) {
    return std::max(cfg.bucket_floats(), static_cast<size_t>(ranks) * kMinPieceFloats);
}

}  // namespace bagualu::dist::paro

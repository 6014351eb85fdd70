// ParO's spaces from the layout alone (no state, no communication): which runs of the flat
// parameter array each space holds, the shard maps of one rank, and the sizes `bagualu plan`
// predicts (optimizer footprint, checkpoint pieces, bucket target). A space of float32 tensors
// and one of half-stored tensors (mixed precision) for dense parameters (split over the world)
// and for experts (split over the edp group).
#pragma once
#include <cstddef>
#include <vector>

#include "config/config.h"
#include "core/dtype.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "dist/paro/shard_map.h"
#include "model/param_layout.h"
#include "model/precision.h"

namespace bagualu::dist::paro {

// ParO's default bucket target, 4 MiB: small enough that a model of a few million parameters
// per rank has several buckets to reduce while backward still runs.
inline constexpr size_t kDefaultBucketFloats = size_t{1} << 20;

// The two spaces of a layout: [0] dense tensors split over the world, [1] experts over the edp
// group (the ranks holding the same experts).
std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, dist::ParallelContext& par,
                                      size_t bucket_floats);
std::vector<ShardMap> make_space_maps(const model::ParamLayout& layout, int world_size,
                                      int world_rank, int edp_size, int edp_rank,
                                      size_t bucket_floats);

// ParO's spaces as PartitionedAdamW builds them on one rank, without state or communication:
// [dense, expert] of float32 tensors, then [dense, expert] of half-stored ones when the policy
// has any. Dense spaces are split over the world, expert spaces over the edp group.
struct ParoSpace {
    ShardMap map;
    bool expert = false;
    Dtype dtype = Dtype::float32;  // storage dtype of every tensor in the space
    bool master = false;           // some piece of this rank's shard keeps an FP32 master
};
std::vector<ParoSpace> paro_spaces(const model::ParamLayout& layout,
                                   const model::PrecisionPolicy& prec, int world_size,
                                   int world_rank, int edp_size, int edp_rank,
                                   size_t bucket_floats);

// What the optimizer make_optimizer builds holds on a rank, computed without building it or its
// maps (bagualu plan): equal to its footprint() (tests/mpi). Under ParO the shard sizes are the
// same on every rank; a space's master shard is counted when the space holds an O2 tensor (a
// rank whose shard of it is all padding has none).
MemoryFootprint optimizer_footprint(const model::ParamLayout& layout,
                                    const model::PrecisionPolicy& prec, bool partitioned,
                                    int world_size, int edp_size,
                                    size_t bucket_floats = kDefaultBucketFloats);

// The shard floats of the optimizer's state spaces (Optimizer::state_spaces()), an upper bound
// of any rank's pieces (less than 16 floats per tensor above rank 0's): a checkpoint snapshot
// holds three times the pieces (master, m, v; train/checkpointing.h). bucket_floats is ParO's;
// the replicated optimizer's maps always use the default.
size_t state_piece_floats(const model::ParamLayout& layout, const model::PrecisionPolicy& prec,
                          bool partitioned, int world_size, int edp_size,
                          size_t bucket_floats = kDefaultBucketFloats);

// ParO's bucket target on `ranks` ranks: parallel.bucket_mib, but at least kMinPieceFloats for
// each rank. Every bucket is a reduce-scatter and an all-gather over all the ranks of its space,
// whose latency grows with them; a fixed size would shrink to a few floats per rank at scale
// (4 MiB over 96,000 ranks is 11 floats each) and make the step latency-bound.
inline constexpr size_t kMinPieceFloats = 1024;  // 4 KiB per rank
size_t paro_bucket_floats(const TrainConfig& cfg, int ranks);

}  // namespace bagualu::dist::paro

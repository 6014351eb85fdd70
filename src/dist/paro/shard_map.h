// Bookkeeping of ParO (docs/parallelism.md): which floats of the optimizer state a rank owns,
// which tensor elements they are, and how gradients and parameters travel in buckets. A space
// (the concatenation of some runs of the flat parameter array) of n floats is padded to NB*P*q
// and cut into NB buckets of P*q consecutive floats; rank r owns the r-th q floats of every
// bucket, and its shard (S = NB*q floats) is those pieces in bucket order. A reduce-scatter of
// bucket b hands each rank piece b of its own shard. Buckets are contiguous in the space, so the
// late layers' buckets are complete first in backward (reduction overlap, docs/parallelism.md).
// No communication and no arithmetic here (partitioned_adamw.cpp does both).
#pragma once
#include <cstddef>
#include <vector>

#include "model/param_layout.h"

namespace bagualu::dist::paro {

// Floats [begin, end) of the flat parameter (and gradient) array.
struct FlatRun {
    size_t begin = 0, end = 0;
};

// One tensor's part of a shard: shard floats [shard_offset, shard_offset + len) are the
// elements [elem_offset, elem_offset + len) of tensor `spec`, which sit at flat floats
// [flat_offset, flat_offset + len). Tensor padding is in no piece.
struct ShardPiece {
    size_t spec         = 0;  // index into ParamLayout::specs()
    size_t elem_offset  = 0;
    size_t flat_offset  = 0;
    size_t shard_offset = 0;
    size_t len          = 0;
    bool decay          = false;  // ParamSpec::decay of the tensor
};

// A copy between a bucket buffer and the flat array; the owner's piece of the bucket is
// [owner * q, (owner + 1) * q).
struct BucketCopy {
    size_t buf_offset  = 0;
    size_t flat_offset = 0;
    size_t len         = 0;
    int owner          = 0;
};

// The bucket geometry of a space of n floats over `ranks` ranks with a bucket target of
// bucket_floats (docs/parallelism.md): q floats per rank per bucket, NB buckets. ShardMap cuts
// its space so, and `bagualu plan` counts ParO's calls and payloads with it.
struct ShardGeometry {
    size_t q  = 0;  // piece: floats per rank per bucket, a multiple of 16
    size_t nb = 0;  // buckets
};
ShardGeometry shard_geometry(size_t n, int ranks, size_t bucket_floats);

class ShardMap {
   public:
    // runs: the flat ranges forming the space, in order, each within the layout's array.
    // ranks, rank: the group the space is split over. bucket_floats: the most floats one
    // bucket (all ranks' pieces together) should hold, before rounding up to 16 per piece:
    // q = 16 * ceil(ceil(n / (P * ceil(n / bucket_floats))) / 16), NB = ceil(n / (P * q)).
    ShardMap(std::vector<FlatRun> runs, const model::ParamLayout& layout, int ranks, int rank,
             size_t bucket_floats);

    int ranks() const { return ranks_; }
    int rank() const { return rank_; }
    size_t numel() const { return n_; }         // n: floats in the space, tensor padding included
    size_t shard_size() const { return S_; }    // S: floats per rank, a multiple of 16
    size_t num_buckets() const { return nb_; }  // NB; every bucket holds some of the space
    size_t piece_size() const { return q_; }    // q = S / NB, a multiple of 16
    size_t bucket_size() const { return q_ * static_cast<size_t>(ranks_); }
    const std::vector<FlatRun>& runs() const { return runs_; }
    const std::vector<ShardPiece>& pieces() const { return pieces_; }  // this rank's, in order
    const std::vector<BucketCopy>& copies(size_t b) const { return copies_[b]; }
    // The lowest flat float bucket b reads or writes: its gradients are final once backward has
    // finished every float from there to the end of the array.
    size_t first_flat(size_t b) const { return copies_[b].front().flat_offset; }

    // buf: (bucket_size()). Every rank's piece of bucket b from flat; virtual padding = 0.
    void pack(size_t b, const float* flat, float* buf) const;
    // Only this rank's piece of bucket b, to buf[rank * q, (rank + 1) * q).
    void pack_own(size_t b, const float* flat, float* buf) const;
    // buf's pieces back to flat: this rank's only (own = true) or every other rank's.
    void unpack(size_t b, const float* buf, float* flat, bool own) const;

   private:
    std::vector<FlatRun> runs_;
    int ranks_ = 1, rank_ = 0;
    size_t n_ = 0, S_ = 0, nb_ = 0, q_ = 0;
    std::vector<ShardPiece> pieces_;               // [pieces of this rank's shard]
    std::vector<std::vector<BucketCopy>> copies_;  // [NB][copies, all owners]
};

}  // namespace bagualu::dist::paro

// The training data loader: this rank's micro-batch of every micro-step, prefetched.
// Global order: micro-step k of a step takes the next total(k) windows of the sampler (sampler.h)
// over all windows of data.train (token_shards.h); rank r trains on windows [offset(r, k),
// offset(r, k) + rows(r, k)) of them, the split of the step's batch over ranks and micro-steps
// (config/batch_split.h). Results are therefore the same for any P with the same global batch.
// With data.blend the windows come from several splits in fixed proportions (sampler.h, "blends"):
// the global order interleaves them, and the cursor holds each split's position and the deficits.
// Readers (data.readers = N > 0): the P ranks form N contiguous groups (reader_group); only the
// first rank of each group opens the train files; it reads the whole group's windows and
// scatters each member its slice over the group's communicator (slices padded to the largest
// micro-batch when the split is uneven). N = 0: every rank reads its own slice from the files.
// Prefetch: while step s runs, the helper thread (core/helper_thread.h) copies the windows of the
// next micro-batch from the files into the other half of a double buffer. MPI stays on
// the main thread: the trainer's own collectives run there while the prefetch is in flight, and
// MPI is initialised with at most one thread at a time. In a reader group, next() starts the
// nonblocking scatter of the following micro-batch (Comm::scatter_start), which completes while
// the step runs; the next next() waits for it.
// cursor() is the position of the next micro-batch next() will return, whatever is prefetched,
// so a checkpoint taken after step s resumes at step s + 1's batch (the cursor is only set at
// a step's start: set_cursor restarts at micro-step 0).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/helper_thread.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "dist/comm/comm.h"
#include "dist/parallel.h"

namespace bagualu::data {

// Which reader group a rank is in: N groups of contiguous ranks, group g = ranks
// [g P / N, (g + 1) P / N); its reader is its first rank. readers = 0: every rank alone.
struct ReaderGroup {
    int index = 0;  // g
    int first = 0;  // the reader's rank
    int size  = 1;  // ranks in the group
};
ReaderGroup reader_group(int rank, int ranks, int readers);

struct LoaderLayout {
    int rank        = 0;
    int ranks       = 1;
    int readers     = 0;  // data.readers resolved: 0 = every rank reads
    int micro_batch = 1;  // the cap of a micro-batch (train.micro_batch_size; > 0)
    int seq_len     = 1;  // T
    uint64_t seed   = 0;
    int64_t batch   = 0;  // sequences a step over all ranks (0: micro_batch x ranks)
    // The order's kind; unset: shuffle_kind_for(windows) (sampler.h). Set by tests only.
    std::optional<ShuffleKind> shuffle;
};

class DataLoader {
   public:
    // Collective over par.world(): the readers open data.train or the splits of data.blend,
    // rank 0 alone reads their token ids (token_shards.h), and a failure on any rank ends every
    // rank with the lowest failing rank's one line (dist/comm/checks.h: with one process an
    // InputError). Then, with data.readers > 0, the group split and the reader's window counts.
    DataLoader(const TrainConfig& cfg, dist::ParallelContext& par);
    // The same from parts: `train` is opened by the caller (only on readers); `group` is the
    // reader group's communicator (nullptr when the group is one rank). Collective over group.
    DataLoader(const LoaderLayout& layout, TokenShards train, dist::Comm* group);
    // A blend: `sources` (opened on readers only; empty elsewhere) in proportions `weights`
    // (one per source, > 0; empty: one source).
    DataLoader(const LoaderLayout& layout, std::vector<TokenShards> sources,
               const std::vector<double>& weights, dist::Comm* group);
    ~DataLoader();
    DataLoader(const DataLoader&)            = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    // This rank's next micro-batch: inputs and targets (rows, T), rows <= max_rows(); returns
    // rows. Collective over the group.
    int next(int32_t* inputs, int32_t* targets);
    int max_rows() const { return static_cast<int>(split_.max_rows()); }
    // The position in the global order of the next micro-batch next() returns.
    const OrderCursor& cursor() const { return cursor_; }
    // Resumes at c (a cursor() of a run with the same data, seed and global batch; each source's
    // position within its windows, one deficit a source in a blend, else InputError).
    // Collective over the group once next() has been called (it completes the scatter in
    // flight).
    void set_cursor(const OrderCursor& c);
    // The cursor of a fresh order.
    OrderCursor start_cursor() const { return schedule_.start(); }

    int num_sources() const { return schedule_.sources(); }
    bool blended() const { return !cursor_.deficits.empty(); }
    // Reader ranks (data.readers resolved): 0 = every rank reads its own slice.
    int readers() const { return L_.readers; }
    double share(int s) const { return schedule_.share(s); }
    int64_t num_windows() const { return n_windows_; }  // over all sources
    int64_t source_windows(int s) const { return windows_[static_cast<size_t>(s)]; }
    ShuffleKind shuffle_kind(int s = 0) const {
        return L_.shuffle.value_or(shuffle_kind_for(windows_[static_cast<size_t>(s)]));
    }
    int64_t num_tokens() const { return n_tokens_; }  // 0 on a rank that does not read
    bool reads() const { return reader_; }            // whether this rank opens the files
    // Seconds next() has blocked on data so far: waiting for the prefetch and, in a reader
    // group, for the scatter to complete.
    double wait_seconds() const { return wait_s_; }

   private:
    // Both constructors end here: shares the reader's window counts over the group (a reader
    // that could not open its splits has ended every rank before).
    void init(dist::Comm* group);
    void fetch();         // helper thread: the group's windows of one micro-step into buf_[fill_]
    void start_fetch();   // main thread
    void finish_fetch();  // main thread: waits for the pending fetch
    // Reader: the fetched micro-batch (fetching it now if none is pending); starts fetching the
    // next one into the other buffer.
    const int32_t* take_fetched();
    void start_scatter();          // group: the next micro-batch's scatter
    void skip_windows(int64_t n);  // helper thread: passes over n windows of the order
    void unpack(const int32_t* windows, int rows, int32_t* inputs, int32_t* targets) const;

    LoaderLayout L_;
    BatchSplit split_;
    ReaderGroup group_info_;
    std::unique_ptr<dist::Comm> owned_group_;
    dist::Comm* group_ = nullptr;  // null when the group is this rank alone
    bool reader_       = true;
    std::vector<TokenShards> sources_;  // readers: one per source
    BlendSchedule schedule_;
    std::vector<int64_t> windows_;  // [sources]
    int64_t n_windows_ = 0;
    int64_t n_tokens_  = 0;
    // readers: the fetch position (helper thread), each source's and the deficits
    std::vector<std::unique_ptr<SequenceSampler>> samplers_;
    std::vector<double> fetch_deficits_;
    OrderCursor cursor_;               // the visible position (main thread)
    size_t window_ints_ = 0;           // max_rows() * (T + 1): one rank's slot
    int64_t fetch_k_    = 0;           // micro-step of the next fetch (helper thread)
    int64_t next_k_     = 0;           // micro-step of the next next() (main thread)
    std::vector<int32_t> buf_[2];      // [group size * window_ints_]: windows read
    std::vector<int32_t> recv_;        // [window_ints_]: this rank's, scattered
    int fill_                    = 0;  // buffer the pending fetch writes
    bool pending_                = false;
    bool in_flight_              = false;  // group: a scatter_start not yet waited for
    HelperThread::Ticket ticket_ = 0;
    std::function<void()> fetch_fn_;
    double wait_s_ = 0;
};

}  // namespace bagualu::data

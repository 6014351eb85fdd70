#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

#include "core/error.h"
#include "dist/comm/checks.h"

namespace bagualu::data {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

LoaderLayout layout_of(const TrainConfig& cfg, const dist::ParallelContext& par) {
    LoaderLayout L;
    L.rank        = par.rank();
    L.ranks       = par.size();
    L.readers     = cfg.data.readers.resolve(par.consecutive_nodes());
    L.micro_batch = static_cast<int>(cfg.micro_batch(par.size()));
    L.seq_len     = cfg.model.seq_len;
    L.seed        = cfg.train.seed;
    L.batch       = cfg.train.batch_size;
    return L;
}

}  // namespace

ReaderGroup reader_group(int rank, int ranks, int readers) {
    BGL_CHECK(rank >= 0 && rank < ranks && readers >= 0 && readers <= ranks,
              "rank {} of {} with {} readers", rank, ranks, readers);
    if (readers == 0) return ReaderGroup{rank, rank, 1};
    const auto first = [&](int g) {
        return static_cast<int>(static_cast<int64_t>(g) * ranks / readers);
    };
    int g = static_cast<int>(static_cast<int64_t>(rank) * readers / ranks);
    while (first(g + 1) <= rank) ++g;  // the last g with first(g) <= rank
    while (first(g) > rank) --g;
    return ReaderGroup{g, first(g), first(g + 1) - first(g)};
}

static std::vector<TokenShards> one_source(TokenShards train) {
    std::vector<TokenShards> v;
    v.push_back(std::move(train));
    return v;
}

DataLoader::DataLoader(const TrainConfig& cfg, dist::ParallelContext& par)
    : L_(layout_of(cfg, par)), schedule_(cfg.data.blend_weights) {
    group_info_ = reader_group(L_.rank, L_.ranks, L_.readers);
    reader_     = group_info_.first == L_.rank;
    if (L_.readers > 0) {
        // Collective over the world even when every group is one rank.
        owned_group_ = par.world().split(group_info_.index, L_.rank);
    }
    // Every reader opens the files and checks their headers; rank 0 (always a reader) alone reads
    // their token ids (a split of up to kScanAllTokens whole), and every rank ends with its
    // verdict: the ids are the same for all, and P readers reading them would read the data P
    // times before the first step.
    const bool check_ids = par.rank() == 0;
    dist::check_together(par.world(), [&] {
        if (!reader_) return;
        const std::vector<std::string> splits = cfg.data.train_splits();
        for (size_t i = 0; i < splits.size(); ++i) {
            const std::string key =
                cfg.data.blend.empty() ? "data.train" : fmt::format("data.blend[{}]", i);
            sources_.push_back(
                TokenShards::open(splits[i], key, cfg.model.vocab_size, L_.seq_len, check_ids));
        }
    });
    init(group_info_.size > 1 ? owned_group_.get() : nullptr);
}

DataLoader::DataLoader(const LoaderLayout& layout, TokenShards train, dist::Comm* group)
    : DataLoader(layout, one_source(std::move(train)), {}, group) {}

DataLoader::DataLoader(const LoaderLayout& layout, std::vector<TokenShards> sources,
                       const std::vector<double>& weights, dist::Comm* group)
    : L_(layout), sources_(std::move(sources)), schedule_(weights) {
    group_info_ = reader_group(L_.rank, L_.ranks, L_.readers);
    reader_     = group_info_.first == L_.rank;
    BGL_CHECK((group != nullptr) == (group_info_.size > 1) &&
                  (!group || group->size() == group_info_.size),
              "rank {}: a reader group of {} needs a communicator of that size", L_.rank,
              group_info_.size);
    init(group);
}

void DataLoader::init(dist::Comm* group) {
    group_       = group;
    const auto S = static_cast<size_t>(schedule_.sources());
    // the reader's window counts (its splits are open: a failure ended every rank before)
    windows_.assign(S, -1);
    if (reader_) {
        BGL_CHECK(sources_.size() == S, "rank {}: {} splits opened for {} sources", L_.rank,
                  sources_.size(), S);
        for (size_t s = 0; s < S; ++s) {
            windows_[s] = sources_[s].num_windows();
            n_tokens_ += sources_[s].num_tokens();
        }
    }
    if (group_) group_->broadcast(windows_.data(), S * sizeof(int64_t), 0);
    for (const int64_t w : windows_) {
        BGL_CHECK(w > 0, "rank {}: a split of the training data holds no window", L_.rank);
        n_windows_ += w;
    }
    cursor_ = schedule_.start();
    split_  = BatchSplit(L_.batch > 0 ? L_.batch : int64_t{L_.micro_batch} * L_.ranks, L_.ranks,
                        L_.micro_batch);
    BGL_CHECK(!split_.has_empty(), "rank {}: an empty micro-batch in the split of {} over {}",
              L_.rank, split_.batch(), L_.ranks);
    if (split_.batch() > n_windows_) {
        // every step would hold some window twice, and a huge batch would run for ever
        input_error(
            "train.batch_size = {} sequences a step exceeds the {} windows of {} tokens that "
            "data.train holds: lower train.batch_size or use more data",
            split_.batch(), n_windows_, L_.seq_len + 1);
    }
    window_ints_ = static_cast<size_t>(split_.max_rows()) * static_cast<size_t>(L_.seq_len + 1);
    if (reader_) {
        for (size_t s = 0; s < S; ++s) {
            samplers_.push_back(std::make_unique<SequenceSampler>(
                windows_[s], source_seed(L_.seed, static_cast<int>(s)),
                shuffle_kind(static_cast<int>(s))));
        }
        fetch_deficits_ = cursor_.deficits;
        for (auto& b : buf_) b.resize(window_ints_ * static_cast<size_t>(group_info_.size));
        fetch_fn_ = [this] { fetch(); };
    }
    if (group_) recv_.resize(window_ints_);
}

DataLoader::~DataLoader() {
    try {
        if (in_flight_ && std::uncaught_exceptions() == 0) {
            group_->scatter_wait();  // the whole group ends its run together
            in_flight_ = false;
        }
        finish_fetch();
    } catch (...) {  // a failed prefetch or scatter no one will read
    }
    if (in_flight_) {
        // Unwinding on this rank alone: the scatter may still write, so its buffers stay
        // allocated (the job is ending).
        static_cast<void>(new std::vector<int32_t>(std::move(recv_)));
        for (auto& b : buf_) static_cast<void>(new std::vector<int32_t>(std::move(b)));
    }
}

void DataLoader::fetch() {
    const int64_t W = L_.seq_len + 1, k = fetch_k_;
    const int first = group_info_.first, end = first + group_info_.size;
    fetch_k_ = (k + 1) % split_.steps();
    skip_windows(split_.offset(first, k));
    for (int q = first; q < end; ++q) {
        int32_t* out = buf_[fill_].data() + static_cast<size_t>(q - first) * window_ints_;
        for (int64_t i = 0; i < split_.rows(q, k); ++i) {
            const auto s = static_cast<size_t>(schedule_.next(fetch_deficits_));
            sources_[s].read_window(samplers_[s]->next(), out + i * W);
        }
    }
    skip_windows(split_.total(k) - split_.offset(end, k));
}

void DataLoader::skip_windows(int64_t n) {
    if (samplers_.size() == 1) {
        samplers_[0]->skip(n);
        return;
    }
    std::vector<int64_t> taken(samplers_.size(), 0);
    for (int64_t i = 0; i < n; ++i) ++taken[static_cast<size_t>(schedule_.next(fetch_deficits_))];
    for (size_t s = 0; s < samplers_.size(); ++s) samplers_[s]->skip(taken[s]);
}

void DataLoader::start_fetch() {
    BGL_CHECK(!pending_, "a fetch is already pending");
    ticket_  = helper_thread().submit(fetch_fn_);
    pending_ = true;
}

void DataLoader::finish_fetch() {
    if (!pending_) return;
    pending_ = false;
    helper_thread().wait(ticket_);
}

const int32_t* DataLoader::take_fetched() {
    if (!pending_) start_fetch();  // the first batch, or the first after set_cursor
    const auto t0 = Clock::now();
    finish_fetch();
    wait_s_ += seconds_since(t0);
    const int32_t* out = buf_[fill_].data();
    fill_              = 1 - fill_;
    start_fetch();  // the next micro-batch, into the other buffer, while this one is used
    return out;
}

void DataLoader::start_scatter() {
    const int32_t* send = reader_ ? take_fetched() : nullptr;
    group_->scatter_start(send, window_ints_ * sizeof(int32_t), recv_.data(), 0);
    in_flight_ = true;
}

void DataLoader::unpack(const int32_t* windows, int rows, int32_t* inputs, int32_t* targets) const {
    const int T = L_.seq_len;
    for (int b = 0; b < rows; ++b) {
        const int32_t* w = windows + static_cast<int64_t>(b) * (T + 1);
        std::copy(w, w + T, inputs + static_cast<int64_t>(b) * T);
        std::copy(w + 1, w + 1 + T, targets + static_cast<int64_t>(b) * T);
    }
}

int DataLoader::next(int32_t* inputs, int32_t* targets) {
    const int64_t k = next_k_;
    const int rows  = static_cast<int>(split_.rows(L_.rank, k));
    next_k_         = (k + 1) % split_.steps();
    if (group_) {
        if (!in_flight_) start_scatter();  // the first batch, or the first after set_cursor
        const auto t0 = Clock::now();
        group_->scatter_wait();
        in_flight_ = false;
        wait_s_ += seconds_since(t0);
        unpack(recv_.data(), rows, inputs, targets);
        start_scatter();  // the next micro-batch travels while this one is trained on
    } else {
        unpack(take_fetched(), rows, inputs, targets);
    }
    cursor_ = schedule_.advance(cursor_, windows_, split_.total(k));
    return rows;
}

void DataLoader::set_cursor(const OrderCursor& c) {
    if (c.sources.size() != windows_.size() || c.deficits.size() != cursor_.deficits.size()) {
        input_error("a data cursor of {} splits and {} deficits for a run reading {} split(s)",
                    c.sources.size(), c.deficits.size(), windows_.size());
    }
    for (size_t s = 0; s < windows_.size(); ++s) {
        const SamplerCursor& sc = c.sources[s];
        if (sc.epoch < 0 || sc.position < 0 || sc.position > windows_[s]) {
            input_error("data cursor (epoch {}, position {}) does not fit the {} windows of {}",
                        sc.epoch, sc.position, windows_[s],
                        blended() ? fmt::format("data.blend[{}]", s) : std::string("data.train"));
        }
    }
    for (const double d : c.deficits) {
        if (!std::isfinite(d) || std::abs(d) > static_cast<double>(windows_.size())) {
            input_error("data cursor: a blend deficit of {} (expected a number within +-{})", d,
                        windows_.size());
        }
    }
    if (in_flight_) {  // its windows belong to the old position
        group_->scatter_wait();
        in_flight_ = false;
    }
    finish_fetch();
    cursor_  = c;
    fetch_k_ = next_k_ = 0;
    for (size_t s = 0; s < samplers_.size(); ++s) samplers_[s]->set_cursor(c.sources[s]);
    if (reader_) fetch_deficits_ = c.deficits;
}

}  // namespace bagualu::data

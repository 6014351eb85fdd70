// The data loader over token shards read with pread: shard resolution and window numbering (uneven
// shards, windows never crossing a file), the reader groups, and the global order: for P = 1..8
// simulated ranks, rank r's micro-batch k is windows [k MB P + r MB, ... + MB) of the one-rank
// sampler, so every rank gets distinct windows, each epoch is covered exactly once, and epoch
// boundaries may fall inside a micro-step. Resuming from cursor() replays the same batches
// whatever the prefetch had read ahead.
#include "data/loader.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::TempDir;

constexpr int kT = 4;

// Shards of these token counts; token values count up across all files, so the first token of
// a window names it. Windows: 5 + 0 + 14 + 2 + 7 = 28. The third file is uint32 (version 2).
const std::vector<int> kShardTokens = {23, 4, 57, 10, 31};
constexpr int kVocab                = 200000;

std::string write_shards(const TempDir& dir) {
    std::filesystem::create_directories(dir.path("shards"));
    int next = 0;
    for (size_t i = 0; i < kShardTokens.size(); ++i) {
        std::vector<int32_t> t(static_cast<size_t>(kShardTokens[i]));
        std::iota(t.begin(), t.end(), next);
        next += kShardTokens[i];
        write_token_file(dir.path(fmt::format("shards/part_{:02}.bin", i)), t,
                         i == 2 ? kVocab : 65536);
    }
    return dir.path("shards");
}

TEST(TokenShards, UnevenShardsNumberWindowsWithinFiles) {
    TempDir dir;
    const std::string root = write_shards(dir);
    dir.write("shards/notes.txt", "not a shard");
    for (const std::string& spec : {root, root + "/part_*.bin"}) {
        const TokenShards s = TokenShards::open(spec, "data.train", kVocab, kT);
        ASSERT_EQ(s.num_shards(), kShardTokens.size()) << spec;
        EXPECT_EQ(s.num_tokens(), 23 + 4 + 57 + 10 + 31);
        ASSERT_EQ(s.num_windows(), 28);
        // Every window lies inside one file: T + 1 consecutive values starting at a multiple
        // of T within its file.
        std::vector<int32_t> w(kT + 1);
        int64_t id     = 0;
        int file_start = 0;
        for (const int n : kShardTokens) {
            for (int k = 0; k < (n - 1) / kT; ++k, ++id) {
                s.read_window(id, w.data());
                for (int i = 0; i <= kT; ++i) ASSERT_EQ(w[i], file_start + k * kT + i) << id;
            }
            file_start += n;
        }
    }
}

TEST(TokenShards, ErrorsNameTheFileOrTheSpec) {
    TempDir dir;
    const std::string root = write_shards(dir);
    expect_input_error([&] { TokenShards::open(root + "/x_*.bin", "data.train", kVocab, kT); },
                       {"data.train", "x_*.bin", "matches no file"});
    std::filesystem::create_directories(dir.path("empty"));
    expect_input_error([&] { TokenShards::open(dir.path("empty"), "data.val", kVocab, kT); },
                       {"data.val", "no .bin file"});
    // part_02 holds ids 27..83, part_03 84..93.
    expect_input_error([&] { TokenShards::open(root, "data.train", 60, kT); },
                       {"part_02.bin", "token 60", ">= vocab_size 60"});
    expect_input_error([&] { TokenShards::open(root, "data.train", 84, kT); },
                       {"part_03.bin", "token 84", "position 0"});
    expect_input_error([&] { TokenShards::open(root + "/part_01.bin", "data.train", kVocab, kT); },
                       {"part_01.bin", "seq_len + 1"});
    dir.write("bad/a.bin", std::string(2000, 'x'));
    expect_input_error([&] { TokenShards::open(dir.path("bad"), "data.train", kVocab, kT); },
                       {"a.bin", "magic"});
}

// A shard changed after open: each window is checked as it is read. part_00 (uint16) holds
// windows 0-4 and part_02 (uint32) windows 5-18; part_02's tokens 27..83 start at byte 1024.
TEST(TokenShards, WindowsOfAFileChangedAfterOpenAreCheckedAsTheyAreRead) {
    TempDir dir;
    const std::string root = write_shards(dir);
    const TokenShards s    = TokenShards::open(root, "data.train", kVocab, kT);
    std::vector<int32_t> w(kT + 1);
    {
        std::fstream f(root + "/part_02.bin", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(kTokenFileHeaderBytes + 4 * 9);  // token 9 of part_02: window 7's second token
        const uint32_t bad = 0xFFFFFFFFu;
        f.write(reinterpret_cast<const char*>(&bad), 4);
    }
    s.read_window(6, w.data());  // untouched windows still read
    EXPECT_EQ(w[0], 27 + 4);
    expect_input_error([&] { s.read_window(7, w.data()); },
                       {"part_02.bin", "token 4294967295", "position 9", "changed"});
    std::filesystem::resize_file(root + "/part_00.bin", kTokenFileHeaderBytes + 2 * 10);
    s.read_window(1, w.data());  // tokens 4..8: still there
    expect_input_error([&] { s.read_window(2, w.data()); }, {"part_00.bin", "truncated"});
}

TEST(TokenShards, FilesThatAreNotRegularAreRefused) {
    TempDir dir;
    ASSERT_EQ(::mkfifo(dir.path("fifo.bin").c_str(), 0600), 0);
    expect_input_error([&] { TokenShards::open(dir.path("fifo.bin"), "data.train", kVocab, kT); },
                       {"fifo.bin", "a FIFO"});
    expect_input_error([&] { TokenShards::open("/dev/null", "data.train", kVocab, kT); },
                       {"/dev/null", "a character device"});
}

TEST(ReaderGroups, ContiguousGroupsLedByTheirFirstRank) {
    for (int P = 1; P <= 9; ++P) {
        for (int r = 0; r < P; ++r) {
            const ReaderGroup g = reader_group(r, P, 0);
            EXPECT_EQ(g.first, r);
            EXPECT_EQ(g.size, 1);
        }
        for (int N = 1; N <= P; ++N) {
            int groups = 0;
            for (int r = 0; r < P; ++r) {
                const ReaderGroup g = reader_group(r, P, N);
                EXPECT_TRUE(g.size == P / N || g.size == P / N + 1) << P << " " << N;
                EXPECT_TRUE(g.first <= r && r < g.first + g.size) << P << " " << N << " " << r;
                if (r == 0) {
                    EXPECT_EQ(g.first, 0);
                } else {
                    const ReaderGroup prev = reader_group(r - 1, P, N);
                    if (g.first == r) {  // a new group right after the previous one
                        EXPECT_EQ(prev.first + prev.size, r);
                        EXPECT_EQ(g.index, prev.index + 1);
                    } else {
                        EXPECT_EQ(g.first, prev.first);
                        EXPECT_EQ(g.index, prev.index);
                    }
                }
                if (g.first == r) ++groups;
            }
            EXPECT_EQ(groups, N) << P << " ranks, " << N << " readers";
        }
    }
}

TEST(ReaderGroups, ReadersBeyondRanksAreRejected) {
    TrainConfig c;
    c.train.batch_size       = 8;
    c.train.micro_batch_size = 0;
    c.data.readers           = 2;
    EXPECT_NO_THROW(validate_layout(c, 2));
    c.data.readers = 3;
    expect_input_error([&] { validate_layout(c, 2); }, {"data.readers = 3", "ranks 2"});
}

TEST(DataLoader, RanksSliceTheGlobalOrderAndCoverEachEpoch) {
    TempDir dir;
    const std::string root  = write_shards(dir);
    const TokenShards ref   = TokenShards::open(root, "data.train", kVocab, kT);
    const int64_t n         = ref.num_windows();
    constexpr int MB        = 3;
    constexpr uint64_t seed = 7;
    std::vector<int32_t> w(kT + 1);
    for (int P = 1; P <= 8; ++P) {
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < P; ++r) {
            ranks.push_back(std::make_unique<DataLoader>(
                LoaderLayout{r, P, 0, MB, kT, seed},
                TokenShards::open(root, "data.train", kVocab, kT), nullptr));
        }
        SequenceSampler order(n, seed);  // the one-rank order
        std::vector<int32_t> in(static_cast<size_t>(MB) * kT), tg(in.size());
        std::vector<int64_t> taken;                    // window ids in global order
        const int64_t steps = (2 * n) / (MB * P) + 2;  // past two epoch boundaries
        for (int64_t k = 0; k < steps; ++k) {
            for (int r = 0; r < P; ++r) {
                ranks[static_cast<size_t>(r)]->next(in.data(), tg.data());
                for (int b = 0; b < MB; ++b) {
                    const int64_t id = order.next();
                    taken.push_back(id);
                    ref.read_window(id, w.data());
                    for (int i = 0; i < kT; ++i) {
                        ASSERT_EQ(in[static_cast<size_t>(b * kT + i)], w[i]) << P << " " << k;
                        ASSERT_EQ(tg[static_cast<size_t>(b * kT + i)], w[i + 1]) << P << " " << k;
                    }
                }
            }
            const SamplerCursor c = advance_cursor({}, n, (k + 1) * MB * P);
            for (const auto& l : ranks) EXPECT_EQ(l->cursor(), c);
        }
        // Each epoch of the global order is a permutation of all windows: within an epoch no two
        // ranks (or micro-steps) share a window.
        for (int e = 0; e < 2; ++e) {
            const std::set<int64_t> ids(taken.begin() + e * n, taken.begin() + (e + 1) * n);
            EXPECT_EQ(static_cast<int64_t>(ids.size()), n) << P << " ranks, epoch " << e;
        }
    }
}

// A batch that the ranks do not divide (config/batch_split.h): rank r's micro-step k is rows(r, k)
// windows at offset(r, k) of the micro-step's total(k), so the ranks together still read the
// one-rank order, and the cursor moves by the whole batch each step.
TEST(DataLoader, UnevenSplitsSliceTheGlobalOrder) {
    TempDir dir;
    const std::string root  = write_shards(dir);
    const TokenShards ref   = TokenShards::open(root, "data.train", kVocab, kT);
    const int64_t n         = ref.num_windows();
    constexpr uint64_t seed = 3;
    std::vector<int32_t> w(kT + 1);
    for (const int B : {7, 10, 16}) {
        for (int P = 1; P <= 8 && P <= B; ++P) {
            for (const int cap : {1, 2, 3, 16}) {
                const BatchSplit split(B, P, cap);
                if (split.has_empty()) continue;
                std::vector<std::unique_ptr<DataLoader>> ranks;
                for (int r = 0; r < P; ++r) {
                    ranks.push_back(std::make_unique<DataLoader>(
                        LoaderLayout{r, P, 0, cap, kT, seed, B},
                        TokenShards::open(root, "data.train", kVocab, kT), nullptr));
                    ASSERT_EQ(ranks.back()->max_rows(), split.max_rows());
                }
                SequenceSampler order(n, seed);
                std::vector<int32_t> in(static_cast<size_t>(split.max_rows()) * kT), tg(in.size());
                for (int64_t step = 0; step < 3; ++step) {
                    for (int64_t k = 0; k < split.steps(); ++k) {
                        for (int r = 0; r < P; ++r) {
                            const int rows =
                                ranks[static_cast<size_t>(r)]->next(in.data(), tg.data());
                            ASSERT_EQ(rows, split.rows(r, k)) << B << " " << P << " " << cap;
                            for (int b = 0; b < rows; ++b) {
                                ref.read_window(order.next(), w.data());
                                for (int i = 0; i < kT; ++i) {
                                    ASSERT_EQ(in[static_cast<size_t>(b * kT + i)], w[i])
                                        << B << " " << P << " " << cap << " step " << step;
                                    ASSERT_EQ(tg[static_cast<size_t>(b * kT + i)], w[i + 1]);
                                }
                            }
                        }
                    }
                    const SamplerCursor c = advance_cursor({}, n, (step + 1) * B);
                    for (const auto& l : ranks) EXPECT_EQ(l->cursor(), c);
                }
            }
        }
    }
}

TEST(DataLoader, ResumesAtTheCursorWhateverWasPrefetched) {
    TempDir dir;
    const std::string root = write_shards(dir);
    constexpr int P = 3, MB = 2;
    const auto make = [&](int r) {
        return std::make_unique<DataLoader>(LoaderLayout{r, P, 0, MB, kT, 11},
                                            TokenShards::open(root, "data.train", kVocab, kT),
                                            nullptr);
    };
    std::vector<int32_t> in(static_cast<size_t>(MB) * kT), tg(in.size()), in2(in.size()),
        tg2(in.size());
    for (int r = 0; r < P; ++r) {
        auto a = make(r);
        for (int k = 0; k < 9; ++k) a->next(in.data(), tg.data());  // 54 windows: epoch 1
        const SamplerCursor c = a->cursor();
        EXPECT_EQ(c, advance_cursor({}, 28, 9 * MB * P));
        auto b = make(r);
        b->set_cursor(c);
        for (int k = 0; k < 12; ++k) {
            a->next(in.data(), tg.data());
            b->next(in2.data(), tg2.data());
            ASSERT_EQ(in, in2) << "rank " << r << " step " << k;
            ASSERT_EQ(tg, tg2);
            EXPECT_EQ(a->cursor(), b->cursor());
        }
        // Going back replays: set_cursor drops what the prefetch had read.
        b->set_cursor(c);
        auto a2 = make(r);
        a2->set_cursor(c);
        b->next(in.data(), tg.data());
        a2->next(in2.data(), tg2.data());
        EXPECT_EQ(in, in2);
        EXPECT_GE(b->wait_seconds(), 0.0);
    }
}

TEST(DataLoader, CursorBeyondTheDataIsAnInputError) {
    TempDir dir;
    const std::string root = write_shards(dir);
    DataLoader l(LoaderLayout{0, 1, 0, 2, kT, 1}, TokenShards::open(root, "data.train", kVocab, kT),
                 nullptr);
    expect_input_error([&] { l.set_cursor(SamplerCursor{0, 29}); }, {"position 29", "28 windows"});
}

}  // namespace
}  // namespace bagualu::data

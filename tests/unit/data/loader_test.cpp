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
#include <array>
#include <cmath>
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

TEST(TokenShards, CountsEveryIdOfASplitTheCheckReadsWhole) {
    TempDir dir;
    std::filesystem::create_directories(dir.path("v"));
    const std::vector<int32_t> a = {3, 1, 3, 3, 0, 7, 1, 3};  // uint16
    const std::vector<int32_t> b = {7, 7, 2, 70000, 3};       // uint32
    write_token_file(dir.path("v/a.bin"), a, 65536);
    write_token_file(dir.path("v/b.bin"), b, kVocab);
    std::vector<int64_t> want(kVocab, 0);
    for (const int32_t t : a) ++want[t];
    for (const int32_t t : b) ++want[t];
    std::vector<int64_t> counts = {42};
    (void)TokenShards::open(dir.path("v"), "data.val", kVocab, 2, true, &counts);
    EXPECT_EQ(counts, want);
    // no check, no counts: nothing was read
    (void)TokenShards::open(dir.path("v"), "data.val", kVocab, 2, false, &counts);
    EXPECT_TRUE(counts.empty());
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

// A split of more than kScanAllTokens tokens (here two sparse uint16 files of zeros, 2^27 + 2^20
// tokens each, of which start-up reads kScanHeadTokens a file) is not read whole at start-up: a
// bad id in a file's first kScanHeadTokens is refused at once, one beyond is refused when its
// window is read. Opened without the id check, not even the head is read.
TEST(TokenShards, LargeSplitsAreCheckedAtTheHeadOfEachFileAndAsRead) {
    TempDir dir;
    const int64_t n = (kScanAllTokens >> 1) + (int64_t{1} << 20);
    std::filesystem::create_directories(dir.path("big"));
    const auto write_sparse = [&](const std::string& path, int64_t bad_at) {
        std::vector<int32_t> header(kTokenFileHeaderInts, 0);
        header[0] = kTokenFileMagic;
        header[1] = 1;
        header[2] = static_cast<int32_t>(n);
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(header.data()), kTokenFileHeaderBytes);
        if (bad_at >= 0) {
            const uint16_t bad = 60000;
            f.seekp(kTokenFileHeaderBytes + 2 * bad_at);
            f.write(reinterpret_cast<const char*>(&bad), 2);
        }
        f.close();
        std::filesystem::resize_file(path, kTokenFileHeaderBytes + 2 * n);
    };
    constexpr int T = 1000, vocab = 50000;
    const int64_t late = n - 10 * T;  // in the last windows of the second file
    write_sparse(dir.path("big/a.bin"), -1);
    write_sparse(dir.path("big/b.bin"), late);
    std::vector<int64_t> counts = {1};
    const TokenShards s = TokenShards::open(dir.path("big"), "data.train", vocab, T, true, &counts);
    EXPECT_GT(s.num_tokens(), kScanAllTokens);
    EXPECT_TRUE(counts.empty());  // the heads alone were read: no counts of the split
    std::vector<int32_t> w(T + 1);
    s.read_window(0, w.data());
    EXPECT_EQ(w[0], 0);
    const int64_t bad_window = s.shard_windows(0) + late / T;
    s.read_window(bad_window - 1, w.data());
    expect_input_error(
        [&] { s.read_window(bad_window, w.data()); },
        {"b.bin", "token 60000", fmt::format("position {}", late), "another vocabulary"});
    write_sparse(dir.path("big/b.bin"), kScanHeadTokens - 1);  // the last id read at start-up
    expect_input_error([&] { TokenShards::open(dir.path("big"), "data.train", vocab, T); },
                       {"b.bin", "60000"});
    const TokenShards unchecked = TokenShards::open(dir.path("big"), "data.train", vocab, T, false);
    expect_input_error(
        [&] {
            unchecked.read_window(unchecked.shard_windows(0) + (kScanHeadTokens - 1) / T, w.data());
        },
        {"b.bin", "token 60000", fmt::format("position {}", kScanHeadTokens - 1)});
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
    c.data.readers           = ReaderCount{2};
    EXPECT_NO_THROW(validate_layout(c, 2));
    c.data.readers = ReaderCount{3};
    expect_input_error([&] { validate_layout(c, 2); }, {"data.readers = 3", "ranks 2"});
}

// The keyed order (sampler.h): a bijection of [0, n) for every n, small ones included (where
// the cycle walk does most of the work), with no table.
TEST(WindowPermutation, IsABijectionOfEverySize) {
    for (const uint64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 1000, 4096, 4097, 65537}) {
        for (const uint64_t key : {0ull, 1ull, 0xDEADBEEFull}) {
            const WindowPermutation p(n, key);
            std::vector<char> seen(n, 0);
            for (uint64_t i = 0; i < n; ++i) {
                const uint64_t j = p(i);
                ASSERT_LT(j, n) << n << " " << key;
                ASSERT_FALSE(seen[j]) << n << " " << key << ": " << j << " twice";
                seen[j] = 1;
            }
        }
    }
}

// Every position equally likely to take every window: n = 8 (a cycle walk over 16 values) under
// 4,000 keys, so each of the 64 (position, window) pairs is expected 500 times with a standard
// deviation of sqrt(4000 (1/8)(7/8)) = 20.9; the bounds are 7 of them. A network of too few
// rounds, or a round function of the half alone, fails it. On 100,003 windows the rank
// correlation of position and window is within 5 standard deviations (1/sqrt(n)) of 0, and two
// keys agree, or map neighbours to neighbours, about as rarely as random orders (expected 1 and
// 2 times: at most 12).
TEST(WindowPermutation, OrdersLookUniform) {
    constexpr int n = 8, keys = 4000;
    std::vector<int> count(n * n, 0);
    for (int k = 0; k < keys; ++k) {
        const WindowPermutation p(n, static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull);
        for (int i = 0; i < n; ++i)
            ++count[static_cast<size_t>(i * n + static_cast<int>(p(static_cast<uint64_t>(i))))];
    }
    for (int c = 0; c < n * n; ++c) {
        EXPECT_GE(count[static_cast<size_t>(c)], 354)
            << "position " << c / n << " window " << c % n;
        EXPECT_LE(count[static_cast<size_t>(c)], 646)
            << "position " << c / n << " window " << c % n;
    }
    constexpr uint64_t N = 100003;
    const WindowPermutation a(N, 11), b(N, 12);
    double sxy = 0, mean = (N - 1) / 2.0, var = 0;
    int agree = 0, neighbours = 0;
    for (uint64_t i = 0; i < N; ++i) {
        sxy += (static_cast<double>(i) - mean) * (static_cast<double>(a(i)) - mean);
        var += (static_cast<double>(i) - mean) * (static_cast<double>(i) - mean);
        agree += a(i) == b(i);
        if (i + 1 < N) neighbours += a(i + 1) == a(i) + 1 || a(i) == a(i + 1) + 1;
    }
    EXPECT_LT(std::abs(sxy / var), 5 / std::sqrt(static_cast<double>(N)));
    EXPECT_LE(agree, 12);
    EXPECT_LE(neighbours, 12);
}

// The kind follows the size alone; a keyed sampler over 2^40 windows starts at once (no table of
// 8 TiB) and its epochs differ; skip and set_cursor land where next() would.
TEST(SequenceSampler, KeyedOrdersNeedNoTable) {
    EXPECT_EQ(shuffle_kind_for(kExactShuffleWindows), ShuffleKind::exact);
    EXPECT_EQ(shuffle_kind_for(kExactShuffleWindows + 1), ShuffleKind::keyed);
    const int64_t big = int64_t{1} << 40;
    SequenceSampler s(big, 5);
    EXPECT_EQ(s.kind(), ShuffleKind::keyed);
    std::set<int64_t> ids;
    for (int i = 0; i < 10000; ++i) {
        const int64_t id = s.next();
        ASSERT_TRUE(id >= 0 && id < big);
        ids.insert(id);
    }
    EXPECT_EQ(ids.size(), 10000u);

    constexpr int64_t n = 1000;
    for (const ShuffleKind kind : {ShuffleKind::exact, ShuffleKind::keyed}) {
        SequenceSampler a(n, 9, kind), b(n, 9, kind), c(n, 9, kind);
        std::vector<int64_t> e0, e1;
        for (int64_t i = 0; i < n; ++i) e0.push_back(a.next());
        for (int64_t i = 0; i < n; ++i) e1.push_back(a.next());
        EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), static_cast<size_t>(n));
        EXPECT_EQ(std::set<int64_t>(e1.begin(), e1.end()).size(), static_cast<size_t>(n));
        EXPECT_NE(e0, e1) << shuffle_kind_name(kind);
        b.skip(n + 17);
        EXPECT_EQ(b.next(), e1[17]);
        c.set_cursor({1, 500});
        EXPECT_EQ(c.next(), e1[500]);
        c.set_cursor({0, 3});
        EXPECT_EQ(c.next(), e0[3]);
    }
    // the two kinds draw different orders
    SequenceSampler x(n, 9, ShuffleKind::exact), y(n, 9, ShuffleKind::keyed);
    int same = 0;
    for (int64_t i = 0; i < n; ++i) same += x.next() == y.next();
    EXPECT_LE(same, 12);
}

TEST(DataLoader, RanksSliceTheGlobalOrderAndCoverEachEpoch) {
    TempDir dir;
    const std::string root  = write_shards(dir);
    const TokenShards ref   = TokenShards::open(root, "data.train", kVocab, kT);
    const int64_t n         = ref.num_windows();
    constexpr int MB        = 3;
    constexpr uint64_t seed = 7;
    std::vector<int32_t> w(kT + 1);
    for (const ShuffleKind kind : {ShuffleKind::exact, ShuffleKind::keyed})
        for (int P = 1; P <= 8; ++P) {
            std::vector<std::unique_ptr<DataLoader>> ranks;
            for (int r = 0; r < P; ++r) {
                ranks.push_back(std::make_unique<DataLoader>(
                    LoaderLayout{r, P, 0, MB, kT, seed, 0, kind},
                    TokenShards::open(root, "data.train", kVocab, kT), nullptr));
                ASSERT_EQ(ranks.back()->shuffle_kind(), kind);
            }
            SequenceSampler order(n, seed, kind);  // the one-rank order
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
                            ASSERT_EQ(tg[static_cast<size_t>(b * kT + i)], w[i + 1])
                                << P << " " << k;
                        }
                    }
                }
                const SamplerCursor c = advance_cursor({}, n, (k + 1) * MB * P);
                for (const auto& l : ranks) EXPECT_EQ(l->cursor(), c);
            }
            // Each epoch of the global order is a permutation of all windows: within an epoch no
            // two ranks (or micro-steps) share a window.
            for (int e = 0; e < 2; ++e) {
                const std::set<int64_t> ids(taken.begin() + e * n, taken.begin() + (e + 1) * n);
                EXPECT_EQ(static_cast<int64_t>(ids.size()), n)
                    << P << " ranks, epoch " << e << ", " << shuffle_kind_name(kind);
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
                        LoaderLayout{r, P, 0, cap, kT, seed, B, {}},
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

// The blend's schedule: after every j windows each source has given p_i j of them to within one
// (the smooth weighted round robin), advance() lands where as many next() calls do, and new
// weights take effect at once, with no burst repaying the past: the counts under the new weights
// stay within one of p_i' (j - j0) plus where they stood.
TEST(BlendSchedule, EverySourceKeepsItsShareAtEveryWindow) {
    const std::vector<double> w = {7, 2, 1};
    const BlendSchedule b(w);
    ASSERT_EQ(b.sources(), 3);
    OrderCursor c = b.start();
    std::vector<int64_t> count(3, 0);
    for (int64_t j = 1; j <= 10000; ++j) {
        ++count[static_cast<size_t>(b.next(c.deficits))];
        for (size_t i = 0; i < 3; ++i) {
            ASSERT_LT(std::abs(static_cast<double>(count[i]) - b.share(static_cast<int>(i)) * j),
                      1.0)
                << "source " << i << " after " << j;
        }
    }
    const std::vector<int64_t> windows = {5, 3, 1000};
    for (const int64_t k : {0, 1, 7, 100, 1234}) {
        OrderCursor a = b.start(), r = b.start();
        std::vector<int64_t> taken(3, 0);
        for (int64_t i = 0; i < k; ++i) ++taken[static_cast<size_t>(b.next(r.deficits))];
        for (size_t i = 0; i < 3; ++i) r.sources[i] = advance_cursor({}, windows[i], taken[i]);
        EXPECT_EQ(b.advance(a, windows, k), r) << k;
    }
    const BlendSchedule after({1, 1, 2});
    std::vector<int64_t> since(3, 0);
    for (int64_t j = 1; j <= 1000; ++j) {
        ++since[static_cast<size_t>(after.next(c.deficits))];
        for (size_t i = 0; i < 3; ++i) {
            ASSERT_LT(
                std::abs(static_cast<double>(since[i]) - after.share(static_cast<int>(i)) * j), 2.0)
                << "source " << i << " " << j << " windows after the change";
        }
    }
}

// A blend of two splits whose windows tell their split (the second's tokens start at 100000):
// for P = 1..4 ranks the ranks slice the one-rank order, which takes source s's windows in its
// own order (SequenceSampler with source_seed(seed, s)) where the schedule says; the cursor
// follows, and a loader set to it continues bitwise.
TEST(DataLoader, BlendsSliceTheOneRankOrderOfTheirSources) {
    TempDir dir;
    const std::string a = write_shards(dir);
    std::filesystem::create_directories(dir.path("b"));
    {
        std::vector<int32_t> t(200);
        std::iota(t.begin(), t.end(), 100000);
        write_token_file(dir.path("b/only.bin"), t, kVocab);
    }
    const std::string b               = dir.path("b");
    const std::vector<double> weights = {1, 3};
    const auto open                   = [&] {
        std::vector<TokenShards> v;
        v.push_back(TokenShards::open(a, "data.blend[0]", kVocab, kT));
        v.push_back(TokenShards::open(b, "data.blend[1]", kVocab, kT));
        return v;
    };
    const std::vector<TokenShards> ref = open();
    const std::vector<int64_t> n       = {ref[0].num_windows(), ref[1].num_windows()};
    constexpr int MB                   = 2;
    constexpr uint64_t seed            = 21;
    std::vector<int32_t> w(kT + 1);
    for (int P = 1; P <= 4; ++P) {
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < P; ++r) {
            ranks.push_back(std::make_unique<DataLoader>(LoaderLayout{r, P, 0, MB, kT, seed, 0, {}},
                                                         open(), weights, nullptr));
            ASSERT_TRUE(ranks.back()->blended());
            ASSERT_EQ(ranks.back()->num_windows(), n[0] + n[1]);
        }
        const BlendSchedule schedule(weights);
        std::vector<double> deficits = schedule.start().deficits;
        SequenceSampler s0(n[0], source_seed(seed, 0)), s1(n[1], source_seed(seed, 1));
        std::vector<int32_t> in(static_cast<size_t>(MB) * kT), tg(in.size());
        std::array<int64_t, 2> from = {0, 0};
        for (int64_t k = 0; k < 40; ++k) {
            for (int r = 0; r < P; ++r) {
                ranks[static_cast<size_t>(r)]->next(in.data(), tg.data());
                for (int row = 0; row < MB; ++row) {
                    const int s = schedule.next(deficits);
                    ++from[static_cast<size_t>(s)];
                    ref[static_cast<size_t>(s)].read_window(s == 0 ? s0.next() : s1.next(),
                                                            w.data());
                    for (int i = 0; i < kT; ++i) {
                        ASSERT_EQ(in[static_cast<size_t>(row * kT + i)], w[i]) << P << " " << k;
                        ASSERT_EQ(tg[static_cast<size_t>(row * kT + i)], w[i + 1]);
                    }
                }
            }
            const OrderCursor c = OrderCursor({s0.cursor(), s1.cursor()}, deficits);
            for (const auto& l : ranks) ASSERT_EQ(l->cursor(), c) << P << " " << k;
        }
        EXPECT_EQ(from[0] + from[1], 40 * MB * P);
        EXPECT_NEAR(static_cast<double>(from[1]) / static_cast<double>(from[0]), 3.0, 0.1);
        // resumed at the cursor: the same batches as the loader that went on
        auto again = std::make_unique<DataLoader>(LoaderLayout{0, P, 0, MB, kT, seed, 0, {}},
                                                  open(), weights, nullptr);
        again->set_cursor(ranks[0]->cursor());
        std::vector<int32_t> in0(in.size()), in2(in.size()), tg2(in.size());
        for (int k = 0; k < 5; ++k) {
            for (int r = P - 1; r >= 0; --r) {
                ranks[static_cast<size_t>(r)]->next(in.data(), tg.data());
                if (r == 0) in0 = in;
            }
            // rank 0's micro-batch of this step, read by the resumed loader as rank 0
            again->next(in2.data(), tg2.data());
            ASSERT_EQ(in0, in2) << P << " " << k;
        }
        ASSERT_EQ(again->cursor(), ranks[0]->cursor());
    }
    // a cursor of the wrong shape is one line
    DataLoader l(LoaderLayout{0, 1, 0, MB, kT, seed, 0, {}}, open(), weights, nullptr);
    expect_input_error([&] { l.set_cursor(SamplerCursor{0, 1}); }, {"1 splits", "2 split(s)"});
    expect_input_error(
        [&] {
            l.set_cursor(OrderCursor({{0, 0}, {0, n[1] + 1}}, {0.0, 0.0}));
        },
        {fmt::format("position {}", n[1] + 1), "data.blend[1]"});
}

TEST(DataLoader, ResumesAtTheCursorWhateverWasPrefetched) {
    TempDir dir;
    const std::string root = write_shards(dir);
    constexpr int P = 3, MB = 2;
    const auto make = [&](int r) {
        return std::make_unique<DataLoader>(LoaderLayout{r, P, 0, MB, kT, 11, 0, {}},
                                            TokenShards::open(root, "data.train", kVocab, kT),
                                            nullptr);
    };
    std::vector<int32_t> in(static_cast<size_t>(MB) * kT), tg(in.size()), in2(in.size()),
        tg2(in.size());
    for (int r = 0; r < P; ++r) {
        auto a = make(r);
        for (int k = 0; k < 9; ++k) a->next(in.data(), tg.data());  // 54 windows: epoch 1
        const OrderCursor c = a->cursor();
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
    DataLoader l(LoaderLayout{0, 1, 0, 2, kT, 1, 0, {}},
                 TokenShards::open(root, "data.train", kVocab, kT), nullptr);
    expect_input_error([&] { l.set_cursor(SamplerCursor{0, 29}); }, {"position 29", "28 windows"});
}

}  // namespace
}  // namespace bagualu::data

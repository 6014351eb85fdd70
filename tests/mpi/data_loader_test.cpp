// The data loader's reader groups under mpirun (P = 1..4): Comm::scatter (blocking, and started
// then waited for around another collective), and for every data.readers = N in 1..P, the
// micro-batches and cursors each rank gets when N readers read and scatter equal those of every
// rank reading its own slice (N = 0), across epoch boundaries, on uneven shards, and after
// set_cursor mid-run. Non-readers open no file (theirs is given a path that does not exist).
// No ASSERT before a collective (no hangs).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "data/loader.h"
#include "data/token_file.h"
#include "dist/parallel.h"
#include "mpi_world.h"

namespace bagualu::dist {
namespace {

TEST(Comm, ScatterGivesEachRankItsBlock) {
    Comm& w     = test_world();
    const int P = w.size();
    for (int root = 0; root < P; ++root) {
        std::vector<int64_t> send;
        if (w.rank() == root) {
            send.resize(3 * static_cast<size_t>(P));
            std::iota(send.begin(), send.end(), 100 * root);
        }
        int64_t got[3] = {-1, -1, -1};
        w.scatter(send.data(), sizeof(got), got, root);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], 100 * root + 3 * w.rank() + i);
        int64_t late[3] = {-1, -1, -1};
        w.scatter_start(send.data(), sizeof(late), late, root);
        double x = 1;  // another collective while the scatter is in flight
        w.allreduce_sum(std::span<double>(&x, 1));
        w.scatter_wait();
        EXPECT_EQ(x, P);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(late[i], 100 * root + 3 * w.rank() + i);
    }
}

TEST(DataLoaderReaders, GroupsDeliverWhatEveryRankWouldReadItself) {
    Comm& w     = test_world();
    const int P = w.size();
    int64_t pid = getpid();
    w.broadcast(&pid, sizeof(pid), 0);
    const auto dir  = std::filesystem::temp_directory_path() / fmt::format("bgl_loader_{}", pid);
    constexpr int T = 8, MB = 2, V = 1000;
    if (w.rank() == 0) {
        std::filesystem::create_directories(dir);
        int next = 0;
        for (const int n : {45, 3, 130, 21}) {  // 5 + 0 + 16 + 2 = 23 windows
            std::vector<int32_t> t(static_cast<size_t>(n));
            for (int& x : t) x = next++ % V;
            data::write_token_file((dir / fmt::format("s{}.bin", n)).string(), t, V);
        }
    }
    w.barrier();
    const auto open = [&] { return data::TokenShards::open(dir.string(), "data.train", V, T); };
    ParallelContext par(w, 1, false);
    // B = MB P: every rank MB windows a micro-step; MB P + 1: rank 0 trains MB + 1 in two
    // micro-steps, the others MB in two (config/batch_split.h), slices padded in the scatter.
    for (const int B : {MB * P, MB * P + 1}) {
        for (int N = 1; N <= P; ++N) {
            data::DataLoader all(data::LoaderLayout{w.rank(), P, 0, MB, T, 5, B, {}}, open(),
                                 nullptr);
            const data::ReaderGroup g = data::reader_group(w.rank(), P, N);
            const bool reader         = g.first == w.rank();
            // The loader as the trainer makes it; non-readers get a path that does not exist, so
            // the loader fails if they try to open it.
            TrainConfig cfg;
            cfg.model.seq_len          = T;
            cfg.model.vocab_size       = V;
            cfg.train.seed             = 5;
            cfg.train.batch_size       = B;
            cfg.train.micro_batch_size = MB;
            cfg.data.readers           = ReaderCount{N};
            cfg.data.train             = reader ? dir.string() : (dir / "absent").string();
            data::DataLoader l(cfg, par);
            EXPECT_EQ(l.reads(), reader);
            EXPECT_EQ(l.num_windows(), 23);
            EXPECT_EQ(l.num_tokens(), reader ? 45 + 3 + 130 + 21 : 0);
            all.set_cursor(data::SamplerCursor{1, 20});  // an epoch ends inside the first step
            l.set_cursor(data::SamplerCursor{1, 20});
            std::vector<int32_t> a(MB * T), at(a.size()), b(a.size()), bt(a.size());
            for (int k = 0; k < 30 / (MB * P) + 2; ++k) {
                const int rows = all.next(a.data(), at.data());
                EXPECT_EQ(l.next(b.data(), bt.data()), rows);
                EXPECT_EQ(a, b) << N << " readers, batch " << B << ", step " << k;
                EXPECT_EQ(at, bt) << N << " readers, step " << k;
                EXPECT_EQ(all.cursor(), l.cursor());
            }
            // Back to an earlier position mid-run (a scatter and a fetch are in flight): replays.
            all.set_cursor(data::SamplerCursor{2, 3});
            l.set_cursor(data::SamplerCursor{2, 3});
            for (int k = 0; k < 3; ++k) {
                all.next(a.data(), at.data());
                l.next(b.data(), bt.data());
                EXPECT_EQ(a, b) << N << " readers, after set_cursor, step " << k;
            }
        }
    }
    w.barrier();
    if (w.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace bagualu::dist

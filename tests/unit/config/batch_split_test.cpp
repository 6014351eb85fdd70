// The split of a step's batch over ranks and micro-steps (config/batch_split.h): every sequence
// is trained once, by one rank in one micro-step; an even split is what the trainer always did
// (batch / ranks a rank, micro_batch_size a micro-step); every token weighs the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../data/test_util.h"
#include "config/config.h"

namespace bagualu {
namespace {

using data::testing::expect_input_error;

TEST(BatchSplit, CoversTheBatchOnceForEveryRankCountAndCap) {
    for (int64_t B = 1; B <= 40; ++B) {
        for (int64_t P = 1; P <= B; ++P) {
            for (int64_t cap = 1; cap <= B + 1; ++cap) {
                const BatchSplit s(B, P, cap);
                const int64_t A = s.steps();
                int64_t shares  = 0;
                for (int64_t r = 0; r < P; ++r) {
                    shares += s.share(r);
                    EXPECT_LE(s.share(r) - s.min_share(), 1);
                }
                ASSERT_EQ(shares, B) << B << " " << P << " " << cap;
                EXPECT_LE(s.max_rows(), cap);
                // A is the fewest micro-steps at `cap` rows for the largest share
                EXPECT_LE(s.share(0), A * cap);
                EXPECT_GT(s.share(0), (A - 1) * cap);
                double weights = 0, fractions = 0;
                int64_t rows = 0;
                for (int64_t k = 0; k < A; ++k) {
                    EXPECT_EQ(s.offset(0, k), 0);
                    for (int64_t r = 0; r < P; ++r) {
                        const int64_t m = s.rows(r, k);
                        EXPECT_LE(m, s.max_rows());
                        EXPECT_GE(m, s.has_empty() ? 0 : 1);
                        EXPECT_EQ(s.offset(r + 1, k), s.offset(r, k) + m);
                        rows += m;
                        weights += s.weight(r, k);
                        if (s.even()) {
                            EXPECT_EQ(m, s.max_rows());
                        }
                    }
                    fractions += s.fraction(k);
                }
                ASSERT_EQ(rows, B);
                // mean loss weights: the P ranks' weighted sums averaged, the micro-steps summed
                EXPECT_NEAR(weights / static_cast<double>(P), 1.0, 1e-12);
                EXPECT_NEAR(fractions, 1.0, 1e-12);
                // Before uneven splits: ranks dividing the batch, micro_batch_size capping the
                // share and dividing it. Those splits are even, with the same sizes (so the
                // trainer computes as before); some more are now (4 over 1 rank at cap 3: 2 + 2).
                const int64_t old_mb = std::min(cap, B / P);
                if (B % P == 0 && (B / P) % old_mb == 0) {
                    EXPECT_TRUE(s.even()) << B << " " << P << " " << cap;
                    EXPECT_EQ(s.max_rows(), old_mb);
                    EXPECT_EQ(A, B / P / old_mb);
                }
            }
        }
    }
}

// Every shipped config passes the layout checks on 1 to 8 ranks as it is.
TEST(BatchSplit, ShippedConfigsRunOnOneToEightRanks) {
    for (const char* name : {"tiny", "default", "bench-medium", "fine-grained"}) {
        const TrainConfig c =
            load_config(std::string(BGL_SOURCE_DIR) + "/configs/" + name + ".toml");
        for (int P = 1; P <= 8; ++P) EXPECT_NO_THROW(validate_layout(c, P)) << name << " " << P;
    }
    // configs/default.toml: 16 sequences, micro_batch_size 16; 3 ranks train 6, 5 and 5
    TrainConfig c;
    c.train.batch_size       = 16;
    c.train.micro_batch_size = 16;
    const BatchSplit s       = c.batch_split(3);
    EXPECT_EQ(s.steps(), 1);
    EXPECT_EQ(s.rows(0, 0), 6);
    EXPECT_EQ(s.rows(1, 0), 5);
    EXPECT_EQ(s.offset(2, 0), 11);
    EXPECT_FALSE(s.even());
    EXPECT_TRUE(c.batch_split(4).even());
    EXPECT_EQ(c.micro_batch(4), 4);
}

TEST(BatchSplit, RanksWithoutASequenceOrAnEmptyMicroBatchAreRefused) {
    TrainConfig c;
    c.train.batch_size       = 8;
    c.train.micro_batch_size = 4;
    expect_input_error([&] { validate_layout(c, 9); },
                       {"train.batch_size = 8", "number of ranks 9"});
    // 3 ranks: shares 3, 3, 2; one row a micro-batch needs 3 micro-steps, 2 rows cannot fill them
    c.train.micro_batch_size = 1;
    expect_input_error(
        [&] { validate_layout(c, 3); },
        {"train.batch_size = 8", "3 ranks", "train.micro_batch_size = 1", "at least 2"});
    c.train.micro_batch_size = 2;
    EXPECT_NO_THROW(validate_layout(c, 3));
}

}  // namespace
}  // namespace bagualu

// Tests for kernels/ops.h: every fast kernel against the scalar oracle kernels/ref/ops_ref.h on
// ragged shapes; every ref backward (in double) against central finite differences; the += / =
// conventions of each backward; AdamW against a hand computation; and bitwise independence of
// the thread count. The families kernels/dispatch.h chooses an implementation for are tested on
// every ISA's table (IsaTest: skipped where the CPU lacks the ISA). Does not benchmark.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

// core/rng.h uses unsigned __int128, which -Wpedantic flags in ISO C++ mode.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include "core/dtype.h"
#include "core/rng.h"
#pragma GCC diagnostic pop
#include "core/thread_pool.h"
#include "isa_params.h"
#include "kernels/dispatch.h"
#include "kernels/ops_generic.h"
#include "kernels/ref/ops_ref.h"

namespace bagualu::kernels {
namespace {

using testing::IsaTest;

// ---- helpers ----

template <typename T = float>
std::vector<T> randn(Rng& rng, size_t n, double scale = 1.0, double shift = 0.0) {
    std::vector<T> x(n);
    for (auto& v : x) v = T(shift + scale * rng.normal());
    return x;
}

std::vector<int32_t> rand_ints(Rng& rng, size_t n, int below) {
    std::vector<int32_t> x(n);
    for (auto& v : x) v = int32_t(rng.below(uint64_t(below)));
    return x;
}

std::vector<float> nans(size_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// max_i |got_i - want_i| / (1 + |want_i|): an absolute error for values below 1, a relative
// one above. NaN counts as infinitely wrong.
template <typename T>
double max_err(const std::vector<T>& got, const std::vector<T>& want) {
    EXPECT_EQ(got.size(), want.size());
    double m = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        const double e = std::fabs(double(got[i]) - double(want[i])) / (1.0 + std::fabs(want[i]));
        if (!(e <= m)) m = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
    }
    return m;
}

#define EXPECT_CLOSE(got, want, tol) EXPECT_LE(max_err(got, want), tol) << #got " vs " #want

std::string shape(std::initializer_list<int> dims) {
    std::string s;
    for (int d : dims) s += std::to_string(d) + " ";
    return s;
}

const int kRows[] = {1, 7, 64, 129};
const int kCols[] = {1, 15, 16, 257};

// ---- 1. fast kernels vs ref<float> ----
// OpsVsRef: the kernels with one implementation; OpsIsaVsRef: the dispatched families, once per
// ISA (the tolerances hold for every ISA: each states what its error comes from).

class OpsIsaVsRef : public IsaTest {};
BGL_INSTANTIATE_ISAS(OpsIsaVsRef);

TEST(OpsVsRef, Linear) {
    // gemm sums K = IC (forward), OC (dinp) or N (dweight) <= 257 products of O(1) values in
    // float: a random-walk error ~ sqrt(K) eps on partial sums of size ~ sqrt(K), i.e. ~K eps =
    // 1.5e-5, on outputs that can cancel to ~0 (seen: 1.2e-5). 5e-5 on |d| / (1 + |ref|); a
    // wrong index, transpose or missing term is off by O(1).
    constexpr double kTol = 5e-5;
    Rng rng(1);
    for (int N : kRows) {
        for (int IC : kCols) {
            for (int OC : kCols) {
                SCOPED_TRACE(shape({N, IC, OC}));
                const bool with_bias = (N + IC + OC) % 2 == 0;
                auto inp = randn(rng, size_t(N) * IC), w = randn(rng, size_t(OC) * IC);
                auto bias = randn(rng, size_t(OC)), dout = randn(rng, size_t(N) * OC);
                const float* b = with_bias ? bias.data() : nullptr;

                auto out = nans(size_t(N) * OC), out_ref = out;
                linear_forward(out.data(), inp.data(), w.data(), b, N, IC, OC);
                ref::linear_forward(out_ref.data(), inp.data(), w.data(), b, N, IC, OC);
                EXPECT_CLOSE(out, out_ref, kTol);

                auto dinp = nans(size_t(N) * IC), dinp_ref = dinp;
                auto dw = randn(rng, size_t(OC) * IC), dw_ref = dw;  // += onto existing values
                auto db = randn(rng, size_t(OC)), db_ref = db;
                linear_backward(with_bias ? dinp.data() : nullptr, dw.data(),
                                with_bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                                N, IC, OC);
                ref::linear_backward(with_bias ? dinp_ref.data() : nullptr, dw_ref.data(),
                                     with_bias ? db_ref.data() : nullptr, dout.data(), inp.data(),
                                     w.data(), N, IC, OC);
                if (with_bias) {
                    EXPECT_CLOSE(dinp, dinp_ref, kTol);
                }
                EXPECT_CLOSE(dw, dw_ref, kTol);
                EXPECT_CLOSE(db, db_ref, kTol);
            }
        }
    }
}

TEST(OpsVsRef, Embedding) {
    // Exact: each output element is one float addition, or a sequence of float additions in the
    // same row order, and rounding a double sum of two floats to float equals the float sum.
    Rng rng(2);
    const int V                     = 37;
    const std::pair<int, int> kBT[] = {{1, 1}, {2, 7}, {3, 64}};
    for (auto [B, T] : kBT) {
        for (int C : kCols) {
            SCOPED_TRACE(shape({B, T, C}));
            const int maxT = T + 3;
            auto tokens    = rand_ints(rng, size_t(B) * T, V);
            auto wte = randn(rng, size_t(V) * C), wpe = randn(rng, size_t(maxT) * C);
            auto out = nans(size_t(B) * T * C), out_ref = out;
            embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
            ref::embedding_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
            EXPECT_EQ(out, out_ref);

            auto dout = randn(rng, out.size());
            auto dwte = randn(rng, wte.size()), dwte_ref = dwte;
            auto dwpe = randn(rng, wpe.size()), dwpe_ref = dwpe;
            embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
            ref::embedding_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B,
                                    T, C);
            EXPECT_EQ(dwte, dwte_ref);
            EXPECT_EQ(dwpe, dwpe_ref);
        }
    }
}

TEST_P(OpsIsaVsRef, Layernorm) {
    // Row statistics are summed in double in both; the float part is a handful of operations
    // per element on values of size |x - mean| * rstd * w ~ O(3), plus double column sums over
    // N <= 129 rows: a few ulp, 1e-5 leaves a wide margin.
    constexpr double kTol = 1e-5;
    Rng rng(3);
    for (int N : kRows) {
        for (int C : kCols) {
            SCOPED_TRACE(shape({N, C}));
            auto inp = randn(rng, size_t(N) * C, 2.0, 0.5);
            auto w = randn(rng, size_t(C), 1.0, 1.0), b = randn(rng, size_t(C));
            auto out = nans(inp.size()), out_ref = out;
            auto mean = nans(size_t(N)), mean_ref = mean, rstd = mean, rstd_ref = mean;
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                              N, C);
            ref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), inp.data(),
                                   w.data(), b.data(), N, C);
            EXPECT_CLOSE(out, out_ref, kTol);
            EXPECT_CLOSE(mean, mean_ref, kTol);
            EXPECT_CLOSE(rstd, rstd_ref, kTol);

            // Both backwards get the same saved statistics, so only the backward differs.
            auto dout = randn(rng, inp.size());
            auto dinp = randn(rng, inp.size()), dinp_ref = dinp;  // += onto existing values
            auto dw = randn(rng, size_t(C)), dw_ref = dw, db = randn(rng, size_t(C)), db_ref = db;
            layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                               mean_ref.data(), rstd_ref.data(), N, C);
            ref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(),
                                    inp.data(), w.data(), mean_ref.data(), rstd_ref.data(), N, C);
            EXPECT_CLOSE(dinp, dinp_ref, kTol);
            EXPECT_CLOSE(dw, dw_ref, kTol);
            EXPECT_CLOSE(db, db_ref, kTol);
        }
    }
}

TEST_P(OpsIsaVsRef, GeluAndAdd) {
    // GELU in float: exp within 1 ulp and a handful of float operations on values of
    // O(|x|) <= 15: ~1e-7 on |d| / (1 + |ref|) (seen: 1.5e-7), 1e-6 leaves a 6x margin.
    // add: one float addition, exact against the double sum rounded to float.
    constexpr double kTol = 1e-6;
    Rng rng(4);
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(40000)}) {
        SCOPED_TRACE(n);
        auto x = randn(rng, n, 3.0), dout = randn(rng, n);
        auto out = nans(n), out_ref = out;
        gelu_forward(out.data(), x.data(), n);
        ref::gelu_forward(out_ref.data(), x.data(), n);
        EXPECT_CLOSE(out, out_ref, kTol);

        auto dinp = nans(n), dinp_ref = dinp;
        gelu_backward(dinp.data(), x.data(), dout.data(), n);
        ref::gelu_backward(dinp_ref.data(), x.data(), dout.data(), n);
        EXPECT_CLOSE(dinp, dinp_ref, kTol);
        auto inplace = dout;  // dinp aliasing dout
        gelu_backward(inplace.data(), x.data(), inplace.data(), n);
        EXPECT_EQ(inplace, dinp);

        auto sum = nans(n), sum_ref = sum;
        add_forward(sum.data(), x.data(), dout.data(), n);
        ref::add_forward(sum_ref.data(), x.data(), dout.data(), n);
        EXPECT_EQ(sum, sum_ref);
        add_forward(x.data(), x.data(), dout.data(), n);  // out aliasing a
        EXPECT_EQ(x, sum);
    }
}

// The first index where a and b differ in their bits, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
    }
    return a.size() == b.size() ? -1 : int64_t(std::min(a.size(), b.size()));
}

TEST_P(OpsIsaVsRef, GeluIsBitwiseTheGenericKernel) {
    // The SIMD GELUs do the generic kernel's float operations in its order, without FMA, so
    // they give its bits exactly, on every value: the default path's results do not depend on
    // which ISA the CPU has. Ragged lengths around the 8- and 16-lane steps, and the values
    // where exp_f32 clamps, underflows or passes NaN through.
    Rng rng(9);
    const float inf        = std::numeric_limits<float>::infinity();
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              inf,
                              -inf,
                              0.f,
                              -0.f,
                              1e-40f,
                              -1e-40f,
                              100.f,
                              -100.f,
                              20.f,
                              -20.f,
                              9.53f,
                              -9.53f,
                              -5.2f,
                              1e20f,
                              -1e20f,
                              3.4e38f,
                              -3.4e38f};
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(15), size_t(16), size_t(17),
                     size_t(31), size_t(33), size_t(40000)}) {
        SCOPED_TRACE(n);
        auto x = randn(rng, n, 6.0), dout = randn(rng, n);
        for (size_t i = 0; i < n && i < std::size(specials); ++i) x[n - 1 - i] = specials[i];
        auto out = nans(n), out_gen = out, dinp = out, dinp_gen = out;
        gelu_forward(out.data(), x.data(), n);
        generic::gelu_forward_range(out_gen.data(), x.data(), 0, int64_t(n));
        int64_t i = first_bit_difference(out, out_gen);
        EXPECT_EQ(i, -1) << "x " << x[size_t(i)] << ": " << out[size_t(i)] << " vs generic "
                         << out_gen[size_t(i)];
        gelu_backward(dinp.data(), x.data(), dout.data(), n);
        generic::gelu_backward_range(dinp_gen.data(), x.data(), dout.data(), 0, int64_t(n));
        i = first_bit_difference(dinp, dinp_gen);
        EXPECT_EQ(i, -1) << "x " << x[size_t(i)] << ": " << dinp[size_t(i)] << " vs generic "
                         << dinp_gen[size_t(i)];
    }
}

TEST_P(OpsIsaVsRef, RowKernelsAreBitwiseTheGenericKernelsAndExact) {
    // col_sums_f64 and scaled_rows_and_dots keep the generic loops' order of double adds, so
    // every ISA gives their bits: ragged widths around the 4-, 16- and 32-column steps, row
    // counts around the 4-row groups and the 16-row chunks, and a strided source. The sums are also
    // checked against a long-double sum: 301 roundings of double sums of magnitude < 100 stay far
    // below 1e-9.
    Rng rng(21);
    for (int w : {1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100}) {
        for (int64_t n :
             {int64_t(0), int64_t(1), int64_t(7), int64_t(16), int64_t(17), int64_t(301)}) {
            SCOPED_TRACE(std::to_string(w) + " columns, " + std::to_string(n) + " rows");
            const int64_t ld = w + 3;
            const auto x     = randn(rng, size_t(std::max<int64_t>(n, 1) * ld), 3.0);
            std::vector<double> s0(size_t(w) + 1);
            for (auto& v : s0) v = rng.normal();
            auto s = s0, s_gen = s0;
            col_sums_f64(s.data(), x.data(), n, ld, w);
            generic::col_sums_f64(s_gen.data(), x.data(), n, ld, w);
            EXPECT_EQ(std::memcmp(s.data(), s_gen.data(), s.size() * sizeof(double)), 0);
            EXPECT_EQ(s[size_t(w)], s0[size_t(w)]);  // the column past w untouched
            for (int c = 0; c < w; ++c) {
                long double want = s0[size_t(c)];
                for (int64_t r = 0; r < n; ++r) want += x[size_t(r * ld + c)];
                EXPECT_NEAR(s[size_t(c)], double(want), 1e-9);
            }
            // the same over bf16 rows (x's values narrowed): their double sums, bitwise
            std::vector<uint16_t> x16(x.size());
            for (size_t i = 0; i < x.size(); ++i) x16[i] = bf16_from_float(x[i]);
            auto s16 = s0, s16_gen = s0;
            col_sums_f64_bf16(s16.data(), x16.data(), n, ld, w);
            generic::col_sums_f64_bf16(s16_gen.data(), x16.data(), n, ld, w);
            EXPECT_EQ(std::memcmp(s16.data(), s16_gen.data(), s16.size() * sizeof(double)), 0);
            EXPECT_EQ(s16[size_t(w)], s0[size_t(w)]);
            for (int c = 0; c < w; ++c) {
                double want = s0[size_t(c)];
                for (int64_t r = 0; r < n; ++r)
                    want += double(bf16_to_float(x16[size_t(r * ld + c)]));
                EXPECT_EQ(s16[size_t(c)], want) << c;
            }
        }
    }
    for (int C : {1, 3, 4, 5, 8, 13, 256}) {
        for (int n : {1, 2, 3, 4, 5, 8, 9}) {
            SCOPED_TRACE(std::to_string(C) + " columns, " + std::to_string(n) + " rows");
            const auto d = randn(rng, size_t(C)), y = randn(rng, size_t(n * C)),
                       w = randn(rng, size_t(n));
            auto dy = nans(size_t(n * C)), dy_gen = dy;
            std::vector<float*> o(static_cast<size_t>(n)), o_gen(static_cast<size_t>(n));
            std::vector<const float*> yr(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) {
                // rows in reverse order: the kernels follow the pointers, not a layout
                o[size_t(j)]     = dy.data() + size_t((n - 1 - j) * C);
                o_gen[size_t(j)] = dy_gen.data() + size_t((n - 1 - j) * C);
                yr[size_t(j)]    = y.data() + size_t((n - 1 - j) * C);
            }
            std::vector<float> dots(size_t(n), -1.f), dots_gen(size_t(n), -2.f);
            scaled_rows_and_dots(o.data(), dots.data(), w.data(), d.data(), yr.data(), n, C);
            generic::scaled_rows_and_dots(o_gen.data(), dots_gen.data(), w.data(), d.data(),
                                          yr.data(), n, C);
            EXPECT_EQ(first_bit_difference(dy, dy_gen), -1);
            EXPECT_EQ(first_bit_difference(dots, dots_gen), -1);
            // without rows to write (dy nullptr): the same dots, on both kernels
            std::vector<float> dots_only(size_t(n), -3.f), dots_only_gen(size_t(n), -4.f);
            scaled_rows_and_dots(nullptr, dots_only.data(), w.data(), d.data(), yr.data(), n, C);
            generic::scaled_rows_and_dots(nullptr, dots_only_gen.data(), w.data(), d.data(),
                                          yr.data(), n, C);
            EXPECT_EQ(first_bit_difference(dots_only, dots), -1);
            EXPECT_EQ(first_bit_difference(dots_only_gen, dots), -1);
            // y as bf16 rows: the dots of their widened values, the rows written as above
            std::vector<uint16_t> y16(y.size());
            std::vector<float> yw(y.size());
            for (size_t i = 0; i < y.size(); ++i) {
                y16[i] = bf16_from_float(y[i]);
                yw[i]  = bf16_to_float(y16[i]);
            }
            std::vector<const uint16_t*> y16r(static_cast<size_t>(n));
            std::vector<const float*> ywr(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) {
                y16r[size_t(j)] = y16.data() + size_t((n - 1 - j) * C);
                ywr[size_t(j)]  = yw.data() + size_t((n - 1 - j) * C);
            }
            std::vector<float> dots_w(static_cast<size_t>(n)), dots16(static_cast<size_t>(n)),
                dots16_gen(static_cast<size_t>(n));
            auto dy16 = nans(size_t(n * C));
            std::vector<float*> o16(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) o16[size_t(j)] = dy16.data() + size_t((n - 1 - j) * C);
            generic::scaled_rows_and_dots(nullptr, dots_w.data(), w.data(), d.data(), ywr.data(), n,
                                          C);
            scaled_rows_and_dots(o16.data(), dots16.data(), w.data(), d.data(), y16r.data(), n, C);
            generic::scaled_rows_and_dots_bf16(nullptr, dots16_gen.data(), w.data(), d.data(),
                                               y16r.data(), n, C);
            EXPECT_EQ(first_bit_difference(dots16, dots_w), -1);
            EXPECT_EQ(first_bit_difference(dots16_gen, dots_w), -1);
            EXPECT_EQ(first_bit_difference(dy16, dy), -1);
            for (int j = 0; j < n; ++j) {
                double want = 0;
                for (int c = 0; c < C; ++c) want += double(d[size_t(c)]) * yr[size_t(j)][c];
                // one float rounding of a double sum: relative 2^-24, plus the sum's own
                EXPECT_NEAR(dots[size_t(j)], want, 1e-6 * (1 + std::abs(want)));
                EXPECT_EQ(o[size_t(j)][C - 1], w[size_t(j)] * d[size_t(C - 1)]);
            }
        }
    }
}

// add_col_sums (a bias gradient): each column's double sum from zero, added to dbias once, over
// widths around its 512-column blocks, floats and bf16 bits: the bits of the generic column
// sums added by hand.
TEST_P(OpsIsaVsRef, AddColSumsIsTheColumnSumsAddedOnce) {
    Rng rng(22);
    for (int w : {1, 37, 512, 513, 1100}) {
        const int64_t n = 41, ld = w + 5;
        SCOPED_TRACE(std::to_string(w) + " columns");
        const auto x = randn(rng, size_t(n * ld), 3.0);
        std::vector<uint16_t> x16(x.size());
        for (size_t i = 0; i < x.size(); ++i) x16[i] = bf16_from_float(x[i]);
        const auto b0 = randn(rng, size_t(w) + 1);
        for (const bool half : {false, true}) {
            std::vector<double> s(size_t(w), 0.0);
            if (half) {
                generic::col_sums_f64_bf16(s.data(), x16.data(), n, ld, w);
            } else {
                generic::col_sums_f64(s.data(), x.data(), n, ld, w);
            }
            auto want = b0, got = b0;
            for (int c = 0; c < w; ++c)
                want[size_t(c)] = float(double(want[size_t(c)]) + s[size_t(c)]);
            if (half) {
                add_col_sums(got.data(), x16.data(), n, ld, w);
            } else {
                add_col_sums(got.data(), x.data(), n, ld, w);
            }
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << "bf16 " << half;  // the element past w untouched too
        }
    }
}

TEST_P(OpsIsaVsRef, SlotRowSumsAreBitwiseTheGenericKernels) {
    // weighted_row_sum and add_row_sum against the generic loops they define, bit for bit: widths
    // around the 32-column steps, 0 to 9 rows, weights and values of every magnitude (so that a
    // fused multiply-add or another order of the adds would show), a -0 row sum (+0 + -0 is +0)
    // and o starting at -0.
    Rng rng(41);
    for (int C : {1, 7, 31, 32, 33, 64, 96, 256, 257}) {
        for (int n : {0, 1, 2, 3, 8, 9}) {
            SCOPED_TRACE(shape({C, n}));
            const size_t nr = static_cast<size_t>(n), nc = static_cast<size_t>(C);
            std::vector<std::vector<float>> rows(nr, std::vector<float>(nc));
            std::vector<const float*> ptr;
            std::vector<float> w(nr);
            for (int j = 0; j < n; ++j) {
                for (auto& v : rows[size_t(j)])
                    v = float(std::ldexp(rng.normal(), int(rng.below(31)) - 15));
                rows[size_t(j)][0] = -0.0f;
                w[size_t(j)]       = float(rng.uniform());
                ptr.push_back(rows[size_t(j)].data());
            }
            std::vector<float> got(nc, 7.0f), want(nc, -7.0f);
            weighted_row_sum(got.data(), w.data(), ptr.data(), n, C);
            generic::weighted_row_sum(want.data(), w.data(), ptr.data(), n, C);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * size_t(C)), 0);
            std::vector<float> o0(nc);
            for (auto& v : o0) v = float(rng.normal());
            o0[0]                = -0.0f;
            std::vector<float> a = o0, b = o0;
            add_row_sum(a.data(), ptr.data(), n, C);
            generic::add_row_sum(b.data(), ptr.data(), n, C);
            EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(C)), 0);
            if (n == 0) {
                EXPECT_FALSE(std::signbit(a[0]));  // -0 + the empty sum's +0
            }
        }
    }
}

TEST_P(OpsIsaVsRef, RankRowsGivesTheStableDescendingOrder) {
    // rank_rows against the stable sort it defines, and every ISA against the generic insertion:
    // rows around the 8-lane steps and the candidate filter's thresholds (2 G 8 <= padded E,
    // R <= 32), rankings from 1 to the whole row, rows of distinct scores and rows of many ties
    // (values from a set of 3, so the order among equals decides most places), -0 beside +0,
    // infinities, and a row with a NaN (ranked by the generic insertion on every ISA).
    Rng rng(23);
    const float inf = std::numeric_limits<float>::infinity();
    for (int E : {1, 2, 7, 8, 9, 15, 16, 17, 33, 64, 65, 256}) {
        for (int R : {1, 2, 3, 8, 9, 16, 17, 32, 33, 64, 256}) {
            if (R > E) continue;
            for (int kind = 0; kind < 3; ++kind) {
                SCOPED_TRACE(shape({E, R, kind}));
                const int64_t n = 37;
                std::vector<float> x(size_t(n * E));
                for (auto& v : x) {
                    v = kind == 0 ? float(rng.normal()) : float(int(rng.below(3)) - 1);
                    if (kind == 2 && rng.below(4) == 0) v = rng.below(2) ? -inf : inf;
                    if (v == 0.0f && rng.below(2)) v = -0.0f;
                }
                x[size_t(E / 2)] = std::numeric_limits<float>::quiet_NaN();  // in row 0
                std::vector<int32_t> top(size_t(n * R), -1), top_gen(size_t(n * R), -2);
                rank_rows(top.data(), x.data(), n, E, R);
                generic::rank_rows(top_gen.data(), x.data(), n, E, R);
                EXPECT_EQ(top, top_gen);
                for (int64_t r = 1; r < n; ++r) {  // the rows without a NaN: the stable sort
                    std::vector<int32_t> want(static_cast<size_t>(E));
                    for (int e = 0; e < E; ++e) want[size_t(e)] = e;
                    const float* l = x.data() + r * E;
                    std::stable_sort(want.begin(), want.end(),
                                     [&](int32_t a, int32_t b) { return l[a] > l[b]; });
                    for (int i = 0; i < R; ++i)
                        ASSERT_EQ(top[size_t(r * R + i)], want[size_t(i)]) << "row " << r;
                }
            }
        }
    }
    // Long rows: a long ranking, and a short one whose scores are all equal (every score a
    // candidate), which go to the insertion, and a short one of distinct scores, which does not.
    for (auto [E, R] : {std::pair{4096, 48}, {4096, 8}}) {
        for (int kind = 0; kind < 2; ++kind) {
            SCOPED_TRACE(shape({E, R, kind}));
            std::vector<float> x(size_t(3) * size_t(E));
            for (auto& v : x) v = kind == 0 ? float(rng.normal()) : 0.5f;
            std::vector<int32_t> top(size_t(3 * R), -1), top_gen(size_t(3 * R), -2);
            rank_rows(top.data(), x.data(), 3, E, R);
            generic::rank_rows(top_gen.data(), x.data(), 3, E, R);
            EXPECT_EQ(top, top_gen);
            if (kind == 1) {
                EXPECT_EQ(top[size_t(R - 1)], R - 1);  // ties: the lowest indices
            }
        }
    }
}

TEST_P(OpsIsaVsRef, ExpF64IsWithinFourUlpAndTheSameOnEverySimdIsa) {
    // Against std::exp: libmvec's vector exp is not correctly rounded; 3 ulp is the largest
    // error measured over 4M arguments in [-750, 710] on the machine this was written on (glibc
    // documents its vector functions to 4 ulp), so 4 ulp is the bound here. The AVX2 and
    // AVX-512 tables run the same libmvec variant, so where both run their bits are equal.
    // Lengths around the 4-wide steps (a padded tail), the router's arguments (g - max <= 0),
    // wide ones, and exp's edges: -inf, 0, -0, underflow to 0, the largest finite result, NaN.
    Rng rng(31);
    const double inf = std::numeric_limits<double>::infinity();
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{64}, int64_t{1027}}) {
        SCOPED_TRACE(n);
        std::vector<double> x(static_cast<size_t>(n));
        for (auto& v : x) {
            const int kind = int(rng.below(3));
            v              = kind == 0   ? -30.0 * rng.uniform()
                             : kind == 1 ? 1400.0 * rng.uniform() - 720.0
                                         : 2.0 * rng.normal();
        }
        const double edges[] = {-inf,   0.0,   -0.0,   -746.0,
                                -708.5, 709.7, 1e-300, std::numeric_limits<double>::quiet_NaN()};
        for (size_t i = 0; i < std::size(edges) && i < x.size(); ++i)
            x[(i * 7) % x.size()] = edges[i];
        std::vector<double> y(size_t(n), -1.0), in_place = x;
        exp_f64(y.data(), x.data(), n);
        exp_f64(in_place.data(), in_place.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double want = std::exp(x[size_t(i)]), got = y[size_t(i)];
            EXPECT_EQ(std::memcmp(&got, &in_place[size_t(i)], sizeof got), 0) << "in place " << i;
            if (std::isnan(want)) {
                EXPECT_TRUE(std::isnan(got)) << x[size_t(i)];
            } else if (want == 0.0 || std::isinf(want)) {
                EXPECT_EQ(got, want) << x[size_t(i)];
            } else {
                const double ulp = std::nextafter(want, inf) - want;
                EXPECT_LE(std::fabs(got - want), 4.0 * ulp) << x[size_t(i)];
            }
        }
        if (GetParam() == Isa::avx512 && isa_supported(Isa::avx2)) {
            std::vector<double> y2(static_cast<size_t>(n));
            kernel_table(Isa::avx2).exp_f64(y2.data(), x.data(), n);
            EXPECT_EQ(std::memcmp(y.data(), y2.data(), sizeof(double) * size_t(n)), 0);
        }
    }
}

TEST_P(OpsIsaVsRef, LayernormIsBitwiseTheGenericKernel) {
    // The SIMD layernorms keep the generic kernel's summation lanes and operation order, without
    // FMA, so they give its bits exactly. C around the 4-double and 8-float steps and the
    // 16-column blocks of the column sums; N large enough to be threaded.
    Rng rng(10);
    for (int N : {1, 7, 129}) {
        for (int C : {1, 3, 4, 5, 8, 15, 16, 17, 33, 257}) {
            SCOPED_TRACE(shape({N, C}));
            auto inp = randn(rng, size_t(N) * C, 2.0, 0.5);
            auto w = randn(rng, size_t(C), 1.0, 1.0), b = randn(rng, size_t(C));
            auto out = nans(inp.size()), out_gen = out;
            auto mean = nans(size_t(N)), mean_gen = mean, rstd = mean, rstd_gen = mean;
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                              N, C);
            generic::layernorm_forward_rows(out_gen.data(), mean_gen.data(), rstd_gen.data(),
                                            inp.data(), w.data(), b.data(), 0, N, C);
            EXPECT_EQ(first_bit_difference(out, out_gen), -1);
            EXPECT_EQ(first_bit_difference(mean, mean_gen), -1);
            EXPECT_EQ(first_bit_difference(rstd, rstd_gen), -1);

            auto dout = randn(rng, inp.size());
            auto dinp = randn(rng, inp.size()), dinp_gen = dinp;  // += onto existing values
            auto dw = randn(rng, size_t(C)), dw_gen = dw, db = randn(rng, size_t(C)), db_gen = db;
            layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                               mean.data(), rstd.data(), N, C);
            generic::layernorm_backward(dinp_gen.data(), dw_gen.data(), db_gen.data(), dout.data(),
                                        inp.data(), w.data(), mean.data(), rstd.data(), N, C);
            EXPECT_EQ(first_bit_difference(dinp, dinp_gen), -1);
            EXPECT_EQ(first_bit_difference(dw, dw_gen), -1);
            EXPECT_EQ(first_bit_difference(db, db_gen), -1);
        }
    }
}

TEST_P(OpsIsaVsRef, AdamwIsBitwiseTheGenericKernel) {
    // The SIMD AdamWs do the generic kernel's float operations in its order, without FMA, with
    // IEEE division and square root: its bits exactly, over several steps, lengths around the
    // 8- and 16-lane steps and one large enough to be threaded; with a gradient scale too.
    Rng rng(11);
    for (float scale : {1.0f, 0.3711f}) {
        for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(17), size_t(33), size_t(100003)}) {
            SCOPED_TRACE(::testing::Message() << "n " << n << " scale " << scale);
            auto p = randn(rng, n), m = randn(rng, n, 0.1), v = randn(rng, n, 0.0, 0.01);
            auto p_gen = p, m_gen = m, v_gen = v;
            for (int step = 1; step <= 3; ++step) {
                auto g = randn(rng, n);
                adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                             0.1f, step, scale);
                generic::adamw_update(p_gen.data(), g.data(), m_gen.data(), v_gen.data(), n, 1e-2f,
                                      0.9f, 0.95f, 1e-8f, 0.1f, step, scale);
            }
            EXPECT_EQ(first_bit_difference(p, p_gen), -1);
            EXPECT_EQ(first_bit_difference(m, m_gen), -1);
            EXPECT_EQ(first_bit_difference(v, v_gen), -1);
        }
    }
}

TEST_P(OpsIsaVsRef, AdamwGradientScaleIsTheScaledGradientsBits) {
    // The clip folded into the update: bitwise scale_inplace(grad, s) then the update, and the
    // gradient left as it was. The scales are ones whose products round (not powers of two), so an
    // ignored scale shows in p, m and v.
    Rng rng(12);
    const size_t n = 50021;
    auto p = randn(rng, n), m = randn(rng, n, 0.1), v = randn(rng, n, 0.0, 0.01);
    auto p2 = p, m2 = m, v2 = v;
    for (int step = 1; step <= 3; ++step) {
        const auto g    = randn(rng, n);
        auto g_scaled   = g;
        auto g_unscaled = g;
        const float s   = 0.1f * float(step) + 0.0123f;
        scale_inplace(g_scaled.data(), s, n);
        adamw_update(p.data(), g_scaled.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step);
        adamw_update(p2.data(), g_unscaled.data(), m2.data(), v2.data(), n, 1e-2f, 0.9f, 0.95f,
                     1e-8f, 0.1f, step, s);
        EXPECT_EQ(first_bit_difference(g_unscaled, g), -1);
    }
    EXPECT_EQ(first_bit_difference(p, p2), -1);
    EXPECT_EQ(first_bit_difference(m, m2), -1);
    EXPECT_EQ(first_bit_difference(v, v2), -1);
}

TEST_P(OpsIsaVsRef, ZeroStreamWritesPositiveZerosOverExactlyTheRange) {
    // zero_stream: +0 (all bits clear) over [off, off + n) whatever the alignment (the streamed
    // part starts at a vector boundary), nothing written outside.
    for (size_t off = 0; off < 17; ++off) {
        for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(15), size_t(16),
                         size_t(33), size_t(1000)}) {
            SCOPED_TRACE(::testing::Message() << "offset " << off << ", " << n);
            std::vector<float> x(off + n + 20, -3.5f);
            zero_stream(x.data() + off, n);
            for (size_t i = 0; i < x.size(); ++i) {
                uint32_t bits;
                std::memcpy(&bits, &x[i], sizeof bits);
                if (i >= off && i < off + n) {
                    ASSERT_EQ(bits, 0u) << i;
                } else {
                    ASSERT_EQ(x[i], -3.5f) << i;
                }
            }
        }
    }
}

TEST_P(OpsIsaVsRef, BiasAddIsTheScalarAdd) {
    // bias_add: o[i] + bias[i], one float add an element, whatever the ISA: random bit patterns
    // (NaNs, infinities, denormals, signed zeros among them) and ordinary sums, lengths around
    // the 8-lane step; nothing past n is touched.
    Rng rng(41);
    for (size_t n :
         {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(23), size_t(1001)}) {
        SCOPED_TRACE(n);
        std::vector<float> o(n + 3, 7.0f), bias(n + 3, 5.0f);
        for (size_t i = 0; i < n; ++i) {
            const uint32_t u = uint32_t(rng.next_u64() >> 32), v = uint32_t(rng.next_u64() >> 32);
            std::memcpy(&o[i], &u, sizeof u);
            std::memcpy(&bias[i], &v, sizeof v);
            if (i % 2) o[i] = float(rng.normal());
            if (i % 3) bias[i] = i % 5 ? float(rng.normal()) : -0.0f;
        }
        std::vector<float> want = o;
        for (size_t i = 0; i < n; ++i) want[i] = o[i] + bias[i];
        dispatch().bias_add(o.data(), bias.data(), n);
        EXPECT_EQ(first_bit_difference(o, want), -1);
    }
}

TEST_P(OpsIsaVsRef, Bf16BiasRoundIsTheAddThenTheScalarRounding) {
    // bf16_bias_round: o + bias rounded (bf16_from_float), stored as float and as its 16 bits,
    // with and without a bias and a 16-bit output, on sums of every class (the specials of the
    // conversions' test as o with a zero bias, then random bit patterns and random sums), lengths
    // around the 8- and 16-lane steps.
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u,
                                 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff800000u, 0x7fc00000u,
                                 0xffc00001u, 0x7f800001u, 0x00ff8000u};
    Rng rng(29);
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(15), size_t(16), size_t(17),
                     size_t(37), size_t(1001)}) {
        for (const bool with_bias : {false, true}) {
            for (const bool with_half : {false, true}) {
                SCOPED_TRACE(::testing::Message()
                             << n << (with_bias ? " bias" : "") << (with_half ? " half" : ""));
                std::vector<float> o(n), bias(n);
                for (size_t i = 0; i < n; ++i) {
                    const uint32_t u =
                        i < std::size(specials) ? specials[i] : uint32_t(rng.next_u64() >> 32);
                    std::memcpy(&o[i], &u, sizeof u);
                    bias[i] = i < std::size(specials) || i % 3 == 0 ? 0.0f : float(rng.normal());
                    if (i >= std::size(specials) && i % 3 == 1) o[i] = float(rng.normal());
                }
                std::vector<float> want = o;
                std::vector<uint16_t> want16(n), got16(n, 0x1234);
                for (size_t i = 0; i < n; ++i) {
                    want16[i] = bf16_from_float(with_bias ? o[i] + bias[i] : o[i]);
                    want[i]   = bf16_to_float(want16[i]);
                }
                dispatch().bf16_bias_round(o.data(), with_bias ? bias.data() : nullptr,
                                           with_half ? got16.data() : nullptr, n);
                ASSERT_EQ(first_bit_difference(o, want), -1);
                if (with_half) {
                    EXPECT_EQ(std::memcmp(got16.data(), want16.data(), n * 2), 0);
                } else {
                    EXPECT_EQ(got16, std::vector<uint16_t>(n, 0x1234)) << "no 16-bit output";
                }
            }
        }
    }
}

TEST_P(OpsIsaVsRef, Bf16ConversionsAreBitwiseTheScalarRounding) {
    // The table's bf16 narrowing, rounding and widening against core/dtype.h's scalar functions
    // on every class of float: ties to even both ways, carries into the exponent, the largest
    // finite values (which round to infinity), infinities, quiet and signalling NaNs of both
    // signs, zeros and denormals (which SIMD conversion instructions flush), plus random values;
    // lengths around the 8- and 16-lane steps; rounding in place too, where the input is half
    // rounded already (every other vector).
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u,
                                 0x00018000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3fffffffu,
                                 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                 0xffc00001u, 0x7f800001u, 0xff8fffffu, 0x7fffffffu, 0x00ff8000u};
    Rng rng(23);
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(15), size_t(16), size_t(17),
                     size_t(37), size_t(100003)}) {
        SCOPED_TRACE(n);
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) {
            const uint32_t u = i < std::size(specials) && n < 1000
                                   ? specials[i]
                                   : uint32_t(rng.next_u64() >> 32);  // any bit pattern
            std::memcpy(&x[i], &u, sizeof u);
        }
        std::vector<uint16_t> narrow(n), narrow_ref(n);
        std::vector<float> rounded(n), rounded_ref(n), widened(n), widened_ref(n);
        dispatch().bf16_narrow(narrow.data(), x.data(), n);
        // scaled: the products' float rounding, then the same narrowing (scales that keep,
        // round, overflow to infinity, make denormals and zeros, and flip the sign)
        for (const float w : {1.0f, 0.3f, -1.7f, 3.0e38f, 1.0e-38f, 0.0f}) {
            std::vector<uint16_t> scaled(n), scaled_ref(n);
            dispatch().bf16_narrow_scaled(scaled.data(), x.data(), w, n);
            for (size_t i = 0; i < n; ++i) scaled_ref[i] = bf16_from_float(w * x[i]);
            EXPECT_EQ(scaled, scaled_ref) << "scale " << w;
        }
        dispatch().bf16_round(rounded.data(), x.data(), n);
        dispatch().bf16_widen(widened.data(), narrow.data(), n);
        for (size_t i = 0; i < n; ++i) {
            narrow_ref[i]  = bf16_from_float(x[i]);
            rounded_ref[i] = bf16_to_float(bf16_from_float(x[i]));
            widened_ref[i] = bf16_to_float(narrow_ref[i]);
        }
        // in place, as the weights are rounded: the same bits (a vector already rounded is
        // left unwritten)
        std::vector<float> in_place = x;
        for (size_t i = 0; i < n; i += 16) {  // vectors already rounded next to ones that are not
            for (size_t j = i; j < std::min(n, i + 8); ++j) in_place[j] = rounded_ref[j];
        }
        dispatch().bf16_round(in_place.data(), in_place.data(), n);
        // streamed into an output at each 4-byte offset from a 64-byte line (the stores are
        // whole aligned vectors between a head and a tail)
        std::vector<float> streamed(n + 16);
        for (size_t off = 0; off < 16; ++off) {
            std::fill(streamed.begin(), streamed.end(), -1.0f);
            float* out = streamed.data() +
                         (16 - reinterpret_cast<uintptr_t>(streamed.data()) % 64 / 4 + off) % 16;
            if (out + n > streamed.data() + streamed.size()) continue;
            dispatch().bf16_round_stream(out, x.data(), n);
            ASSERT_EQ(first_bit_difference(std::vector<float>(out, out + n), rounded_ref), -1)
                << "streamed at offset " << off;
        }
        EXPECT_EQ(narrow, narrow_ref);
        EXPECT_EQ(first_bit_difference(rounded, rounded_ref), -1);
        EXPECT_EQ(first_bit_difference(in_place, rounded_ref), -1);
        EXPECT_EQ(first_bit_difference(widened, widened_ref), -1);
    }
}

// Attention forward and backward on random (B, T, 3C) qkv of standard deviation `scale`
// against the reference, within tol; backward from the reference's out and lse.
void check_attention(Rng& rng, int B, int T, int NH, int hs, double scale, double tol) {
    const int C = NH * hs;
    SCOPED_TRACE(shape({B, T, C, NH}));
    auto qkv = randn(rng, size_t(B) * T * 3 * C, scale);
    auto out = nans(size_t(B) * T * C), out_ref = out;
    auto lse = nans(size_t(B) * NH * T), lse_ref = lse;
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    ref::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), B, T, C, NH);
    EXPECT_CLOSE(out, out_ref, tol);
    EXPECT_CLOSE(lse, lse_ref, tol);

    auto dout = randn(rng, out.size());
    auto dqkv = nans(qkv.size()), dqkv_ref = dqkv;
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T,
                       C, NH);
    ref::attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), out_ref.data(),
                            lse_ref.data(), B, T, C, NH);
    EXPECT_CLOSE(dqkv, dqkv_ref, tol);
}

TEST_P(OpsIsaVsRef, Attention) {
    // Scores are float sums over hs <= 64 terms of O(1) values, scaled to O(1); probabilities
    // use a float exp, out/dq/dk/dv are float sums over <= 130 key or query rows of O(1)
    // terms: errors are ~1e-6 of O(1) values (seen: 8e-7 at hs <= 16); 5e-6 on
    // |d| / (1 + |ref|). A wrong mask, scale or sign is off by O(0.1) or more.
    // hs = 3 runs the portable loops, multiples of 8 the SIMD kernels where the ISA has them;
    // T = 1, 15, 16, 17 and 130 cover a lone query and ragged or exact 16-row query blocks.
    constexpr double kTol = 5e-6;
    Rng rng(5);
    const int B = 2;
    for (int T : {1, 5, 15, 16, 17, 64, 130}) {
        for (int NH : {1, 2, 4}) {
            for (int hs : {3, 8, 16, 24, 64}) check_attention(rng, B, T, NH, hs, 1.0, kTol);
        }
    }
}

TEST(OpsAvx512, AttentionIsBitwiseTheAvx2Kernel) {
    // The AVX-512 attention runs the AVX2 kernel's operations lane for lane (kernels/avx512/
    // attention.cpp), so its outputs, log-sum-exps and gradients are the AVX2 ones to the last
    // bit: head sizes 16 to 80 (tiles of 64, 32 and 16 columns), ragged query blocks, and peaked
    // scores whose exponentials underflow; hs = 24 takes the AVX2 items from the AVX-512 table.
    if (!isa_supported(Isa::avx512)) GTEST_SKIP() << "this CPU lacks AVX-512F/BW/VL/DQ";
    const KernelTable &x = kernel_table(Isa::avx512), &y = kernel_table(Isa::avx2);
    Rng rng(11);
    const int B = 2, NH = 2;
    for (double scale : {1.0, 4.0}) {
        for (int T : {1, 17, 40, 130}) {
            for (int hs : {16, 24, 32, 48, 64, 80}) {
                const int C = NH * hs;
                SCOPED_TRACE(shape({B, T, C, NH}));
                auto qkv = randn(rng, size_t(B) * T * 3 * C, scale);
                auto out = nans(size_t(B) * T * C), out2 = out;
                auto lse = nans(size_t(B) * NH * T), lse2 = lse;
                x.attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
                y.attention_forward(out2.data(), lse2.data(), qkv.data(), B, T, C, NH);
                EXPECT_EQ(first_bit_difference(out, out2), -1);
                EXPECT_EQ(first_bit_difference(lse, lse2), -1);
                auto dout = randn(rng, out.size());
                auto dqkv = nans(qkv.size()), dqkv2 = dqkv;
                x.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                     B, T, C, NH);
                y.attention_backward(dqkv2.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                     B, T, C, NH);
                EXPECT_EQ(first_bit_difference(dqkv, dqkv2), -1);
            }
        }
    }
}

TEST(OpsAvx512, CrossentropyIsBitwiseTheAvx2Rows) {
    // The AVX-512 rows add each exponential to the double lane the AVX2 rows add it to, in the
    // same order (kernels/avx512/crossentropy.cpp), so losses and gradients are the AVX2 ones to
    // the last bit: widths around the 8- and 16-column steps, a peaked row whose exponentials
    // underflow, -inf logits, the gradient in place. A block left out or a wrong mask changes the
    // losses (checked); a different order of the double sums seldom shows in a float result.
    if (!isa_supported(Isa::avx512)) GTEST_SKIP() << "this CPU lacks AVX-512F/BW/VL/DQ";
    const KernelTable &x = kernel_table(Isa::avx512), &y = kernel_table(Isa::avx2);
    Rng rng(12);
    const int N = 37;
    for (int V : {1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 100, 8192}) {
        for (double scale : {3.0, 40.0}) {
            SCOPED_TRACE(shape({N, V}));
            auto logits                               = randn(rng, size_t(N) * V, scale);
            auto targets                              = rand_ints(rng, size_t(N), V);
            auto dlosses                              = randn(rng, size_t(N));
            logits[size_t(N / 2) * V + size_t(V - 1)] = -std::numeric_limits<float>::infinity();
            auto losses = nans(size_t(N)), losses2 = losses;
            auto lse = nans(size_t(N)), lse2 = lse;
            x.crossentropy_forward(losses.data(), logits.data(), targets.data(), 0, N, V,
                                   lse.data());
            y.crossentropy_forward(losses2.data(), logits.data(), targets.data(), 0, N, V,
                                   lse2.data());
            EXPECT_EQ(first_bit_difference(losses, losses2), -1);
            EXPECT_EQ(first_bit_difference(lse, lse2), -1);
            auto d = nans(logits.size()), d2 = d, d3 = d;
            x.crossentropy_backward(d.data(), logits.data(), targets.data(), dlosses.data(), 0, N,
                                    V, nullptr);
            y.crossentropy_backward(d2.data(), logits.data(), targets.data(), dlosses.data(), 0, N,
                                    V, nullptr);
            EXPECT_EQ(first_bit_difference(d, d2), -1);
            x.crossentropy_backward(d3.data(), logits.data(), targets.data(), dlosses.data(), 0, N,
                                    V, lse.data());  // the forward's logsumexps
            EXPECT_EQ(first_bit_difference(d3, d2), -1);
            x.crossentropy_backward(logits.data(), logits.data(), targets.data(), dlosses.data(), 0,
                                    N, V, lse.data());  // in place
            EXPECT_EQ(first_bit_difference(logits, d2), -1);
        }
    }
}

TEST_P(OpsIsaVsRef, AttentionPeakedScores) {
    // q, k, v ~ N(0, 16): scaled scores have a spread of ~16 per row (up to ~+-60), so many
    // probabilities underflow (exp below -87.3 is 0) and each row is dominated by a few keys.
    // A score is a float sum of hs products of size ~16, off by ~hs * 16 * 2^-24 * 8 ~ 5e-5 at
    // hs = 64 before the 1/8 scale; a probability is off by that relative, out and its
    // gradients (values ~4, products of two such) by ~1e-4 relative (seen: 4.4e-5). 3e-4 on
    // |d| / (1 + |ref|); a wrong mask or an underflow turned into garbage is off by O(1).
    constexpr double kTol = 3e-4;
    Rng rng(7);
    const int B = 2, NH = 2;
    for (int T : {17, 40}) {
        for (int hs : {16, 64}) check_attention(rng, B, T, NH, hs, 4.0, kTol);
    }
}

TEST_P(OpsIsaVsRef, Crossentropy) {
    // The exponential sums are in double in both; the loss is off by the final rounding of
    // lse ~ 10 (1e-6), probabilities by expf of an argument rounded at |lse| (~1e-6 relative).
    constexpr double kTol = 2e-6;
    Rng rng(6);
    for (int N : kRows) {
        for (int V : {1, 2, 15, 16, 1000}) {
            SCOPED_TRACE(shape({N, V}));
            auto logits  = randn(rng, size_t(N) * V, 3.0);
            auto targets = rand_ints(rng, size_t(N), V);
            auto dlosses = randn(rng, size_t(N));
            auto losses = nans(size_t(N)), losses_ref = losses;
            crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
            ref::crossentropy_forward(losses_ref.data(), logits.data(), targets.data(), N, V);
            EXPECT_CLOSE(losses, losses_ref, kTol);

            auto dlogits = nans(logits.size()), dlogits_ref = dlogits;
            crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dlosses.data(), N,
                                  V);
            ref::crossentropy_backward(dlogits_ref.data(), logits.data(), targets.data(),
                                       dlosses.data(), N, V);
            EXPECT_CLOSE(dlogits, dlogits_ref, kTol);
            // with the forward's logsumexps: the same bits
            auto lse = nans(size_t(N)), losses2 = lse, dlogits2 = dlogits;
            crossentropy_forward(losses2.data(), logits.data(), targets.data(), N, V, lse.data());
            EXPECT_EQ(losses2, losses);
            crossentropy_backward(dlogits2.data(), logits.data(), targets.data(), dlosses.data(), N,
                                  V, lse.data());
            EXPECT_EQ(dlogits2, dlogits);
            crossentropy_backward(logits.data(), logits.data(), targets.data(), dlosses.data(), N,
                                  V);  // in place
            EXPECT_EQ(logits, dlogits);
        }
    }
}

TEST_P(OpsIsaVsRef, AdamwNormsScale) {
    // AdamW: a few float operations per element, 1e-6 relative. sum_squares: both in double,
    // only the summation order differs: 1e-12 relative. scale: one float multiplication, exact.
    Rng rng(7);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
        SCOPED_TRACE(n);
        auto p = randn(rng, n), m = randn(rng, n, 0.1), v = randn(rng, n, 0.0, 0.01);
        auto p_ref = p, m_ref = m, v_ref = v;
        for (int step = 1; step <= 3; ++step) {
            auto g = randn(rng, n);
            adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                         step);
            ref::adamw_update<float>(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 1e-2f,
                                     0.9f, 0.95f, 1e-8f, 0.1f, step);
        }
        EXPECT_CLOSE(p, p_ref, 1e-6);
        EXPECT_CLOSE(m, m_ref, 1e-6);
        EXPECT_CLOSE(v, v_ref, 1e-6);

        const double ss = sum_squares(p.data(), n), ss_ref = ref::sum_squares(p.data(), n);
        EXPECT_NEAR(ss, ss_ref, 1e-12 * ss_ref);
        auto s = p, s_ref = p;
        scale_inplace(s.data(), 0.37f, n);
        ref::scale_inplace<float>(s_ref.data(), 0.37f, n);
        EXPECT_EQ(s, s_ref);
    }
}

// ---- 2. ref backward (double) vs central finite differences ----

using Vec = std::vector<double>;

// Central differences of loss() with respect to every element of x, compared to grad.
// Returns max_i |fd_i - grad_i| / max(|grad_i|, 1e-2 * max_j |grad_j|, 1e-12): relative per
// element, with a floor so elements that are ~0 are judged on 1% of the tensor's scale.
double fd_error(Vec& x, const Vec& grad, const std::function<double()>& loss) {
    constexpr double kEps = 1e-5;
    double gmax           = 0.0;
    for (double g : grad) gmax = std::max(gmax, std::fabs(g));
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i]            = x0 + kEps;
        const double lp = loss();
        x[i]            = x0 - kEps;
        const double lm = loss();
        x[i]            = x0;
        const double fd = (lp - lm) / (2 * kEps);
        const double e =
            std::fabs(fd - grad[i]) / std::max({std::fabs(grad[i]), 1e-2 * gmax, 1e-12});
        worst = std::max(worst, e);
    }
    return worst;
}

double dot(const Vec& a, const Vec& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// Central differences in double. eps = 1e-5 balances truncation (~eps^2 |f'''| / 6 ~ 1e-11)
// against rounding (~1e-16 |L| / eps ~ 1e-11); with eps = 1e-6 rounding alone reaches 1e-7
// relative on small elements. Seen: <= 1e-8 relative; any real mistake is >= 1e-3 relative.
constexpr double kFdTol = 1e-7;

TEST(OpsRefGrad, FdCheckerCatchesAWrongGradient) {
    Vec x     = {0.3, -1.2, 2.0};
    auto loss = [&] { return x[0] * x[1] + std::sin(x[2]); };
    Vec g     = {x[1], x[0], std::cos(x[2])};
    EXPECT_LE(fd_error(x, g, loss), kFdTol);
    g[2] *= 1.0 + 1e-5;  // a gradient 1e-5 off is caught
    EXPECT_GT(fd_error(x, g, loss), kFdTol);
}

TEST(OpsRefGrad, Linear) {
    Rng rng(11);
    const int N = 3, IC = 4, OC = 5;
    Vec inp = randn<double>(rng, N * IC), w = randn<double>(rng, OC * IC);
    Vec bias = randn<double>(rng, OC), r = randn<double>(rng, N * OC), out(N * OC);
    auto loss = [&] {
        ref::linear_forward(out.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
        return dot(r, out);
    };
    Vec dinp(inp.size()), dw(w.size(), 0.0), db(bias.size(), 0.0);
    ref::linear_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, IC,
                         OC);
    EXPECT_LE(fd_error(inp, dinp, loss), kFdTol);
    EXPECT_LE(fd_error(w, dw, loss), kFdTol);
    EXPECT_LE(fd_error(bias, db, loss), kFdTol);
}

TEST(OpsRefGrad, Embedding) {
    Rng rng(12);
    const int B = 2, T = 3, C = 4, V = 5, maxT = 4;
    auto tokens = rand_ints(rng, B * T, V);
    Vec wte = randn<double>(rng, V * C), wpe = randn<double>(rng, maxT * C);
    Vec r     = randn<double>(rng, B * T * C), out(B * T * C);
    auto loss = [&] {
        ref::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
        return dot(r, out);
    };
    Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
    ref::embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
    EXPECT_LE(fd_error(wte, dwte, loss), kFdTol);
    EXPECT_LE(fd_error(wpe, dwpe, loss), kFdTol);
}

TEST(OpsRefGrad, Layernorm) {
    Rng rng(13);
    const int N = 3, C = 6;
    Vec inp = randn<double>(rng, N * C, 1.5, 0.3), w = randn<double>(rng, C, 1.0, 1.0);
    Vec b = randn<double>(rng, C), r = randn<double>(rng, N * C);
    Vec out(N * C), mean(N), rstd(N);
    auto loss = [&] {
        ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                               N, C);
        return dot(r, out);
    };
    loss();
    const Vec mean0 = mean, rstd0 = rstd;
    Vec dinp(inp.size(), 0.0), dw(C, 0.0), db(C, 0.0);
    ref::layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(),
                            mean0.data(), rstd0.data(), N, C);
    EXPECT_LE(fd_error(inp, dinp, loss), kFdTol);
    EXPECT_LE(fd_error(w, dw, loss), kFdTol);
    EXPECT_LE(fd_error(b, db, loss), kFdTol);
}

TEST(OpsRefGrad, Gelu) {
    Rng rng(14);
    const size_t n = 20;
    Vec x = randn<double>(rng, n, 2.0), r = randn<double>(rng, n), out(n);
    auto loss = [&] {
        ref::gelu_forward(out.data(), x.data(), n);
        return dot(r, out);
    };
    Vec dx(n);
    ref::gelu_backward(dx.data(), x.data(), r.data(), n);
    EXPECT_LE(fd_error(x, dx, loss), kFdTol);
}

TEST(OpsRefGrad, Attention) {
    Rng rng(15);
    const int B = 2, T = 4, C = 6, NH = 2;
    Vec qkv = randn<double>(rng, B * T * 3 * C), r = randn<double>(rng, B * T * C);
    Vec out(B * T * C), lse(B * NH * T);
    auto loss = [&] {
        ref::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        return dot(r, out);
    };
    loss();
    const Vec out0 = out, lse0 = lse;
    Vec dqkv(qkv.size());
    ref::attention_backward(dqkv.data(), r.data(), qkv.data(), out0.data(), lse0.data(), B, T, C,
                            NH);
    EXPECT_LE(fd_error(qkv, dqkv, loss), kFdTol);
}

TEST(OpsRefGrad, Crossentropy) {
    Rng rng(16);
    const int N = 3, V = 7;
    Vec logits = randn<double>(rng, N * V, 2.0), r = randn<double>(rng, N), losses(N);
    auto targets = rand_ints(rng, N, V);
    auto loss    = [&] {
        ref::crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
        return dot(r, losses);
    };
    Vec dlogits(logits.size());
    ref::crossentropy_backward(dlogits.data(), logits.data(), targets.data(), r.data(), N, V);
    EXPECT_LE(fd_error(logits, dlogits, loss), kFdTol);
}

// ---- 3. += and = conventions: a second backward call doubles += outputs only ----
// Once per ISA: the dispatched families' conventions hold for every table.

class OpsAccumulate : public IsaTest {};
BGL_INSTANTIATE_ISAS(OpsAccumulate);

// x + x is exact, but the second call adds a freshly rounded sum to the first: 1e-6 relative.
constexpr double kTwiceTol = 1e-6;

std::vector<float> doubled(std::vector<float> x) {
    for (auto& v : x) v *= 2.f;
    return x;
}

TEST_P(OpsAccumulate, LinearParamsAccumulateDinpOverwrites) {
    Rng rng(21);
    const int N = 7, IC = 15, OC = 16;
    auto inp = randn(rng, N * IC), w = randn(rng, OC * IC), dout = randn(rng, N * OC);
    std::vector<float> dinp(N * IC), dw(OC * IC, 0.f), db(OC, 0.f);
    linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                    OC);
    const auto dinp1 = dinp, dw1 = dw, db1 = db;
    linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                    OC);
    EXPECT_EQ(dinp, dinp1);
    EXPECT_CLOSE(dw, doubled(dw1), kTwiceTol);
    EXPECT_CLOSE(db, doubled(db1), kTwiceTol);
}

TEST_P(OpsAccumulate, LayernormAllAccumulate) {
    Rng rng(22);
    const int N = 7, C = 15;
    auto inp = randn(rng, N * C), w = randn(rng, C), b = randn(rng, C), dout = randn(rng, N * C);
    std::vector<float> out(N * C), mean(N), rstd(N), dinp(N * C, 0.f), dw(C, 0.f), db(C, 0.f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    auto bwd = [&] {
        layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    };
    bwd();
    const auto dinp1 = dinp, dw1 = dw, db1 = db;
    bwd();
    EXPECT_CLOSE(dinp, doubled(dinp1), kTwiceTol);
    EXPECT_CLOSE(dw, doubled(dw1), kTwiceTol);
    EXPECT_CLOSE(db, doubled(db1), kTwiceTol);
}

TEST_P(OpsAccumulate, EmbeddingAccumulates) {
    Rng rng(23);
    const int B = 2, T = 7, C = 16, V = 5;
    auto tokens = rand_ints(rng, B * T, V);
    auto dout   = randn(rng, B * T * C);
    std::vector<float> dwte(V * C, 0.f), dwpe(T * C, 0.f);
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    const auto dwte1 = dwte, dwpe1 = dwpe;
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    EXPECT_CLOSE(dwte, doubled(dwte1), kTwiceTol);
    EXPECT_CLOSE(dwpe, doubled(dwpe1), kTwiceTol);
}

TEST_P(OpsAccumulate, ActivationGradsOverwrite) {
    Rng rng(24);
    const int B = 2, T = 5, C = 8, NH = 2, V = 11;
    auto qkv = randn(rng, B * T * 3 * C), dout = randn(rng, B * T * C);
    std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    auto dqkv1 = dqkv;
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    EXPECT_EQ(dqkv, dqkv1);

    auto logits = randn(rng, B * T * V), dl = randn(rng, B * T);
    auto targets = rand_ints(rng, B * T, V);
    std::vector<float> dlogits(logits.size());
    crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dl.data(), B * T, V);
    auto dlogits1 = dlogits;
    crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dl.data(), B * T, V);
    EXPECT_EQ(dlogits, dlogits1);

    std::vector<float> dx(out.size());
    gelu_backward(dx.data(), out.data(), dout.data(), out.size());
    auto dx1 = dx;
    gelu_backward(dx.data(), out.data(), dout.data(), out.size());
    EXPECT_EQ(dx, dx1);
}

TEST_P(OpsAccumulate, RefParamsAccumulate) {
    Rng rng(25);
    const int N = 3, IC = 4, OC = 5;
    Vec inp = randn<double>(rng, N * IC), w = randn<double>(rng, OC * IC);
    Vec dout = randn<double>(rng, N * OC), dinp(N * IC), dw(OC * IC, 0.0), db(OC, 0.0);
    ref::linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                         IC, OC);
    const Vec dinp1 = dinp, dw1 = dw, db1 = db;
    ref::linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                         IC, OC);
    EXPECT_EQ(dinp, dinp1);
    for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw[i], 2 * dw1[i]);
    for (size_t i = 0; i < db.size(); ++i) EXPECT_DOUBLE_EQ(db[i], 2 * db1[i]);
}

// ---- 4. AdamW by hand, on every ISA's table ----

class OpsAdamw : public IsaTest {};
BGL_INSTANTIATE_ISAS(OpsAdamw);

TEST_P(OpsAdamw, MatchesHandComputation) {
    // lr = 0.1, wd = 0.01, eps = 1e-8, and betas that are short binary fractions, b1 = 7/8 and
    // b2 = 127/128, so every moment and bias correction below is exact in float.
    // With a constant gradient g: m_k = g (1 - b1^k), v_k = g^2 (1 - b2^k), so the corrected
    // moments are exactly g and g^2 and each step is p <- p - lr (sign(g) + wd p) (eps is below
    // half an ulp of |g|). With g = 0 the moments stay 0 and p <- p (1 - lr wd).
    std::vector<float> p = {1.f, -1.f, 2.f}, g = {0.5f, -2.f, 0.f};
    std::vector<float> m(3, 0.f), v(3, 0.f);
    const float want[3][3] = {{0.899f, -0.899f, 1.998f},
                              {0.798101f, -0.798101f, 1.996002f},
                              {0.697302899f, -0.697302899f, 1.994005998f}};
    for (int step = 1; step <= 3; ++step) {
        adamw_update(p.data(), g.data(), m.data(), v.data(), 3, 0.1f, 0.875f, 0.9921875f, 1e-8f,
                     0.01f, step);
        // p changes by ~0.1 per step in float arithmetic: a few ulp of 1, 1e-6.
        for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], want[step - 1][i], 1e-6) << step << " " << i;
    }
    // 1 - (7/8)^3 = 169/512, 1 - (127/128)^3 = 48769/2^21.
    EXPECT_EQ(m[0], 0.5f * 169.f / 512.f);
    EXPECT_EQ(m[1], -2.f * 169.f / 512.f);
    EXPECT_EQ(v[0], 0.25f * 48769.f / 2097152.f);
    EXPECT_EQ(v[1], 4.f * 48769.f / 2097152.f);
    EXPECT_EQ(m[2], 0.f);
    EXPECT_EQ(v[2], 0.f);
}

// ---- 5. results do not depend on the thread count, on every ISA's table ----

class OpsThreads : public IsaTest {};
BGL_INSTANTIATE_ISAS(OpsThreads);

// Runs every fast kernel on shapes large enough to be threaded and returns all outputs.
std::vector<std::vector<float>> run_all_kernels() {
    Rng rng(31);
    const int N = 129, IC = 257, OC = 257, B = 3, T = 43, C = 257, V = 1000;
    std::vector<std::vector<float>> res;
    auto keep = [&](std::vector<float> x) { res.push_back(std::move(x)); };

    auto inp = randn(rng, N * IC), w = randn(rng, OC * IC), bias = randn(rng, OC);
    auto dout = randn(rng, N * OC);
    std::vector<float> out(N * OC), dinp(N * IC), dw(OC * IC, 0.f), db(OC, 0.f);
    linear_forward(out.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
    linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                    OC);
    keep(out), keep(dinp), keep(dw), keep(db);

    auto tokens = rand_ints(rng, B * T, 50);
    auto wte = randn(rng, 50 * C), wpe = randn(rng, T * C), eout = randn(rng, B * T * C);
    std::vector<float> emb(B * T * C), dwte(50 * C, 0.f), dwpe(T * C, 0.f);
    embedding_forward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    embedding_backward(dwte.data(), dwpe.data(), eout.data(), tokens.data(), B, T, C);
    keep(emb), keep(dwte), keep(dwpe);

    auto lw = randn(rng, IC), lb = randn(rng, IC), ldout = randn(rng, N * IC);
    std::vector<float> ln(N * IC), mean(N), rstd(N), ldinp(N * IC, 0.f), ldw(IC, 0.f), ldb(IC, 0.f);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), inp.data(), lw.data(), lb.data(), N, IC);
    layernorm_backward(ldinp.data(), ldw.data(), ldb.data(), ldout.data(), inp.data(), lw.data(),
                       mean.data(), rstd.data(), N, IC);
    keep(ln), keep(mean), keep(rstd), keep(ldinp), keep(ldw), keep(ldb);

    std::vector<float> g(inp.size()), dg(inp.size()), sum(inp.size());
    gelu_forward(g.data(), inp.data(), inp.size());
    gelu_backward(dg.data(), inp.data(), ldout.data(), inp.size());
    add_forward(sum.data(), inp.data(), ldout.data(), inp.size());
    keep(g), keep(dg), keep(sum);

    const int AB = 2, AT = 130, AC = 64, NH = 4;
    auto qkv = randn(rng, AB * AT * 3 * AC), adout = randn(rng, AB * AT * AC);
    std::vector<float> aout(AB * AT * AC), lse(AB * NH * AT), dqkv(qkv.size());
    attention_forward(aout.data(), lse.data(), qkv.data(), AB, AT, AC, NH);
    attention_backward(dqkv.data(), adout.data(), qkv.data(), aout.data(), lse.data(), AB, AT, AC,
                       NH);
    keep(aout), keep(lse), keep(dqkv);
    // A head size the SIMD kernels do not take (the portable loops).
    const int PC = 3 * NH;
    auto pqkv = randn(rng, AB * AT * 3 * PC), pdout = randn(rng, AB * AT * PC);
    std::vector<float> pout(AB * AT * PC), plse(AB * NH * AT), pdqkv(pqkv.size());
    attention_forward(pout.data(), plse.data(), pqkv.data(), AB, AT, PC, NH);
    attention_backward(pdqkv.data(), pdout.data(), pqkv.data(), pout.data(), plse.data(), AB, AT,
                       PC, NH);
    keep(pout), keep(plse), keep(pdqkv);

    auto logits = randn(rng, N * V, 3.0), dl = randn(rng, N);
    auto targets = rand_ints(rng, N, V);
    std::vector<float> losses(N), dlogits(logits.size());
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dl.data(), N, V);
    keep(losses), keep(dlogits);

    std::vector<float> m(logits.size(), 0.f), v(logits.size(), 0.f), p = logits;
    adamw_update(p.data(), dlogits.data(), m.data(), v.data(), p.size(), 1e-3f, 0.9f, 0.95f, 1e-8f,
                 0.1f, 1);
    scale_inplace(p.data(), 0.5f, p.size());
    keep(p), keep(m), keep(v);
    const double ss = sum_squares(logits.data(), logits.size());
    std::vector<float> ss_bits(2);
    std::memcpy(ss_bits.data(), &ss, sizeof(ss));
    keep(ss_bits);
    return res;
}

// sum_squares is its definition to the last bit (the gradient norm's clip factor, and so every
// update, depends on it): 64 fixed blocks of the n squares, each summed in double in four lanes
// (element i into lane i mod 4, the tail's into the lanes from 0), the lanes combined as (0 + 2)
// + (1 + 3), the blocks' sums added in order. A last-bit difference in one block's sum would
// vanish in the total of all 64, so the squares are nonzero in one block at a time, of every
// position within the four the kernel takes at once, and the block lengths differ by one.
TEST(SumSquares, IsItsBlockedDefinitionBitwise) {
    Rng rng(5);
    for (int64_t n : {int64_t{1} << 16, (int64_t{1} << 16) + 37, int64_t{1000003}}) {
        for (int64_t only : {0, 1, 2, 3, 6, 33, 63}) {
            std::vector<float> x(static_cast<size_t>(n), 0.0f);
            const int64_t lo = n * only / 64, len = n * (only + 1) / 64 - lo;
            // magnitudes over 2^-20 .. 2^20, so that the order of the adds shows in the last bits
            for (int64_t i = 0; i < len; ++i)
                x[size_t(lo + i)] = float(std::ldexp(rng.normal(), int(rng.below(41)) - 20));
            double acc[4] = {0.0, 0.0, 0.0, 0.0};
            for (int64_t i = 0; i < len; ++i) {
                const double t = double(x[size_t(lo + i)]) * x[size_t(lo + i)];
                acc[i < len / 4 * 4 ? i % 4 : i - len / 4 * 4] += t;
            }
            const double want = (acc[0] + acc[2]) + (acc[1] + acc[3]);
            for (int threads = 1; threads <= 3; ++threads) {
                set_compute_threads(threads);
                const double got = sum_squares(x.data(), size_t(n));
                EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
                    << "n " << n << ", block " << only << ", " << threads << " threads: " << got
                    << " vs " << want;
            }
        }
    }
    set_compute_threads(0);
}

// sum_squares_runs is the in-order total of sum_squares over its runs to the last bit (ParO's
// norm over its pieces): runs of one block and of 64, empty ones, lengths around the 4-value
// steps and the threading threshold, values whose order of adds shows in the last bits, on 1-3
// threads (the blocks of several runs share a thread's range then).
TEST(SumSquares, RunsAreTheirSumSquaresAddedInOrderBitwise) {
    Rng rng(9);
    const std::vector<size_t> lens = {0, 1, 3, 4, 5, 17, 16383, 16384, 16385, 70001, 7, 0, 24576};
    std::vector<std::vector<float>> runs;
    for (size_t n : lens) {
        std::vector<float> x(n);
        for (float& v : x) v = float(std::ldexp(rng.normal(), int(rng.below(41)) - 20));
        runs.push_back(std::move(x));
    }
    std::vector<const float*> at;
    for (const auto& r : runs) at.push_back(r.data());
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, lens.size()}) {
        double want = 0.0;
        for (size_t r = 0; r < count; ++r) want += sum_squares(at[r], lens[r]);
        for (int threads = 1; threads <= 3; ++threads) {
            set_compute_threads(threads);
            const double got = sum_squares_runs(at.data(), lens.data(), count);
            EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
                << count << " runs, " << threads << " threads: " << got << " vs " << want;
        }
    }
    set_compute_threads(0);
}

TEST_P(OpsThreads, ResultsIndependentOfThreadCount) {
    set_compute_threads(1);
    const auto one = run_all_kernels();
    set_compute_threads(2);
    const auto two = run_all_kernels();
    set_compute_threads(0);  // back to the default, one thread per allowed CPU
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i) {
        ASSERT_EQ(one[i].size(), two[i].size()) << "output " << i;
        EXPECT_EQ(std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float)), 0)
            << "output " << i << " differs between 1 and 2 threads";
    }
}

}  // namespace
}  // namespace bagualu::kernels

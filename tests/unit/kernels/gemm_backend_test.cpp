// The GEMM backend layer beyond our own kernels: oneDNN's matmul on our pool (against the
// reference on ragged shapes it is also covered by gemm_test, which runs every supported path),
// its AMX choice, bitwise-equal results run to run for a fixed backend and thread count, the
// bounded and thread-safe primitive cache, BGL_GEMM=auto's choice table and its JSON form.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "gemm_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm/choice.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/onednn.h"
#include "kernels/ref/gemm_ref.h"

namespace bagualu::kernels {
namespace {

using gemm::Path;
using testing::PathGuard;

std::vector<float> random_vec(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
    return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out;
    for (float x : v) out.push_back(bf16_from_float(x));
    return out;
}

#define SKIP_WITHOUT_ONEDNN() \
    if (!gemm::onednn::available()) GTEST_SKIP() << "needs a native oneDNN matmul (AVX2+)"
#define SKIP_WITHOUT_ONEDNN_BF16()       \
    if (!gemm::onednn::bf16_available()) \
    GTEST_SKIP() << "needs AVX512_BF16 or AMX-BF16 (a native oneDNN bf16 matmul)"

TEST(GemmOnednn, UsesAmxWhereTheCpuHasIt) {
    SKIP_WITHOUT_ONEDNN_BF16();
    if (!cpu_features().amx_bf16) GTEST_SKIP() << "needs AMX-BF16";
    EXPECT_NE(gemm::onednn::impl_name(true, 512, 512, 512).find("amx"), std::string::npos)
        << gemm::onednn::impl_name(true, 512, 512, 512);
}

// Slices are fixed for a thread count and each slice's primitive is fixed, so the same call
// gives the same bits; here over shapes that split by rows, by columns, and not at all.
TEST(GemmOnednn, BitwiseEqualRunToRunAtFixedThreads) {
    SKIP_WITHOUT_ONEDNN();
    struct S {
        Trans ta, tb;
        int M, N, K;
    };
    const S shapes[] = {{Trans::N, Trans::T, 517, 130, 301},
                        {Trans::T, Trans::N, 33, 700, 257},
                        {Trans::N, Trans::N, 20, 17, 9}};
    for (int threads : {1, 2, 3}) {
        set_compute_threads(threads);
        for (const S& s : shapes) {
            const std::vector<float> A  = random_vec(size_t(s.M) * s.K, 1),
                                     B  = random_vec(size_t(s.K) * s.N, 2);
            const std::vector<bf16> A16 = to_bf16(A), B16 = to_bf16(B);
            const int lda = s.ta == Trans::N ? s.K : s.M, ldb = s.tb == Trans::N ? s.N : s.K;
            std::vector<float> c[2];
            std::vector<float> d[2];
            for (int r = 0; r < 2; ++r) {
                c[r].assign(size_t(s.M) * s.N, 0.5f);
                d[r].assign(size_t(s.M) * s.N, 0.5f);
                gemm::onednn::gemm_f32(s.ta, s.tb, s.M, s.N, s.K, 0.75f, A.data(), lda, B.data(),
                                       ldb, 1.0f, c[r].data(), s.N);
                if (gemm::onednn::bf16_available()) {
                    gemm::onednn::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A16.data(), lda,
                                            B16.data(), ldb, 0.0f, d[r].data(), s.N);
                }
            }
            EXPECT_EQ(0, std::memcmp(c[0].data(), c[1].data(), c[0].size() * 4))
                << "f32 M=" << s.M << " threads=" << threads;
            EXPECT_EQ(0, std::memcmp(d[0].data(), d[1].data(), d[0].size() * 4))
                << "bf16 M=" << s.M << " threads=" << threads;
        }
    }
    set_compute_threads(0);
}

// Many threads call at once (small GEMMs run on the calling thread, not the pool): some on the
// same shape, hence the same cached primitive, some on shapes of their own.
TEST(GemmOnednn, CacheIsThreadSafe) {
    SKIP_WITHOUT_ONEDNN();
    constexpr int kThreads = 6, kCalls = 40;
    const int K = 24, N = 19;
    const std::vector<float> B = random_vec(size_t(K) * N, 3);
    std::vector<std::vector<float>> out(kThreads);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t) {
        pool.emplace_back([&, t] {
            const int M                = 5 + t % 3;  // three shapes, two threads each
            const std::vector<float> A = random_vec(size_t(M) * K, 10 + uint64_t(t % 3));
            std::vector<float> C(size_t(M) * N);
            for (int c = 0; c < kCalls; ++c) {
                gemm::onednn::gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N,
                                       0.0f, C.data(), N);
            }
            out[size_t(t)] = C;
        });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < kThreads; ++t) {
        const int M                = 5 + t % 3;
        const std::vector<float> A = random_vec(size_t(M) * K, 10 + uint64_t(t % 3));
        std::vector<float> want(size_t(M) * N);
        gemm::onednn::gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f,
                               want.data(), N);
        EXPECT_EQ(0, std::memcmp(want.data(), out[size_t(t)].data(), want.size() * 4)) << t;
    }
}

TEST(GemmOnednn, CacheStaysBounded) {
    SKIP_WITHOUT_ONEDNN();
    const std::vector<float> A = random_vec(300 * 8, 4), B = random_vec(8 * 8, 5);
    std::vector<float> C(300 * 8);
    for (int M = 1; M <= int(gemm::onednn::kCacheCapacity) + 20; ++M) {
        gemm::onednn::gemm_f32(Trans::N, Trans::N, M % 300 + 1, 8, 8 + M / 300, 1.0f, A.data(),
                               8 + M / 300, B.data(), 8, 0.0f, C.data(), 8);
    }
    EXPECT_LE(gemm::onednn::cache_entries(), gemm::onednn::kCacheCapacity);
    EXPECT_GT(gemm::onednn::cache_entries(), 0u);
}

// auto records one choice per shape and dtype, the choice then fixes the bits.
TEST(GemmAuto, RecordsAChoicePerShapeAndKeepsIt) {
    SKIP_WITHOUT_ONEDNN();
    PathGuard guard;
    gemm::set_active_path(Path::automatic);
    gemm::choice_table().clear();
    const int M = 300, N = 200, K = 100;
    const std::vector<float> A = random_vec(size_t(M) * K, 6), B = random_vec(size_t(K) * N, 7);
    std::vector<float> C1(size_t(M) * N), C2(size_t(M) * N);
    gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C1.data(), N);
    const auto chosen = gemm::choice_table().find({false, Trans::N, Trans::N, M, N, K});
    ASSERT_TRUE(chosen.has_value());
    EXPECT_TRUE(*chosen == Path::onednn || *chosen == gemm::best_path())
        << gemm::path_name(*chosen);
    EXPECT_EQ(gemm::choice_table().size(), 1u);
    gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C2.data(), N);
    EXPECT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * 4));
    // Forcing the other backend through the table changes the path taken, not the contract.
    const Path other = *chosen == Path::onednn ? gemm::best_path() : Path::onednn;
    gemm::choice_table().set({false, Trans::N, Trans::N, M, N, K}, other);
    std::vector<float> C3(size_t(M) * N);
    gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C3.data(), N);
    std::vector<float> want(size_t(M) * N);
    gemm::set_active_path(other);
    gemm_f32(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want.data(), N);
    EXPECT_EQ(0, std::memcmp(C3.data(), want.data(), C3.size() * 4));
    gemm::choice_table().clear();
}

TEST(GemmAuto, ChoiceTableJsonRoundTrip) {
    SKIP_WITHOUT_ONEDNN();
    gemm::ChoiceTable t;
    t.set({false, Trans::N, Trans::T, 2048, 1536, 512}, Path::onednn);
    t.set({true, Trans::T, Trans::N, 512, 512, 2048}, gemm::best_path());
    const nlohmann::json j = t.to_json();
    EXPECT_EQ(j.at("cpu_model"), cpu_features().model);
    EXPECT_EQ(j.at("onednn_version"), gemm::onednn::version());
    gemm::ChoiceTable u;
    ASSERT_TRUE(u.from_json(nlohmann::json::parse(j.dump())));
    EXPECT_EQ(u.size(), 2u);
    EXPECT_EQ(u.find({false, Trans::N, Trans::T, 2048, 1536, 512}), Path::onednn);
    EXPECT_EQ(u.find({true, Trans::T, Trans::N, 512, 512, 2048}), gemm::best_path());
    EXPECT_FALSE(u.find({true, Trans::N, Trans::N, 512, 512, 2048}).has_value());
    EXPECT_EQ(u.to_json(), j);
}

TEST(GemmAuto, ChoiceTableFromElsewhereIsNotLoaded) {
    SKIP_WITHOUT_ONEDNN();
    gemm::ChoiceTable t;
    t.set({false, Trans::N, Trans::N, 8, 8, 8}, Path::onednn);
    for (const char* key : {"cpu_model", "onednn_version", "threads"}) {
        nlohmann::json j = t.to_json();
        j[key]           = key == std::string("threads") ? nlohmann::json(j[key].get<int>() + 1)
                                                         : nlohmann::json("other");
        gemm::ChoiceTable u;
        u.set({false, Trans::N, Trans::N, 1, 1, 1}, Path::ref);
        EXPECT_FALSE(u.from_json(j)) << key;
        EXPECT_EQ(u.size(), 1u) << key;  // unchanged
    }
}

TEST(GemmAuto, MalformedChoiceTableIsAnInputError) {
    SKIP_WITHOUT_ONEDNN();
    gemm::ChoiceTable t;
    t.set({false, Trans::N, Trans::N, 8, 8, 8}, Path::onednn);
    const nlohmann::json good = t.to_json();
    const auto bad            = [&](const char* key, nlohmann::json v) {
        nlohmann::json j     = good;
        j["choices"][0][key] = std::move(v);
        gemm::ChoiceTable u;
        try {
            u.from_json(j);
            ADD_FAILURE() << key << ": no error";
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        }
    };
    bad("backend", "turbo");
    bad("dtype", "fp8");
    bad("op", "XN");
    bad("m", "many");
    bad("k", -1);
}

}  // namespace
}  // namespace bagualu::kernels

// Gradient reduction overlapped with backward, under mpirun: for both optimizers and every EP
// dividing P, reducing on the helper thread while the main thread keeps communicating (as the
// MoE all-to-alls of backward do) gives bitwise the parameters and gradient norms of reducing in
// step(). "Backward" here writes random gradients from the end of the array to the start, in
// chunks, and reports each chunk as final.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../common/paro_layout.h"
#include "core/helper_thread.h"
#include "core/rng.h"
#include "dist/parallel.h"
#include "dist/paro/optimizer.h"
#include "dist/paro/partitioned_adamw.h"
#include "mpi_world.h"

namespace bagualu::dist::paro {
namespace {

std::unique_ptr<Optimizer> make(bool paro, const model::ParamLayout& l, dist::ParallelContext& par,
                                HelperThread* helper) {
    const optim::AdamWHyper hyper{0.9f, 0.95f, 1e-8f, 0.1f, 1.0};
    if (paro) return std::make_unique<PartitionedAdamW>(l, par, hyper, 150, helper);
    TrainConfig cfg;
    cfg.optimizer.partition = Partition::off;
    return make_optimizer(cfg, l, par, model::PrecisionPolicy::from_config(cfg.precision), helper);
}

TEST(Overlap, BitwiseSameAsReducingInStep) {
    dist::Comm& w = dist::test_world();
    if (!w.threads_multiple()) GTEST_SKIP() << "MPI gives no MPI_THREAD_MULTIPLE";
    const int P = w.size();
    for (const bool paro : {false, true}) {
        for (int ep = 1; ep <= P; ++ep) {
            if (P % ep != 0) continue;
            dist::ParallelContext par(w, ep, false);
            const model::ParamLayout l = testing::paro_test_layout();
            const size_t n             = l.total_floats();
            HelperThread helper;
            const auto plain   = make(paro, l, par, nullptr);
            const auto overlap = make(paro, l, par, &helper);
            ASSERT_FALSE(plain->overlapped());
            ASSERT_TRUE(overlap->overlapped());
            std::vector<float> p_plain(n), p_over(n);
            Rng dense_init(7, 0), expert_init(7, 1 + static_cast<uint64_t>(par.ep_rank()));
            for (const model::ParamSpec& s : l.specs()) {
                Rng& init = s.expert ? expert_init : dense_init;
                for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                    p_plain[i] = static_cast<float>(init.normal());
                }
            }
            p_over = p_plain;
            for (int step = 1; step <= 3; ++step) {
                std::vector<float> g_plain(n), g_over(n, 0.0f);
                Rng rng(100 + static_cast<uint64_t>(step), static_cast<uint64_t>(w.rank()));
                for (const model::ParamSpec& s : l.specs()) {
                    for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
                        g_plain[i] = static_cast<float>(rng.uniform() - 0.3);
                    }
                }
                overlap->begin_reduction(g_over.data());
                for (size_t end = n; end > 0;) {  // backward: the late floats first
                    const size_t from = end > 100 ? end - 100 : 0;
                    std::copy(g_plain.begin() + static_cast<std::ptrdiff_t>(from),
                              g_plain.begin() + static_cast<std::ptrdiff_t>(end),
                              g_over.begin() + static_cast<std::ptrdiff_t>(from));
                    overlap->grads_ready(from);
                    std::vector<int64_t> x{1};  // the main thread's own traffic meanwhile
                    par.ep().allreduce_sum(std::span<int64_t>(x));
                    EXPECT_EQ(x[0], ep);
                    end = from;
                }
                const double n_plain = plain->step(p_plain.data(), g_plain.data(), 1e-2, step);
                const double n_over  = overlap->step(p_over.data(), g_over.data(), 1e-2, step);
                EXPECT_EQ(n_over, n_plain) << "EP " << ep << " step " << step;
                EXPECT_GE(overlap->reduce_wait_s(), 0.0);
            }
            EXPECT_EQ(std::memcmp(p_plain.data(), p_over.data(), n * sizeof(float)), 0)
                << (paro ? "ParO" : "replicated") << ", EP " << ep;
        }
    }
}

}  // namespace
}  // namespace bagualu::dist::paro

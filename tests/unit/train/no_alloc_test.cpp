// The training step allocates nothing on the heap once warmed up: zero_grad, forward, backward,
// gradient-norm clipping and AdamW of a GPT with a dense and an MoE block, on several threads.
// Global operator new/delete are replaced here for the whole unit-test binary; the replacement
// only counts (from every thread, pool workers included) while g_counting is set, and otherwise
// just forwards to malloc/free. The packing and parameter buffers use operator new too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "core/buffer.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "model/gpt.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

void* allocate(std::size_t n, std::size_t align) {
    if (g_counting.load(std::memory_order_relaxed)) {
        g_allocations.fetch_add(1, std::memory_order_relaxed);
    }
    if (n == 0) n = 1;
    return align <= alignof(std::max_align_t)
               ? std::malloc(n)
               : std::aligned_alloc(align, (n + align - 1) / align * align);
}

void* allocate_or_throw(std::size_t n, std::size_t align) {
    void* p = allocate(n, align);
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

// What every replaced operator delete calls: std::free, which is right for allocate's malloc
// and aligned_alloc. Out of line, so that GCC, seeing a delete expression's pointer reach
// std::free inlined, does not warn of a mismatched pair (-Wmismatched-new-delete, in the TSan
// build).
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }

}  // namespace

void* operator new(std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
    return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
    return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }

namespace bagualu::train {
namespace {

// Counts the allocations of every thread while alive.
class AllocationCounter {
   public:
    AllocationCounter() {
        g_allocations.store(0);
        g_counting.store(true);
    }
    ~AllocationCounter() { g_counting.store(false); }
    int64_t count() const { return g_allocations.load(); }
};

// Like tests/unit/model's tiny_config (block 0 dense, block 1 MoE, top-2), wide enough that the
// GEMMs and the experts' grouped GEMMs are split over threads.
ModelConfig small_config() {
    ModelConfig m;
    m.vocab_size    = 61;
    m.d_model       = 64;
    m.n_layer       = 2;
    m.n_head        = 4;
    m.seq_len       = 32;
    m.d_ff          = 128;
    m.n_experts     = 4;
    m.top_k         = 2;
    m.moe_every     = 2;
    m.aux_loss_coef = 0.01;
    return m;
}

std::vector<int32_t> random_tokens(size_t n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    return t;
}

TEST(NoAlloc, CounterSeesEveryThread) {
    set_compute_threads(3);
    int64_t seen = 0;
    {
        AllocationCounter counter;
        compute_pool().run([](int) {
            int* volatile p = new int(1);  // volatile: the pair may not be optimised away
            delete p;
        });
        seen = counter.count();
    }
    EXPECT_EQ(seen, 3);
    set_compute_threads(0);
}

TEST(NoAlloc, TrainingStepDoesNotAllocate) {
    set_compute_threads(3);
    const ModelConfig m = small_config();
    const int B = 4, T = m.seq_len;
    model::GPT gpt(m, B);
    model::init_params(gpt.params(), gpt.layout(), m, 3);
    const size_t n = gpt.n_floats();
    Buffer<float> adam_m(n), adam_v(n);

    auto train_step = [&](const std::vector<int32_t>& x, const std::vector<int32_t>& y, int step) {
        gpt.zero_grad();
        const double loss = gpt.forward(x.data(), y.data(), B, T);
        gpt.backward(1.0f);
        const double norm = std::sqrt(kernels::sum_squares(gpt.grads(), n));
        if (norm > 0.5) kernels::scale_inplace(gpt.grads(), static_cast<float>(0.5 / norm), n);
        for (const model::ParamSpec& s : gpt.layout().specs()) {
            kernels::adamw_update(gpt.params() + s.offset, gpt.grads() + s.offset,
                                  adam_m.data() + s.offset, adam_v.data() + s.offset, s.numel,
                                  1e-2f, 0.9f, 0.95f, 1e-8f, s.decay ? 0.1f : 0.0f, step);
        }
        return loss;
    };

    // Each step sees new tokens, so the experts' row counts change from step to step.
    std::vector<std::vector<int32_t>> xs, ys;
    for (uint64_t s = 0; s < 4; ++s) {
        xs.push_back(random_tokens(size_t(B) * T, m.vocab_size, 10 + s));
        ys.push_back(random_tokens(size_t(B) * T, m.vocab_size, 20 + s));
    }
    train_step(xs[0], ys[0], 1);  // warm-up: grow-only scratch reaches its size

    std::vector<int32_t> loads_before(gpt.moe_layers()[0]->tokens_per_expert(),
                                      gpt.moe_layers()[0]->tokens_per_expert() + m.n_experts);
    double loss         = 0;
    int64_t allocations = 0;
    {
        AllocationCounter counter;
        for (int s = 1; s < 4; ++s) loss = train_step(xs[size_t(s)], ys[size_t(s)], s + 1);
        allocations = counter.count();
    }
    EXPECT_EQ(allocations, 0) << "heap allocations in 3 training steps";
    EXPECT_TRUE(std::isfinite(loss));
    const int32_t* loads_after = gpt.moe_layers()[0]->tokens_per_expert();
    EXPECT_FALSE(std::equal(loads_before.begin(), loads_before.end(), loads_after))
        << "the counted steps should route differently from the warm-up";
    set_compute_threads(0);
}

}  // namespace
}  // namespace bagualu::train

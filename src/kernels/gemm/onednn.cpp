// oneDNN matmul on the compute pool (see onednn.h). oneDNN here is built with OpenMP; each pool
// thread sets its own OpenMP thread count to 1 (a per-thread setting) before it creates or runs
// a primitive, so oneDNN computes on that thread and starts no team. omp_set_num_threads is
// looked up in the OpenMP runtime oneDNN loaded rather than linked. Scratchpads are ours (one
// grow-only buffer per thread), so two threads may run the same primitive at once.
#include "kernels/gemm/onednn.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm::onednn {

namespace {

using dt = dnnl::memory::data_type;

constexpr double kMinThreadedWork = 1 << 18;  // below this many multiply-adds, one thread
constexpr int kSliceAlign         = 16;       // slices start on multiples of this

void single_openmp_thread() {
    using Fn      = void (*)(int);
    static Fn set = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set) set(1);
}

dnnl::engine& engine() {
    static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    return eng;
}

uint32_t bits(float x) {
    uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

struct Key {
    bool bf16;
    Trans ta, tb;
    int m, n, k, lda, ldb, ldc;
    uint32_t alpha, beta;
    bool operator==(const Key&) const = default;
};

struct KeyHash {
    size_t operator()(const Key& k) const {
        uint64_t h     = 1469598103934665603ull;
        const auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
        mix(k.bf16);
        mix(uint64_t(k.ta == Trans::T) << 1 | uint64_t(k.tb == Trans::T));
        for (int v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc}) mix(uint32_t(v));
        mix(k.alpha);
        mix(k.beta);
        return size_t(h);
    }
};

struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc a_md, b_md, c_md, scratch_md;
};

dnnl::matmul::primitive_desc make_pd(const Key& k) {
    const dt in = k.bf16 ? dt::bf16 : dt::f32;
    using dims  = dnnl::memory::dims;
    const dnnl::memory::desc a_md({k.m, k.k}, in,
                                  k.ta == Trans::N ? dims{k.lda, 1} : dims{1, k.lda});
    const dnnl::memory::desc b_md({k.k, k.n}, in,
                                  k.tb == Trans::N ? dims{k.ldb, 1} : dims{1, k.ldb});
    const dnnl::memory::desc c_md({k.m, k.n}, dt::f32, dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    float alpha = 0.0f, beta = 0.0f;
    std::memcpy(&alpha, &k.alpha, sizeof alpha);
    std::memcpy(&beta, &k.beta, sizeof beta);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine());
}

// Bounded map from key to primitive; the least recently used entry goes when it is full.
// Entries are shared, so one evicted while another thread runs it stays alive until it is done.
class Cache {
   public:
    std::shared_ptr<const Entry> get(const Key& k) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = map_.find(k);
            if (it != map_.end()) {
                lru_.splice(lru_.begin(), lru_, it->second.second);
                return it->second.first;
            }
        }
        // Created outside the lock (it takes a while); a racing duplicate is harmless.
        const dnnl::matmul::primitive_desc pd = make_pd(k);
        auto e = std::make_shared<Entry>(Entry{dnnl::matmul(pd), pd.src_desc(), pd.weights_desc(),
                                               pd.dst_desc(), pd.scratchpad_desc()});
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = map_.find(k);
        if (it != map_.end()) return it->second.first;
        lru_.push_front(k);
        map_.emplace(k, std::make_pair(e, lru_.begin()));
        while (map_.size() > kCacheCapacity) {
            map_.erase(lru_.back());
            lru_.pop_back();
        }
        return e;
    }
    size_t size() {
        std::lock_guard<std::mutex> lock(mutex_);
        return map_.size();
    }

   private:
    std::mutex mutex_;
    std::list<Key> lru_;  // most recent first
    std::unordered_map<Key, std::pair<std::shared_ptr<const Entry>, std::list<Key>::iterator>,
                       KeyHash>
        map_;
};

Cache& cache() {
    static Cache c;
    return c;
}

// The calling thread's scratchpad, grow-only, 64-byte aligned.
void* scratch(size_t bytes) {
    struct Buf {
        void* p  = nullptr;
        size_t n = 0;
        ~Buf() {
            if (p) ::operator delete (p, std::align_val_t{64});
        }
    };
    thread_local Buf buf;
    if (bytes > buf.n) {
        void* p = ::operator new (bytes, std::align_val_t{64});
        if (buf.p) ::operator delete (buf.p, std::align_val_t{64});
        buf.p = p;
        buf.n = bytes;
    }
    return buf.p;
}

void run_one(const Key& k, const void* A, const void* B, float* C) {
    single_openmp_thread();
    try {
        const std::shared_ptr<const Entry> e = cache().get(k);
        thread_local dnnl::stream strm(engine());
        dnnl::memory a(e->a_md, engine(), const_cast<void*>(A));
        dnnl::memory b(e->b_md, engine(), const_cast<void*>(B));
        dnnl::memory c(e->c_md, engine(), C);
        const size_t sb = e->scratch_md.get_size();
        dnnl::memory s(e->scratch_md, engine(), sb ? scratch(sb) : nullptr);
        e->prim.execute(strm, {{DNNL_ARG_SRC, a},
                               {DNNL_ARG_WEIGHTS, b},
                               {DNNL_ARG_DST, c},
                               {DNNL_ARG_SCRATCHPAD, s}});
        strm.wait();
    } catch (const dnnl::error& err) {
        BGL_CHECK(false, "oneDNN matmul {}x{}x{}: {}", k.m, k.n, k.k, err.what());
    }
}

void run_sliced(bool bf16, Trans ta, Trans tb, int M, int N, int K, float alpha, const void* A,
                int lda, const void* B, int ldb, float beta, float* C, int ldc) {
    BGL_CHECK(M >= 0 && N >= 0 && K >= 0, "M={} N={} K={}", M, N, K);
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    ThreadPool& pool = compute_pool();
    const int nt     = double(M) * N * K < kMinThreadedWork ? 1 : pool.size();
    const bool rows  = M >= N;
    const int dim    = rows ? M : N;
    const int chunk =
        std::max(kSliceAlign, (dim + nt - 1) / nt + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    const int parts  = (dim + chunk - 1) / chunk;
    const size_t esz = bf16 ? 2 : 4;
    const auto* a8   = static_cast<const char*>(A);
    const auto* b8   = static_cast<const char*>(B);
    auto slice       = [&](int t) {
        const int s0 = t * chunk;
        if (s0 >= dim) return;
        const int s1 = std::min(dim, s0 + chunk);
        Key k{bf16, ta, tb, M, N, K, lda, ldb, ldc, bits(alpha), bits(beta)};
        const char* a = a8;
        const char* b = b8;
        float* c      = C;
        if (rows) {
            k.m = s1 - s0;
            a += (ta == Trans::N ? size_t(s0) * size_t(lda) : size_t(s0)) * esz;
            c += size_t(s0) * size_t(ldc);
        } else {
            k.n = s1 - s0;
            b += (tb == Trans::N ? size_t(s0) : size_t(s0) * size_t(ldb)) * esz;
            c += size_t(s0);
        }
        run_one(k, a, b, c);
    };
    if (parts == 1) {
        slice(0);
    } else {
        pool.run(slice);
    }
}

bool native(bool bf16) {
    try {
        const Key k{bf16, Trans::N, Trans::N, 64, 64, 64, 64, 64, 64, bits(1.0f), bits(0.0f)};
        return std::string(make_pd(k).impl_info_str()).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
        return false;
    }
}

}  // namespace

bool available() {
    static const bool ok = native(false);
    return ok;
}

bool bf16_available() {
    static const bool ok = native(true);
    return ok;
}

void gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
    run_sliced(false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
               const bf16* B, int ldb, float beta, float* C, int ldc) {
    run_sliced(true, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::string version() {
    const dnnl_version_t* v = dnnl_version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
}

std::string impl_name(bool bf16, int M, int N, int K) {
    single_openmp_thread();
    try {
        const Key k{bf16, Trans::N, Trans::N, M, N, K, K, N, N, bits(1.0f), bits(0.0f)};
        return make_pd(k).impl_info_str();
    } catch (const dnnl::error&) {
        return "";
    }
}

size_t cache_entries() { return cache().size(); }

}  // namespace bagualu::kernels::gemm::onednn

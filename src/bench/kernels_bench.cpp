// Kernel benchmark: peaks, then GEMM GFLOP/s (2 M N K flops per call) of the best of our kernels
// (or the one BGL_GEMM names),
// oneDNN's matmul primitive as our "onednn" backend runs it (single-threaded primitives on the
// compute pool, gemm/onednn.h), the same primitive run the way a standalone program runs it
// (oneDNN's own OpenMP threads) inside this process and, with --standalone-check, in a child
// process forked before this one has started any OpenMP thread, and OpenBLAS (cblas_sgemm; this
// OpenBLAS has no bf16 GEMM). Each gets the compute pool's thread count; they are timed one
// after another with a pause between, so one's spinning workers do not steal the next one's
// cores. Last, the experts' grouped GEMM: one grouped call against a loop of gemm_f32 (8 experts
// of skewed sizes, and one expert over all the rows), the bf16 products' float weights packed
// from their floats against narrowed first (where the bf16 kernel can), the router's top-k
// ranking, and a fine-grained layer's experts run whole against in passes over all experts.
#include "bench/kernels_bench.h"

#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <dnnl.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/onednn.h"
#include "kernels/grouped_gemm.h"
#include "kernels/mixed.h"
#include "kernels/ops.h"
#include "kernels/ops_avx512.h"
#include "kernels/ops_generic.h"
#include "kernels/peak.h"
#include "moe/experts.h"

namespace bagualu::bench {

namespace {

using kernels::Trans;
using clock = std::chrono::steady_clock;

using Shape = GemmShape;

struct Row {
    Shape s;
    const char* dtype;
    double ours = 0.0;  // the best of our kernels
    // oneDNN: our backend (on the pool), its own OpenMP threads here and in a child process.
    std::optional<double> onednn, onednn_omp, onednn_standalone, openblas;
};

const char* trans_name(const Shape& s) {
    static const char* names[] = {"NN", "NT", "TN", "TT"};
    return names[(s.ta == Trans::T ? 2 : 0) + (s.tb == Trans::T ? 1 : 0)];
}

// oneDNN here is built with OpenMP; libgomp is loaded with it, so look the setter up there
// rather than linking OpenMP ourselves.
void set_openmp_threads(int n) {
    using Fn = void (*)(int);
    if (auto f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(n);
}

// Median GFLOP/s of `repeats` runs, each calling fn as often as fits in ~50 ms (at least once).
double time_gflops(const Shape& s, int repeats, const std::function<void()>& fn) {
    const double flops = 2.0 * s.m * s.n * s.k;
    fn();
    const auto t0 = clock::now();
    fn();
    const double once = std::chrono::duration<double>(clock::now() - t0).count();
    const int calls   = std::max(1, static_cast<int>(0.05 / std::max(once, 1e-6)));
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
        const auto start = clock::now();
        for (int c = 0; c < calls; ++c) fn();
        const double dt = std::chrono::duration<double>(clock::now() - start).count();
        rates.push_back(flops * calls / dt * 1e-9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

struct Operands {
    int lda, ldb, ldc;
    std::vector<float> A, B, C;
    std::vector<bf16> A16, B16;
};

Operands make_operands(const Shape& s) {
    Operands o;
    o.lda = s.ta == Trans::N ? s.k : s.m;
    o.ldb = s.tb == Trans::N ? s.n : s.k;
    o.ldc = s.n;
    Rng rng(1);
    o.A.resize(size_t(s.m) * size_t(s.k));
    o.B.resize(size_t(s.k) * size_t(s.n));
    o.C.assign(size_t(s.m) * size_t(s.n), 0.0f);
    for (float& x : o.A) x = float(rng.uniform() - 0.5);
    for (float& x : o.B) x = float(rng.uniform() - 0.5);
    for (float x : o.A) o.A16.push_back(bf16_from_float(x));
    for (float x : o.B) o.B16.push_back(bf16_from_float(x));
    return o;
}

// The calling thread may run on every CPU of the process while it lives; then pinned back. OpenMP
// threads inherit the mask of the thread that starts them: started from our main thread, pinned
// to one core, oneDNN's whole team would share that core.
class WholeMask {
   public:
    WholeMask() {
        pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_);
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int c : allowed_cpus()) CPU_SET(c, &all);
        pthread_setaffinity_np(pthread_self(), sizeof(all), &all);
    }
    ~WholeMask() { pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_); }
    WholeMask(const WholeMask&)            = delete;
    WholeMask& operator=(const WholeMask&) = delete;

   private:
    cpu_set_t saved_;
};

// oneDNN's matmul primitive on its own OpenMP threads (`threads` of them), as a standalone
// program runs it: f32 or bf16 inputs, f32 C, with the strides of our row-major operands;
// nullopt when oneDNN has only its reference implementation for this CPU.
std::optional<double> onednn_omp(const Shape& s, bool bf16, Operands& o, int repeats, int threads) {
    try {
        set_openmp_threads(threads);
        using dt    = dnnl::memory::data_type;
        const dt in = bf16 ? dt::bf16 : dt::f32;
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        dnnl::stream strm(eng);
        const dnnl::memory::dims a_strides =
            s.ta == Trans::N ? dnnl::memory::dims{o.lda, 1} : dnnl::memory::dims{1, o.lda};
        const dnnl::memory::dims b_strides =
            s.tb == Trans::N ? dnnl::memory::dims{o.ldb, 1} : dnnl::memory::dims{1, o.ldb};
        const dnnl::memory::desc a_md({s.m, s.k}, in, a_strides);
        const dnnl::memory::desc b_md({s.k, s.n}, in, b_strides);
        const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, dnnl::memory::dims{o.ldc, 1});
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
        if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) return std::nullopt;
        dnnl::matmul mm(pd);
        void* a_data = bf16 ? static_cast<void*>(o.A16.data()) : o.A.data();
        void* b_data = bf16 ? static_cast<void*>(o.B16.data()) : o.B.data();
        dnnl::memory a(a_md, eng, a_data), b(b_md, eng, b_data), c(c_md, eng, o.C.data());
        return time_gflops(s, repeats, [&] {
            mm.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
            strm.wait();
        });
    } catch (const dnnl::error&) {
        return std::nullopt;
    }
}

// "Ours": the path BGL_GEMM names where it is one of our packed kernels, so that BGL_GEMM=avx2
// times the AVX2 kernels (an AVX2-only CPU emulated on a wider one) against the AVX2 peak
// (kernels/peak.h peak_f32_isa); else the best of ours this CPU runs.
kernels::gemm::Path ours_path() {
    using kernels::gemm::Path;
    const Path p = kernels::gemm::active_path();
    const bool packed =
        p == Path::generic || p == Path::avx2 || p == Path::avx512 || p == Path::amx;
    return packed ? p : kernels::gemm::best_path();
}

// Sets the active GEMM path for its lifetime.
class PathScope {
   public:
    explicit PathScope(kernels::gemm::Path p) : saved_(kernels::gemm::active_path()) {
        kernels::gemm::set_active_path(p);
    }
    ~PathScope() { kernels::gemm::set_active_path(saved_); }
    PathScope(const PathScope&)            = delete;
    PathScope& operator=(const PathScope&) = delete;

   private:
    kernels::gemm::Path saved_;
};

std::vector<Row> run_shape(const Shape& s, int repeats, int threads) {
    using kernels::gemm::Path;
    Operands o      = make_operands(s);
    const auto cta  = s.ta == Trans::N ? CblasNoTrans : CblasTrans;
    const auto ctb  = s.tb == Trans::N ? CblasNoTrans : CblasTrans;
    const bool dnnl = kernels::gemm::path_supported(Path::onednn);
    const auto f32  = [&] {
        kernels::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb,
                           0.0f, o.C.data(), o.ldc);
    };
    const auto b16 = [&] {
        kernels::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.A16.data(), o.lda, o.B16.data(),
                           o.ldb, 0.0f, o.C.data(), o.ldc);
    };

    Row rf{s, "f32", 0.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    Row rb{s, "bf16", 0.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    {
        PathScope ours(ours_path());
        rf.ours = time_gflops(s, repeats, f32);
        settle();
        rb.ours = time_gflops(s, repeats, b16);
        settle();
    }
    if (dnnl) {
        PathScope onednn(Path::onednn);
        rf.onednn = time_gflops(s, repeats, f32);
        settle();
        if (kernels::gemm::onednn::bf16_available()) rb.onednn = time_gflops(s, repeats, b16);
        settle();
    }
    {
        WholeMask whole;
        rf.onednn_omp = onednn_omp(s, false, o, repeats, threads);
        settle();
        rb.onednn_omp = onednn_omp(s, true, o, repeats, threads);
        settle();
    }
    rf.openblas = time_gflops(s, repeats, [&] {
        cblas_sgemm(CblasRowMajor, cta, ctb, s.m, s.n, s.k, 1.0f, o.A.data(), o.lda, o.B.data(),
                    o.ldb, 0.0f, o.C.data(), o.ldc);
    });
    settle();
    return {rf, rb};
}

// The oneDNN-on-OpenMP rate of every (shape, f32 then bf16) in a child process that starts from
// this one before any OpenMP thread exists here, with the process's whole CPU mask and none of
// our pool's threads (fork copies only the calling thread). This process waits meanwhile.
std::vector<std::optional<double>> standalone_rates(const std::vector<Shape>& shapes, int repeats,
                                                    int threads) {
    std::vector<std::optional<double>> out(shapes.size() * 2);
    int fds[2];
    if (pipe(fds) != 0) return out;
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return out;
    }
    if (pid == 0) {
        close(fds[0]);
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int c : allowed_cpus()) CPU_SET(c, &all);
        sched_setaffinity(0, sizeof(all), &all);
        for (const Shape& s : shapes) {
            Operands o = make_operands(s);
            for (bool bf16 : {false, true}) {
                const std::optional<double> r = onednn_omp(s, bf16, o, repeats, threads);
                const double v                = r ? *r : -1.0;
                if (write(fds[1], &v, sizeof v) != ssize_t(sizeof v)) _exit(1);
                settle();
            }
        }
        _exit(0);  // no destructors: the pool's threads do not exist in the child
    }
    close(fds[1]);
    for (auto& r : out) {
        double v = -1.0;
        if (read(fds[0], &v, sizeof v) != ssize_t(sizeof v)) break;
        if (v >= 0.0) r = v;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return out;
}

std::string cell(const std::optional<double>& v) {
    return v ? fmt::format("{:8.1f}", *v) : fmt::format("{:>8}", "-");
}

std::string ratio(double ours, const std::optional<double>& other) {
    return other && *other > 0 ? fmt::format("{:6.2f}", ours / *other) : fmt::format("{:>6}", "-");
}

nlohmann::json to_json(const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// ---- grouped GEMM of the experts ----

// Two cases of one MoE layer of the default model (C = d_model, F = d_ff): its E = 8 experts over
// 16 x 128 tokens, top-2 (4,096 routed rows) split by Zipf's law (weights 1 / (e + 1)); and one
// expert over 2,048 rows, as a shared expert or the only local expert runs, where the loop is one
// gemm_f32 over all the rows.
constexpr int kGroupedC = 256, kGroupedF = 768;

struct GroupedCase {
    std::string name;
    std::vector<int32_t> off;  // expert e's rows: [off[e], off[e + 1])
};

struct GroupedRow {
    const GroupedCase* c;
    const char* name;                  // which product
    double grouped = 0.0, loop = 0.0;  // GFLOP/s, 2 rows F C flops per call
};

std::vector<int32_t> zipf_offsets(int E, int rows) {
    double total = 0.0;
    for (int e = 0; e < E; ++e) total += 1.0 / (e + 1);
    std::vector<int32_t> off(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) {
        off[size_t(e) + 1] = off[size_t(e)] + static_cast<int32_t>(rows / (e + 1) / total);
    }
    const int32_t rest = rows - off.back();  // rounding: the largest expert takes the rest
    for (int e = 1; e <= E; ++e) off[size_t(e)] += rest;
    return off;
}

std::string tokens_per_expert(const GroupedCase& c) {
    std::string counts;
    for (size_t e = 0; e + 1 < c.off.size(); ++e)
        counts += fmt::format("{}{}", e ? " " : "", c.off[e + 1] - c.off[e]);
    return counts;
}

const std::vector<GroupedCase>& grouped_cases() {
    static const std::vector<GroupedCase> cases = {{"8 experts", zipf_offsets(8, 4096)},
                                                   {"1 expert", {0, 2048}}};
    return cases;
}

void run_grouped_case(const GroupedCase& gc, int repeats, std::vector<GroupedRow>& out) {
    const int E = static_cast<int>(gc.off.size()) - 1, C = kGroupedC, F = kGroupedF,
              R                     = gc.off.back();
    const std::vector<int32_t>& off = gc.off;
    Rng rng(2);
    auto random = [&](size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = float(rng.uniform() - 0.5);
        return v;
    };
    const std::vector<float> x = random(size_t(R) * C), w = random(size_t(E) * F * C);
    const std::vector<float> dh = random(size_t(R) * F);
    std::vector<float> h(size_t(R) * F), dw(size_t(E) * F * C);
    const size_t ws = size_t(F) * C;

    // forward: h_e (rows_e, F) = x_e (rows_e, C) @ w_e^T
    GroupedRow fwd{&gc, "x W1^T"};
    const Shape fwd_shape{"grouped x W1^T", R, F, C, Trans::N, Trans::T};
    fwd.grouped = time_gflops(fwd_shape, repeats, [&] {
        kernels::grouped_gemm_f32(Trans::N, Trans::T, E, off.data(), F, C, 1.0f, x.data(), C,
                                  w.data(), C, ws, 0.0f, h.data(), F);
    });
    settle();
    fwd.loop = time_gflops(fwd_shape, repeats, [&] {
        for (int e = 0; e < E; ++e) {
            const int32_t o = off[size_t(e)], n = off[size_t(e) + 1] - o;
            if (n == 0) continue;
            kernels::gemm_f32(Trans::N, Trans::T, n, F, C, 1.0f, x.data() + size_t(o) * C, C,
                              w.data() + size_t(e) * ws, C, 0.0f, h.data() + size_t(o) * F, F);
        }
    });
    settle();
    // weight gradient: dw_e (F, C) += dh_e^T (F, rows_e) @ x_e (rows_e, C)
    GroupedRow wgrad{&gc, "dH^T X"};
    const Shape wgrad_shape{"grouped dH^T X", F, C, R, Trans::T, Trans::N};
    wgrad.grouped = time_gflops(wgrad_shape, repeats, [&] {
        kernels::grouped_gemm_tn_f32(E, off.data(), F, C, 1.0f, dh.data(), F, x.data(), C, 1.0f,
                                     dw.data(), C, ws);
    });
    settle();
    wgrad.loop = time_gflops(wgrad_shape, repeats, [&] {
        for (int e = 0; e < E; ++e) {
            const int32_t o = off[size_t(e)], n = off[size_t(e) + 1] - o;
            if (n == 0) continue;
            kernels::gemm_f32(Trans::T, Trans::N, F, C, n, 1.0f, dh.data() + size_t(o) * F, F,
                              x.data() + size_t(o) * C, C, 1.0f, dw.data() + size_t(e) * ws, C);
        }
    });
    settle();
    out.push_back(fwd);
    out.push_back(wgrad);
}

std::vector<GroupedRow> run_grouped(int repeats) {
    std::vector<GroupedRow> rows;
    for (const GroupedCase& c : grouped_cases()) run_grouped_case(c, repeats, rows);
    return rows;
}

// ---- bf16 products of float weights: packed from the floats, or narrowed first ----

// A product of 16-bit activations and float weights holding bf16 values (kernels/mixed.h), as
// the linear layers and the experts run it: the weights narrowed to a 16-bit copy and that
// packed (before), or packed from their floats, rounded as they are packed (gemm_bf16_float_b).
// Each call starts with the weights out of cache, as in a training step (a 64 MiB buffer is
// written in between, not timed): ms a call, the median of `repeats`.
struct FloatBRow {
    std::string name;
    Trans tb;
    int m, n, k;
    double narrowed_ms = 0.0, float_b_ms = 0.0;
};

std::vector<FloatBRow> run_float_b(int repeats) {
    std::vector<FloatBRow> out;
    if (!kernels::gemm_bf16_float_b() || !kernels::grouped_gemm_bf16_float_b()) return out;
    const int C = kGroupedC, F = kGroupedF, E = 8, R = 4096;
    std::vector<float> evict(size_t(16) << 20);
    const std::vector<int32_t> off = zipf_offsets(E, R);
    for (const auto& [grouped, tb] : {std::pair{true, Trans::T}, std::pair{true, Trans::N},
                                      std::pair{false, Trans::T}, std::pair{false, Trans::N}}) {
        // x W1^T (B = W1, F x C, stored by k) and dY W2 (B = W2, C x F, stored by row)
        const int M = grouped ? R : 2048, N = tb == Trans::T ? F : C, K = tb == Trans::T ? C : F;
        const int G = grouped ? E : 1, ldb = tb == Trans::T ? K : N;
        Rng rng(5);
        std::vector<float> w(size_t(G) * size_t(N) * size_t(K)), c(size_t(M) * size_t(N));
        for (float& v : w) v = bf16_to_float(bf16_from_float(float(rng.normal())));
        std::vector<bf16> a(size_t(M) * size_t(K)), w16(w.size());
        for (bf16& v : a) v = bf16_from_float(float(rng.normal()));
        auto product = [&](const auto* b) {
            if (grouped) {
                kernels::grouped_gemm_bf16(Trans::N, tb, G, off.data(), N, K, 1.0f, a.data(), K, b,
                                           ldb, size_t(N) * size_t(K), 0.0f, c.data(), N);
            } else {
                kernels::gemm_bf16(Trans::N, tb, M, N, K, 1.0f, a.data(), K, b, ldb, 0.0f, c.data(),
                                   N);
            }
        };
        auto time_ms = [&](auto fn) {
            std::vector<double> t;
            fn();
            for (int r = 0; r < repeats; ++r) {
                for (size_t i = 0; i < evict.size(); i += 16) evict[i] += 1.0f;
                const auto t0 = clock::now();
                fn();
                t.push_back(std::chrono::duration<double>(clock::now() - t0).count() * 1e3);
            }
            std::sort(t.begin(), t.end());
            return t[t.size() / 2];
        };
        FloatBRow row{
            fmt::format("{} {}", grouped ? "experts" : "linear", tb == Trans::T ? "x W^T" : "dY W"),
            tb, M, N, K};
        row.narrowed_ms = time_ms([&] {
            kernels::narrow_half(Dtype::bfloat16, w16.data(), w.data(), w.size());
            product(w16.data());
        });
        row.float_b_ms  = time_ms([&] { product(w.data()); });
        out.push_back(row);
    }
    return out;
}

// ---- the router's top-k ranking ----

// kernels::rank_rows (the active ISA's) against the generic insertion on the same 2,048 rows of
// normal scores, on the calling thread: ns a row, the median of `repeats` timed runs.
struct RankRow {
    int E, R;
    double ours_ns = 0.0, generic_ns = 0.0;
};

std::vector<RankRow> run_rank(int repeats) {
    constexpr int kRows = 2048;
    std::vector<RankRow> out;
    for (auto [E, R] : {std::pair{8, 2}, {64, 8}, {256, 16}, {64, 64}, {256, 256}}) {
        Rng rng(3);
        std::vector<float> x(size_t(kRows) * size_t(E));
        for (float& v : x) v = float(rng.normal());
        std::vector<int32_t> top(size_t(kRows) * size_t(R));
        auto time_ns = [&](auto fn) {
            std::vector<double> t;
            fn();
            for (int r = 0; r < repeats; ++r) {
                const auto t0 = clock::now();
                for (int i = 0; i < 5; ++i) fn();
                t.push_back(std::chrono::duration<double>(clock::now() - t0).count() / 5 / kRows *
                            1e9);
            }
            std::sort(t.begin(), t.end());
            return t[t.size() / 2];
        };
        RankRow row{E, R};
        row.ours_ns = time_ns([&] { kernels::rank_rows(top.data(), x.data(), kRows, E, R); });
        row.generic_ns =
            time_ns([&] { kernels::generic::rank_rows(top.data(), x.data(), kRows, E, R); });
        out.push_back(row);
    }
    return out;
}

// ---- the experts' MLP: whole experts against passes over all experts ----

// One fine-grained MoE layer's experts in float32 (64 experts of width 96 over C = 256, 2,048
// tokens top-8: 16,384 rows routed uniformly at random, the tokens read in place), forward and
// backward (moe/experts.h) with each expert's chain whole on one thread, and with each product
// and pass over all experts in turn (moe::set_whole_experts(false)); the two alternate within
// each repeat. ms a call, medians.
struct ExpertsMlpTimes {
    int E = 64, F = 96, C = 256, tokens = 2048, K = 8;
    double whole_forward_ms = 0.0, whole_backward_ms = 0.0;
    double passes_forward_ms = 0.0, passes_backward_ms = 0.0;
    bool whole = false;  // the whole experts ran (kernels::whole_groups_suit)
};

ExpertsMlpTimes run_experts_mlp(int repeats) {
    ExpertsMlpTimes t;
    const int E = t.E, F = t.F, C = t.C, N = t.tokens, R = N * t.K;
    Rng rng(9);
    std::vector<int32_t> expert(static_cast<size_t>(R)), off(size_t(E) + 1, 0);
    std::vector<int32_t> rows(static_cast<size_t>(R));
    for (int32_t& e : expert) e = int32_t(rng.below(uint64_t(E)));
    for (int32_t e : expert) ++off[size_t(e) + 1];
    for (int e = 0; e < E; ++e) off[size_t(e) + 1] += off[size_t(e)];
    std::vector<int32_t> at(off.begin(), off.end() - 1);
    for (int r = 0; r < R; ++r) rows[size_t(at[size_t(expert[size_t(r)])]++)] = r / t.K;
    auto normal = [&](size_t n, double sd) {
        std::vector<float> v(n);
        for (float& x : v) x = float(sd * rng.normal());
        return v;
    };
    const auto x = normal(size_t(N) * C, 1.0), w1 = normal(size_t(E) * F * C, 0.05),
               b1 = normal(size_t(E) * F, 0.01), w2 = normal(size_t(E) * C * F, 0.05),
               b2 = normal(size_t(E) * C, 0.01), dy0 = normal(size_t(R) * C, 0.01);
    std::vector<float> y(size_t(R) * C), h(size_t(R) * F), g(size_t(R) * F), dx(size_t(R) * C),
        dy = dy0, dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
    const moe::ExpertWeights w{w1.data(),     b1.data(), w2.data(),     b2.data(),
                               size_t(F) * C, size_t(F), size_t(C) * F, size_t(C)};
    moe::ExpertGrads dw{dw1.data(),    db1.data(), dw2.data(),    db2.data(),
                        size_t(F) * C, size_t(F),  size_t(C) * F, size_t(C)};
    t.whole   = moe::experts_run_whole({}, E, off.data(), F);
    auto once = [&](bool whole, double& fwd_ms, double& bwd_ms) {
        moe::set_whole_experts(whole);
        const auto t0 = clock::now();
        moe::experts_forward(y.data(), {h.data(), nullptr}, g.data(), x.data(), w, off.data(), E, C,
                             F, {}, rows.data());
        const auto t1 = clock::now();
        moe::experts_backward(dx.data(), g.data(), dw, dy.data(), x.data(), {h.data(), nullptr}, w,
                              off.data(), E, C, F, {}, nullptr, rows.data());
        const auto t2 = clock::now();
        moe::set_whole_experts(true);
        fwd_ms = std::chrono::duration<double>(t1 - t0).count() * 1e3;
        bwd_ms = std::chrono::duration<double>(t2 - t1).count() * 1e3;
    };
    double f = 0, b = 0;
    once(true, f, b);
    once(false, f, b);
    std::vector<double> wf, wb, pf, pb;
    for (int r = 0; r < std::max(repeats, 5) * 3; ++r) {
        once(true, f, b);
        wf.push_back(f);
        wb.push_back(b);
        once(false, f, b);
        pf.push_back(f);
        pb.push_back(b);
    }
    t.whole_forward_ms   = median(wf);
    t.whole_backward_ms  = median(wb);
    t.passes_forward_ms  = median(pf);
    t.passes_backward_ms = median(pb);
    return t;
}

// ---- the attention core ----

// The float kernel of the active ISA against the bf16 ones (AMX tiles, AVX512_BF16 dots, where
// they run), on one micro-batch of normal q, k, v and output gradients: ms a call, the median
// of `repeats`.
struct AttentionTimes {
    double forward_ms = 0.0, backward_ms = 0.0;
    std::optional<double> tiles_forward_ms, tiles_backward_ms, dots_forward_ms, dots_backward_ms;
};

AttentionTimes run_attention(const KernelsBenchOptions& o, int repeats) {
    const int B = o.attn_B, T = o.attn_T, C = o.attn_C, NH = o.attn_NH;
    Rng rng(5);
    std::vector<float> qkv(size_t(B) * T * 3 * C), dy(size_t(B) * T * C), out(dy.size()),
        lse(size_t(B) * NH * T), dqkv(qkv.size());
    for (float& v : qkv) v = float(rng.normal());
    for (float& v : dy) v = float(rng.normal());
    auto time_ms = [&](auto fn) {
        std::vector<double> t;
        fn();
        for (int r = 0; r < repeats; ++r) {
            const auto t0 = clock::now();
            fn();
            t.push_back(std::chrono::duration<double>(clock::now() - t0).count() * 1e3);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    AttentionTimes a;
    a.forward_ms = time_ms(
        [&] { kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH); });
    a.backward_ms = time_ms([&] {
        kernels::attention_backward(dqkv.data(), dy.data(), qkv.data(), out.data(), lse.data(), B,
                                    T, C, NH);
    });
    if (!kernels::avx512::attention_bf16_shape_supported(C / NH)) return a;
    for (const bool tiles : {true, false}) {
        const bool usable = tiles ? kernels::gemm::path_supported(kernels::gemm::Path::amx)
                                  : kernels::cpu_features().avx512_bf16;
        if (!usable) continue;
        auto forward = [&] {
            kernels::avx512::attention_forward_bf16(tiles, out.data(), lse.data(), qkv.data(), B, T,
                                                    C, NH);
        };
        auto backward = [&] {
            kernels::avx512::attention_backward_bf16(tiles, dqkv.data(), dy.data(), qkv.data(),
                                                     out.data(), lse.data(), B, T, C, NH);
        };
        (tiles ? a.tiles_forward_ms : a.dots_forward_ms)   = time_ms(forward);
        (tiles ? a.tiles_backward_ms : a.dots_backward_ms) = time_ms(backward);
    }
    return a;
}

}  // namespace

std::vector<GemmShape> training_gemm_shapes(const ModelConfig& m, int micro_batch) {
    const int N = micro_batch * m.seq_len, C = m.d_model, F = m.d_ff, V = m.vocab_size;
    const int Ne = std::max(1, N * m.top_k / std::max(1, m.n_experts));
    bool dense = false, moe = false;
    for (int l = 0; l < m.n_layer; ++l) (m.is_moe_block(l) ? moe : dense) = true;
    std::vector<GemmShape> out;
    // linear layer (rows, in, out): out = inp @ w^T; dinp = dout @ w; dw += dout^T @ inp
    auto linear = [&](const std::string& name, int rows, int in, int outc) {
        const GemmShape forms[] = {{name + " fwd", rows, outc, in, Trans::N, Trans::T},
                                   {name + " dinp", rows, in, outc, Trans::N, Trans::N},
                                   {name + " dw", outc, in, rows, Trans::T, Trans::N}};
        for (const GemmShape& s : forms) {
            const bool seen = std::any_of(out.begin(), out.end(), [&](const GemmShape& o) {
                return o.m == s.m && o.n == s.n && o.k == s.k && o.ta == s.ta && o.tb == s.tb;
            });
            if (!seen) out.push_back(s);
        }
    };
    linear("qkv", N, C, 3 * C);
    linear("attn proj", N, C, C);
    if (dense) {
        linear("mlp fc", N, C, F);
        linear("mlp proj", N, F, C);
    }
    if (moe) {
        linear("expert fc", Ne, C, m.expert_width());
        linear("expert proj", Ne, m.expert_width(), C);
    }
    linear("lm head", N, C, V);
    return out;
}

int run_kernels_bench(const KernelsBenchOptions& opts) {
    const int threads = compute_pool().size();
    openblas_set_num_threads(threads);
    const int repeats = std::max(1, opts.repeats);

    std::vector<Shape> shapes;
    for (int n : opts.squares) shapes.push_back({"square", n, n, n, Trans::N, Trans::N});
    for (const Shape& s : opts.model_shapes) shapes.push_back(s);
    std::vector<std::string> names;  // what the filter can match, each once
    for (const Shape& s : shapes) {
        if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
    }
    std::erase_if(shapes,
                  [&](const Shape& s) { return s.name.find(opts.filter) == std::string::npos; });
    // otherwise the tables come out empty and the run looks like a success
    if (shapes.empty()) {
        input_error(
            "bench kernels --filter \"{}\": matches no GEMM; expected part of one of \"{}\"",
            opts.filter, fmt::join(names, "\", \""));
    }
    // First, while no OpenMP thread exists in this process.
    std::vector<std::optional<double>> alone;
    if (opts.standalone_check) alone = standalone_rates(shapes, repeats, threads);

    const kernels::CpuFeatures& cpu = kernels::cpu_features();
    const kernels::Isa peak_isa     = kernels::peak_f32_isa();
    const double peak_f32           = kernels::measure_peak_gflops_f32(1.0);
    const double peak_dot           = kernels::measure_peak_gflops_bf16(1.0);
    const double peak_amx           = kernels::measure_peak_gflops_amx_bf16(1.0);
    const double peak_bf16          = std::max(peak_dot, peak_amx);
    const std::string half          = kernels::half_precision_features();
    const std::string bf16_impl     = kernels::gemm::onednn::impl_name(true, 512, 512, 512);
    const std::string f32_impl      = kernels::gemm::onednn::impl_name(false, 512, 512, 512);

    std::vector<Row> rows;
    for (size_t i = 0; i < shapes.size(); ++i) {
        std::vector<Row> pair = run_shape(shapes[i], repeats, threads);
        if (!alone.empty()) {
            pair[0].onednn_standalone = alone[2 * i];
            pair[1].onednn_standalone = alone[2 * i + 1];
        }
        for (const Row& r : pair) rows.push_back(r);
    }
    const std::vector<GroupedRow> grouped = run_grouped(repeats);
    const std::vector<FloatBRow> float_b  = run_float_b(repeats);
    const std::vector<RankRow> ranks      = run_rank(repeats);
    const ExpertsMlpTimes mlp             = run_experts_mlp(repeats);
    const bool attn                       = opts.attn_B > 0 && opts.attn_NH > 0;
    const AttentionTimes at               = attn ? run_attention(opts, repeats) : AttentionTimes{};
    const char* attn_isa                  = kernels::isa_name(kernels::dispatch().attention_isa);
    const std::string ours_name           = kernels::gemm::path_name(ours_path());

    if (opts.json) {
        nlohmann::json out;
        out["backend"]              = kernels::gemm_backend_name();
        out["ours"]                 = ours_name;
        out["threads"]              = threads;
        out["cpu_model"]            = cpu.model;
        out["half_features"]        = half;
        out["onednn_version"]       = kernels::gemm::onednn::version();
        out["onednn_f32_impl"]      = f32_impl;
        out["onednn_bf16_impl"]     = bf16_impl;
        out["peak_fp32_gflops"]     = peak_f32;
        out["peak_fp32_isa"]        = kernels::isa_name(peak_isa);
        out["peak_bf16_dot_gflops"] = peak_dot;
        out["peak_amx_bf16_gflops"] = peak_amx;
        out["peak_bf16_gflops"]     = peak_bf16;
        out["gemm"]                 = nlohmann::json::array();
        for (const Row& r : rows) {
            out["gemm"].push_back({{"name", r.s.name},
                                   {"m", r.s.m},
                                   {"n", r.s.n},
                                   {"k", r.s.k},
                                   {"trans", trans_name(r.s)},
                                   {"dtype", r.dtype},
                                   {"ours_gflops", r.ours},
                                   {"onednn_gflops", to_json(r.onednn)},
                                   {"onednn_omp_gflops", to_json(r.onednn_omp)},
                                   {"onednn_standalone_gflops", to_json(r.onednn_standalone)},
                                   {"openblas_gflops", to_json(r.openblas)}});
        }
        out["grouped_gemm"] = nlohmann::json::array();
        for (const GroupedRow& g : grouped) {
            out["grouped_gemm"].push_back({{"product", g.name},
                                           {"experts", g.c->off.size() - 1},
                                           {"tokens_per_expert", tokens_per_expert(*g.c)},
                                           {"grouped_gflops", g.grouped},
                                           {"loop_gflops", g.loop},
                                           {"grouped_over_loop", g.grouped / g.loop}});
        }
        out["float_b"] = nlohmann::json::array();
        for (const FloatBRow& f : float_b) {
            out["float_b"].push_back({{"product", f.name},
                                      {"trans", f.tb == Trans::T ? "NT" : "NN"},
                                      {"m", f.m},
                                      {"n", f.n},
                                      {"k", f.k},
                                      {"narrowed_ms", f.narrowed_ms},
                                      {"float_b_ms", f.float_b_ms}});
        }
        out["rank_rows"] = nlohmann::json::array();
        for (const RankRow& r : ranks) {
            out["rank_rows"].push_back({{"experts", r.E},
                                        {"top", r.R},
                                        {"ns_per_row", r.ours_ns},
                                        {"generic_ns_per_row", r.generic_ns}});
        }
        out["experts_mlp"] = {{"experts", mlp.E},
                              {"width", mlp.F},
                              {"d_model", mlp.C},
                              {"tokens", mlp.tokens},
                              {"top_k", mlp.K},
                              {"whole", mlp.whole},
                              {"whole_forward_ms", mlp.whole_forward_ms},
                              {"whole_backward_ms", mlp.whole_backward_ms},
                              {"passes_forward_ms", mlp.passes_forward_ms},
                              {"passes_backward_ms", mlp.passes_backward_ms}};
        if (attn) {
            out["attention"] = {{"B", opts.attn_B},
                                {"T", opts.attn_T},
                                {"C", opts.attn_C},
                                {"NH", opts.attn_NH},
                                {"float_isa", attn_isa},
                                {"forward_ms", at.forward_ms},
                                {"backward_ms", at.backward_ms},
                                {"tiles_forward_ms", to_json(at.tiles_forward_ms)},
                                {"tiles_backward_ms", to_json(at.tiles_backward_ms)},
                                {"dots_forward_ms", to_json(at.dots_forward_ms)},
                                {"dots_backward_ms", to_json(at.dots_backward_ms)}};
        }
        fmt::print("{}\n", out.dump(2));
        return 0;
    }
    fmt::print("cpu {}; 16-bit features: {}\n", cpu.model, half.empty() ? "none" : half);
    fmt::print("gemm backend {}, ours = {}, {} threads, median of {}; oneDNN {} ({}, {})\n",
               kernels::gemm_backend_name(), ours_name, threads, repeats,
               kernels::gemm::onednn::version(), f32_impl, bf16_impl);
    // without AVX512_BF16, or where the path's bf16 products widen, the dot-product loop runs
    // on float FMAs (kernels/peak.h)
    fmt::print("peak fp32 {:.1f} GFLOP/s ({}), peak bf16 {:.1f} GFLOP/s ({} {:.1f}, AMX {})\n",
               peak_f32, kernels::isa_name(peak_isa), peak_bf16,
               kernels::bf16_peak_on_dots() ? "vdpbf16ps" : "float FMAs, no 16-bit unit:", peak_dot,
               peak_amx > 0 ? fmt::format("{:.1f}", peak_amx) : std::string("-"));
    fmt::print(
        "dnnl: our onednn backend (on the pool); omp: the same primitive on oneDNN's OpenMP "
        "threads in this process; alone: in a child process (--standalone-check)\n");
    fmt::print(
        "{:<16} {:>6} {:>6} {:>6} {:>3} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} "
        "{:>6}\n",
        "gemm", "m", "n", "k", "op", "dtype", "ours", "dnnl", "omp", "alone", "openblas", "/peak",
        "/dnnl", "omp/al");
    for (const Row& r : rows) {
        const double peak = r.dtype == std::string("f32") ? peak_f32 : peak_bf16;
        const std::string omp_alone =
            r.onednn_omp && r.onednn_standalone && *r.onednn_standalone > 0
                ? fmt::format("{:6.2f}", *r.onednn_omp / *r.onednn_standalone)
                : fmt::format("{:>6}", "-");
        fmt::print("{:<16} {:>6} {:>6} {:>6} {:>3} {:>5} {:8.1f} {} {} {} {} {:6.2f} {} {}\n",
                   r.s.name, r.s.m, r.s.n, r.s.k, trans_name(r.s), r.dtype, r.ours, cell(r.onednn),
                   cell(r.onednn_omp), cell(r.onednn_standalone), cell(r.openblas), r.ours / peak,
                   ratio(r.ours, r.onednn), omp_alone);
    }
    const GroupedCase* shown = nullptr;
    for (const GroupedRow& g : grouped) {
        if (g.c != shown) {
            shown = g.c;
            fmt::print("grouped GEMM, {}, C={} F={}, tokens per expert {}\n", g.c->name, kGroupedC,
                       kGroupedF, tokens_per_expert(*g.c));
            fmt::print("{:>8} {:>8} {:>8} {:>8}\n", "product", "grouped", "loop", "ratio");
        }
        fmt::print("{:>8} {:8.1f} {:8.1f} {:8.2f}\n", g.name, g.grouped, g.loop,
                   g.grouped / g.loop);
    }
    if (float_b.empty()) {
        fmt::print(
            "bf16 weights packed from their floats: not on this path (the generic kernels)\n");
    } else {
        fmt::print(
            "bf16 products of float weights (cold), ms a call: narrowed to 16 bits first, or "
            "packed from the floats\n{:<16} {:>3} {:>6} {:>6} {:>6} {:>9} {:>9} {:>6}\n",
            "product", "op", "m", "n", "k", "narrowed", "float B", "ratio");
        for (const FloatBRow& f : float_b) {
            fmt::print("{:<16} {:>3} {:>6} {:>6} {:>6} {:9.3f} {:9.3f} {:6.3f}\n", f.name,
                       f.tb == Trans::T ? "NT" : "NN", f.m, f.n, f.k, f.narrowed_ms, f.float_b_ms,
                       f.float_b_ms / f.narrowed_ms);
        }
    }
    fmt::print(
        "router top-k ranking (kernels::rank_rows, rows {}) against the generic insertion, "
        "ns a row, one thread\n",
        kernels::isa_name(kernels::dispatch().rows_isa));
    fmt::print("{:>8} {:>5} {:>8} {:>8} {:>8}\n", "experts", "top", "ours", "generic", "ratio");
    for (const RankRow& r : ranks) {
        fmt::print("{:>8} {:>5} {:8.1f} {:8.1f} {:8.2f}\n", r.E, r.R, r.ours_ns, r.generic_ns,
                   r.generic_ns / r.ours_ns);
    }
    fmt::print(
        "experts' MLP in float32, {} experts of {} (C {}, {} tokens top-{}), ms a call: each "
        "expert whole on one thread{}, against each product and pass over all experts\n"
        "{:>8} {:>8} {:>8} {:>6}\n",
        mlp.E, mlp.F, mlp.C, mlp.tokens, mlp.K,
        mlp.whole ? "" : " (not taken: the experts do not suit it here)", "pass", "whole", "passes",
        "ratio");
    fmt::print("{:>8} {:8.3f} {:8.3f} {:6.3f}\n", "forward", mlp.whole_forward_ms,
               mlp.passes_forward_ms, mlp.whole_forward_ms / mlp.passes_forward_ms);
    fmt::print("{:>8} {:8.3f} {:8.3f} {:6.3f}\n", "backward", mlp.whole_backward_ms,
               mlp.passes_backward_ms, mlp.whole_backward_ms / mlp.passes_backward_ms);
    if (attn) {
        fmt::print(
            "attention core, one micro-batch (B {} T {} C {} NH {}), ms a call: float32 ({}) "
            "against bf16 on AMX tiles and on AVX512_BF16 dots (ratio: float32 / bf16)\n"
            "{:>8} {:>8} {:>8} {:>6} {:>8} {:>6}\n",
            opts.attn_B, opts.attn_T, opts.attn_C, opts.attn_NH, attn_isa, "pass", "float32",
            "tiles", "ratio", "dots", "ratio");
        auto ms = [](const std::optional<double>& v) {
            return v ? fmt::format("{:8.3f}", *v) : fmt::format("{:>8}", "-");
        };
        auto over = [](double f, const std::optional<double>& v) {
            return v ? fmt::format("{:6.2f}", f / *v) : fmt::format("{:>6}", "-");
        };
        fmt::print("{:>8} {:8.3f} {} {} {} {}\n", "forward", at.forward_ms, ms(at.tiles_forward_ms),
                   over(at.forward_ms, at.tiles_forward_ms), ms(at.dots_forward_ms),
                   over(at.forward_ms, at.dots_forward_ms));
        fmt::print("{:>8} {:8.3f} {} {} {} {}\n", "backward", at.backward_ms,
                   ms(at.tiles_backward_ms), over(at.backward_ms, at.tiles_backward_ms),
                   ms(at.dots_backward_ms), over(at.backward_ms, at.dots_backward_ms));
    }
    return 0;
}

}  // namespace bagualu::bench

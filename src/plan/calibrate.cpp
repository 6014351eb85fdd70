#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <thread>

#include "core/buffer.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/peak.h"

namespace bagualu::plan {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds per call of f: repeats for about `seconds`, the median of 5 rounds.
template <typename F>
double time_per_call(F&& f, double seconds) {
    f();  // warm-up (page faults, pack buffers)
    std::vector<double> rounds;
    for (int r = 0; r < 5; ++r) {
        const auto t0 = Clock::now();
        int calls     = 0;
        do {
            f();
            ++calls;
        } while (since(t0) < seconds / 5);
        rounds.push_back(since(t0) / calls);
    }
    return median(rounds);
}

// a = b + s * c over n floats on `threads` threads; returns GB/s (3 x 4 bytes per element).
double triad_gbs(size_t n, int threads, double seconds) {
    Buffer<float> a(n), b(n), c(n);
    for (size_t i = 0; i < n; ++i) {
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    auto pass = [&] {
        auto part = [&](int t) {
            const size_t lo     = n * static_cast<size_t>(t) / static_cast<size_t>(threads),
                         hi     = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
            float* __restrict x = a.data();
            const float* __restrict y = b.data();
            const float* __restrict z = c.data();
            for (size_t i = lo; i < hi; ++i) x[i] = y[i] + 0.5f * z[i];
        };
        std::vector<std::thread> ts;
        for (int t = 1; t < threads; ++t) ts.emplace_back(part, t);
        part(0);
        for (auto& t : ts) t.join();
    };
    const double s = time_per_call(pass, seconds);
    return 12.0 * static_cast<double>(n) / s * 1e-9;
}

}  // namespace

ComputeCalibration calibrate_compute(double seconds) {
    ComputeCalibration c;
    c.cores = static_cast<int>(allowed_cpus().size());
    std::vector<double> pk;
    for (int r = 0; r < 3; ++r) pk.push_back(kernels::measure_peak_gflops_f32(seconds / 3));
    c.peak_core_gflops = median(pk);
    // The bf16 products' peak is that of the arithmetic they run on (kernels/peak.h
    // measure_product_peak): the AMX tiles where the GEMM path uses them, else the vdpbf16ps
    // loop; where they widen their operands (the avx2 and generic paths, BGL_GEMM=avx2 on a CPU
    // with AVX512_BF16 included), the float FMAs.
    c.peak_core_half_gflops =
        kernels::gemm_bf16_widens()
            ? c.peak_core_gflops
            : kernels::measure_product_peak(Dtype::bfloat16, seconds / 3).gflops;
    const size_t n   = size_t{8} << 20;  // 3 x 32 MiB, well beyond the caches
    c.triad_core_gbs = triad_gbs(n, 1, seconds);
    c.triad_node_gbs = triad_gbs(n, c.cores, seconds);

    // The products' fraction of their peak by size, in float32 and in bf16 (which on some CPUs
    // reach a different fraction of a different peak: the planner times each with its own).
    for (int s : {32, 64, 128, 256, 512, 1024}) {
        const size_t sz = static_cast<size_t>(s) * static_cast<size_t>(s);
        Buffer<float> A(sz), B(sz), Cm(sz);
        Buffer<bf16> A16(sz), B16(sz);
        for (size_t i = 0; i < sz; ++i) {
            A[i]   = 0.001f * static_cast<float>(i % 97);
            B[i]   = 0.002f * static_cast<float>(i % 89);
            A16[i] = bf16_from_float(A[i]);
            B16[i] = bf16_from_float(B[i]);
        }
        const double t = time_per_call(
            [&] {
                kernels::gemm_f32(kernels::Trans::N, kernels::Trans::N, s, s, s, 1.f, A.data(), s,
                                  B.data(), s, 0.f, Cm.data(), s);
            },
            seconds / 2);
        const double t16 = time_per_call(
            [&] {
                kernels::gemm_bf16(kernels::Trans::N, kernels::Trans::N, s, s, s, 1.f, A16.data(),
                                   s, B16.data(), s, 0.f, Cm.data(), s);
            },
            seconds / 2);
        const double gflop = 2.0 * s * s * s * 1e-9;
        c.gemm_sizes.push_back(s);
        c.gemm_efficiency.push_back(std::min(1.0, gflop / t / c.peak_core_gflops));
        c.half_gemm_efficiency.push_back(std::min(1.0, gflop / t16 / c.peak_core_half_gflops));
    }

    // causal attention forward + backward at a mid-size shape: 6 N T C flops (docs/scale.md)
    const int B = 4, T = 128, C = 256, NH = 4, N = B * T;
    Buffer<float> qkv(static_cast<size_t>(N) * 3 * C), out(static_cast<size_t>(N) * C),
        lse(static_cast<size_t>(N) * NH), dqkv(qkv.size()), dout(out.size());
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.01f * static_cast<float>(i % 101) - 0.5f;
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = 0.001f * static_cast<float>(i % 31);
    const double t = time_per_call(
        [&] {
            kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
            kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                        lse.data(), B, T, C, NH);
        },
        seconds / 2);
    c.attention_efficiency = std::min(1.0, 6.0 * N * T * C / t * 1e-9 / c.peak_core_gflops);

    // the optimizer's passes over one float (dist/paro/, optim/): the gradient norm, the clip
    // scale, AdamW reading p, g, m, v and writing p, m, v; 4M floats, beyond the caches
    {
        const size_t nf = size_t{1} << 22;
        Buffer<float> p(nf), g(nf), m(nf), v(nf);
        for (size_t i = 0; i < nf; ++i) {
            p[i] = 0.01f * static_cast<float>(i % 113);
            g[i] = 1e-3f * static_cast<float>(i % 71) - 0.03f;
            m[i] = v[i] = 0;
        }
        int step        = 0;
        const double to = time_per_call(
            [&] {
                const double norm = kernels::sum_squares(g.data(), nf);
                kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), nf, 1e-3f, 0.9f,
                                      0.95f, 1e-8f, 0.1f, ++step,
                                      static_cast<float>(1.0 / (1.0 + norm)));
            },
            seconds / 2);
        c.optimizer_ns_per_float = to / static_cast<double>(nf) * 1e9;
    }
    return c;
}

CommCalibration calibrate_comm(dist::Comm& comm) {
    const int P    = comm.size();
    const double p = P;
    auto a2a_time  = [&](size_t per_peer) {
        std::vector<char> send(per_peer * static_cast<size_t>(P)), recv(send.size());
        std::vector<int64_t> counts(static_cast<size_t>(P), static_cast<int64_t>(per_peer)),
            displs(static_cast<size_t>(P));
        for (int q = 0; q < P; ++q)
            displs[static_cast<size_t>(q)] = static_cast<int64_t>(per_peer) * q;
        std::vector<double> ts;
        for (int r = 0; r < 21; ++r) {
            comm.barrier();
            const auto t0 = Clock::now();
            comm.alltoallv_bytes(send.data(), counts, displs, recv.data(), counts, displs, 1);
            double dt = since(t0);
            comm.allreduce_max(std::span<double>(&dt, 1));
            ts.push_back(dt);
        }
        return median(ts);
    };
    auto ar_time = [&](size_t floats) {
        std::vector<float> buf(floats, 1.0f);
        std::vector<double> ts;
        for (int r = 0; r < 21; ++r) {
            comm.barrier();
            const auto t0 = Clock::now();
            comm.allreduce_sum(std::span<float>(buf));
            double dt = since(t0);
            comm.allreduce_max(std::span<double>(&dt, 1));
            ts.push_back(dt);
        }
        return median(ts);
    };
    CommCalibration c;
    // alpha-beta as estimate.cpp models them: a2a (P-1) alpha + payload (P-1)/P / beta;
    // allreduce (ring) 2 (P-1) alpha + 2 (P-1)/P bytes / beta
    const double a_small = a2a_time(8), big = 4 << 20;
    const double alpha     = a_small / (p - 1);
    const double a_big     = a2a_time(static_cast<size_t>(big / p));
    c.alltoall_latency_us  = alpha * 1e6;
    c.alltoall_gbs         = big * (p - 1) / p / std::max(1e-9, a_big - (p - 1) * alpha) * 1e-9;
    const double r_small   = ar_time(2);
    const double ra        = r_small / std::ceil(std::log2(p));
    const double r_big     = ar_time(static_cast<size_t>(big / 4));
    c.allreduce_latency_us = ra * 1e6;
    c.allreduce_gbs = 2 * big * (p - 1) / p / std::max(1e-9, r_big - 2 * (p - 1) * ra) * 1e-9;

    // Ranks alternate about a millisecond of work with a small all-reduce, as training does;
    // the time beyond the work alone (median of rounds, slowest rank) is the cost of a
    // blocking call when ranks share cores with each other and with other processes.
    const int s = 96;
    Buffer<float> A(s * s), B(s * s), Cm(s * s);
    auto work = [&] {
        for (int i = 0; i < 20; ++i) {
            kernels::gemm_f32(kernels::Trans::N, kernels::Trans::N, s, s, s, 1.f, A.data(), s,
                              B.data(), s, 0.f, Cm.data(), s);
        }
    };
    auto round = [&](bool with_call) {
        constexpr int kCalls = 20;
        comm.barrier();
        const auto t0 = Clock::now();
        for (int i = 0; i < kCalls; ++i) {
            work();
            double x = 1;
            if (with_call) comm.allreduce_sum(std::span<double>(&x, 1));
        }
        double dt = since(t0) / kCalls;
        comm.allreduce_max(std::span<double>(&dt, 1));
        return dt;
    };
    std::vector<double> extra;
    for (int r = 0; r < 9; ++r) extra.push_back(round(true) - round(false));
    c.sync_us = std::max(0.0, median(extra) * 1e6 - c.allreduce_latency_us);
    return c;
}

void warm_up_kernels() {
    (void)kernels::measure_peak_gflops_f32(0.02);
    const int s = 64, B = 1, T = 16, C = 64, NH = 2;
    Buffer<float> A(s * s), Bm(s * s), Cm(s * s), qkv(T * 3 * C), out(T * C), lse(T * NH),
        dqkv(T * 3 * C);
    kernels::gemm_f32(kernels::Trans::N, kernels::Trans::N, s, s, s, 1.f, A.data(), s, Bm.data(), s,
                      0.f, Cm.data(), s);
    kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    kernels::attention_backward(dqkv.data(), out.data(), qkv.data(), out.data(), lse.data(), B, T,
                                C, NH);
}

void apply(MachineSpec& m, const ComputeCalibration& c) {
    m.node.cores                     = c.cores;
    m.node.peak_fp32_gflops          = c.peak_core_gflops * c.cores;
    m.node.peak_half_gflops          = c.peak_core_half_gflops * c.cores;
    m.node.memory_bandwidth_gbs      = c.triad_node_gbs;
    m.node.memory_bandwidth_core_gbs = c.triad_core_gbs;
    m.node.gemm_sizes                = c.gemm_sizes;
    m.node.gemm_efficiency           = c.gemm_efficiency;
    m.node.half_gemm_efficiency      = c.half_gemm_efficiency;
    m.node.attention_efficiency      = c.attention_efficiency;
    m.node.optimizer_ns_per_float    = c.optimizer_ns_per_float;
}

void apply(MachineSpec& m, const CommCalibration& c, int ranks) {
    (void)ranks;
    m.network.intra_node_reduce_gbs    = c.allreduce_gbs;
    m.network.sync_us                  = c.sync_us;
    m.network.intra_node_latency_us    = c.alltoall_latency_us;
    m.network.intra_node_bandwidth_gbs = c.alltoall_gbs;
}

}  // namespace bagualu::plan

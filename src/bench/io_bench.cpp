// See io_bench.h. The payload is split like one rank's share of a small MoE model: param, adam_m
// and adam_v of an embedding, four layers (attention, router, two expert matrices, layer norms)
// and a final norm, so a checkpoint holds 3 x 38 slices from a few hundred bytes to a quarter of
// the total. MB is 10^6 bytes of payload (the safetensors header and manifest are not counted).
#include "bench/io_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/checkpoint_stall.h"
#include "bench/scratch_dir.h"
#include "core/error.h"
#include "core/stats.h"
#include "dist/parallel.h"
#include "io/checkpoint/checkpoint.h"

namespace bagualu::bench {

namespace {

namespace fs   = std::filesystem;
namespace ckpt = io::ckpt;
using Clock    = std::chrono::steady_clock;

struct Tensor {
    std::string name;
    size_t offset = 0, numel = 0;  // into the one payload buffer
};

// 3 kinds x 38 tensors covering exactly n floats.
std::vector<Tensor> split(size_t n) {
    // name, share of the large tensors (0: a norm-sized tensor of at most 256 elements)
    std::vector<std::pair<std::string, int>> names = {{"wte", 16}};
    for (int l = 0; l < 4; ++l) {
        const std::string h = fmt::format("h.{}.", l);
        for (auto [suffix, w] :
             std::initializer_list<std::pair<const char*, int>>{{"ln_1.weight", 0},
                                                                {"ln_1.bias", 0},
                                                                {"attn.c_attn.weight", 3},
                                                                {"attn.c_proj.weight", 1},
                                                                {"ln_2.weight", 0},
                                                                {"ln_2.bias", 0},
                                                                {"moe.router.weight", 0},
                                                                {"moe.experts.c_fc.weight", 4},
                                                                {"moe.experts.c_proj.weight", 4}}) {
            names.emplace_back(h + suffix, w);
        }
    }
    names.emplace_back("ln_f.weight", 0);
    int weights = 0, norms = 0;
    for (const auto& [name, w] : names) (w > 0 ? weights : norms) += w > 0 ? w : 1;
    const size_t per_kind = n / 3, norm = std::min<size_t>(256, per_kind / (2 * names.size()));
    const size_t big = per_kind - norm * static_cast<size_t>(norms);
    std::vector<Tensor> out;
    size_t offset = 0;
    for (const char* kind : {"param", "adam_m", "adam_v"}) {
        for (const auto& [name, w] : names) {
            const size_t numel =
                w > 0 ? big * static_cast<size_t>(w) / static_cast<size_t>(weights) : norm;
            out.push_back({fmt::format("{}/{}", kind, name), offset, numel});
            offset += numel;
        }
    }
    out.back().numel += n - offset;  // rounding remainder: the total is exactly n
    return out;
}

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

void drop_cache(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

void write_plain(const std::string& path, const char* data, size_t n) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) input_error("io bench: {}: cannot create", path);
    while (n > 0) {
        const ssize_t w = ::write(fd, data, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ::close(fd);
            input_error("io bench: {}: write failed", path);
        }
        data += w;
        n -= static_cast<size_t>(w);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) input_error("io bench: {}: fsync failed", path);
}

void read_plain(const std::string& path, char* data, size_t n) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) input_error("io bench: {}: cannot open", path);
    while (n > 0) {
        const ssize_t r = ::read(fd, data, std::min<size_t>(n, size_t{1} << 20));  // as `cat` would
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ::close(fd);
            input_error("io bench: {}: read failed", path);
        }
        data += r;
        n -= static_cast<size_t>(r);
    }
    ::close(fd);
}

}  // namespace

int run_io_bench(const IoBenchOptions& o) {
    if (o.bytes < 4096 || o.repeats < 1)
        input_error("io bench: need at least 4096 bytes and one repeat");
    const size_t n                    = o.bytes / sizeof(float);
    const size_t bytes                = n * sizeof(float);
    const std::vector<Tensor> tensors = split(n);
    std::vector<float> payload(n), back(n);
    for (size_t i = 0; i < n; ++i) payload[i] = static_cast<float>(i % 65521) * 1e-3f;
    std::vector<ckpt::Slice> slices;
    for (const Tensor& t : tensors) {
        const auto numel = static_cast<int64_t>(t.numel);
        slices.push_back({t.name, {numel}, 0, numel, payload.data() + t.offset});
    }

    const ScratchDir scratch(o.dir, "bagualu-io-bench-", "io bench: --dir");
    std::vector<double> ckpt_w, plain_w, ckpt_r, plain_r;
    for (int rep = 0; rep < o.repeats; ++rep) {
        const std::string final_dir = ckpt::step_dir(scratch.str(), rep);
        const std::string plain     = fmt::format("{}/plain_{}.bin", scratch.str(), rep);
        auto write_ckpt             = [&] {
            const auto t0         = Clock::now();
            const std::string tmp = final_dir + ".tmp";
            fs::create_directory(tmp);
            ckpt::Manifest m;
            m.step = rep;
            m.files.push_back(ckpt::write_slices(tmp, "rank_00000.safetensors", slices));
            ckpt::write_manifest(tmp, m);
            ckpt::commit(tmp, final_dir);
            ckpt_w.push_back(seconds_since(t0));
        };
        auto write_flat = [&] {
            const auto t0 = Clock::now();
            write_plain(plain, reinterpret_cast<const char*>(payload.data()), bytes);
            plain_w.push_back(seconds_since(t0));
        };
        // Alternate which goes first, so neither always meets the other's writeback.
        if (rep % 2 == 0) {
            write_ckpt();
            write_flat();
        } else {
            write_flat();
            write_ckpt();
        }
        drop_cache(final_dir + "/rank_00000.safetensors");
        drop_cache(plain);
        auto read_ckpt = [&] {
            const auto t0 = Clock::now();
            const ckpt::CheckpointReader r(final_dir);
            for (const Tensor& t : tensors) {
                r.read(t.name, 0, static_cast<int64_t>(t.numel), back.data() + t.offset);
            }
            ckpt_r.push_back(seconds_since(t0));
            BGL_CHECK(std::equal(back.begin(), back.end(), payload.begin()),
                      "checkpoint read back differs");
        };
        auto read_flat = [&] {
            const auto t0 = Clock::now();
            read_plain(plain, reinterpret_cast<char*>(back.data()), bytes);
            plain_r.push_back(seconds_since(t0));
        };
        if (rep % 2 == 0) {
            read_ckpt();
            read_flat();
        } else {
            read_flat();
            read_ckpt();
        }
        std::error_code ec;
        fs::remove_all(final_dir, ec);
        fs::remove(plain, ec);
    }

    auto mbs        = [&](double s) { return s > 0 ? static_cast<double>(bytes) / s * 1e-6 : 0.0; };
    const double cw = median(ckpt_w), pw = median(plain_w), cr = median(ckpt_r),
                 pr          = median(plain_r);
    const double write_ratio = cw > 0 ? pw / cw : 0.0, read_ratio = cr > 0 ? pr / cr : 0.0;
    std::optional<CheckpointStall> stall;
    if (o.stall_config) {
        const std::unique_ptr<dist::ParallelContext> single = dist::ParallelContext::single();
        stall = measure_checkpoint_stall(*o.stall_config, o.stall_steps, o.stall_every,
                                         fs::path(scratch.str()).parent_path().string(), *single);
    }
    if (o.json) {
        nlohmann::json j = {{"bytes", bytes},
                            {"tensors", tensors.size()},
                            {"repeats", o.repeats},
                            {"dir", fs::path(scratch.str()).parent_path().string()},
                            {"write_checkpoint_s", cw},
                            {"write_plain_s", pw},
                            {"write_checkpoint_mbs", mbs(cw)},
                            {"write_plain_mbs", mbs(pw)},
                            {"write_ratio", write_ratio},
                            {"read_checkpoint_s", cr},
                            {"read_plain_s", pr},
                            {"read_checkpoint_mbs", mbs(cr)},
                            {"read_plain_mbs", mbs(pr)},
                            {"read_ratio", read_ratio},
                            {"goal_write_ratio", 0.7}};
        if (stall) {
            j["stall"] = {{"config", o.stall_config->source},
                          {"checkpoints", stall->checkpoints},
                          {"step_s", stall->step_s},
                          {"after_checkpoint_step_s", stall->after_ckpt_s},
                          {"stall_s", stall->stall_s},
                          {"snapshot_s", stall->snapshot_s},
                          {"write_s", stall->write_s},
                          {"checkpoint_bytes_per_rank", stall->bytes_per_rank}};
        }
        fmt::print("{}\n", j.dump(1));
        std::fflush(stdout);
        return 0;
    }
    fmt::print("io bench: {:.1f} MiB in {} tensors, median of {}, in {}\n",
               static_cast<double>(bytes) / (1 << 20), tensors.size(), o.repeats,
               fs::path(scratch.str()).parent_path().string());
    fmt::print("{:<36} {:>9} {:>9}\n", "", "s", "MB/s");
    fmt::print("{:<36} {:>9.3f} {:>9.1f}\n", "write checkpoint (slices+manifest)", cw, mbs(cw));
    fmt::print("{:<36} {:>9.3f} {:>9.1f}\n", "write plain (write+fsync)", pw, mbs(pw));
    fmt::print("{:<36} {:>9.3f} {:>9.1f}\n", "read checkpoint (verified, cold)", cr, mbs(cr));
    fmt::print("{:<36} {:>9.3f} {:>9.1f}\n", "read plain (cold)", pr, mbs(pr));
    fmt::print("write ratio checkpoint/plain: {:.2f} (goal >= 0.7)\n", write_ratio);
    fmt::print("read ratio checkpoint/plain:  {:.2f}\n", read_ratio);
    if (stall) {
        fmt::print("training stall ({}, {} steps, a checkpoint of {:.1f} MiB every {}):\n",
                   o.stall_config->source, o.stall_steps, stall->bytes_per_rank / (1 << 20),
                   o.stall_every);
        fmt::print(
            "  median step {:.3f} s without checkpoints; {:.3f} s for the step after a checkpoint "
            "(stall {:+.3f} s = {:+.1f}% of a step)\n",
            stall->step_s, stall->after_ckpt_s, stall->stall_s,
            stall->step_s > 0 ? 100 * stall->stall_s / stall->step_s : 0.0);
        fmt::print(
            "  the loop's own share (snapshot copy, completion) {:.3f} s per checkpoint; the "
            "background write took {:.3f} s (a synchronous checkpoint's stall)\n",
            stall->snapshot_s, stall->write_s);
    } else {
        fmt::print("training stall: not measured (pass --config FILE with prepared data)\n");
    }
    std::fflush(stdout);
    return 0;
}

}  // namespace bagualu::bench

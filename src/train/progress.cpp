#include "train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "dist/comm/comm.h"

namespace bagualu::train {

Progress::Progress(Mode mode) : mode_(mode) {
    // Under mpirun rank 0's stdout is a pseudo-terminal even when the job's output goes to a
    // file, so a live line would fill logs with escape codes: plain lines there.
    if (mode_ == Mode::Auto) {
        mode_ = isatty(STDOUT_FILENO) && !dist::launched_by_mpi() ? Mode::Live : Mode::Lines;
    }
}

std::string format_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const auto t = static_cast<int64_t>(s + 0.5);
    if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
    if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
    return fmt::format("{}s", t);
}

void Progress::update(int64_t step, int64_t total, double loss, double tps, double mfu,
                      double eta) {
    if (mode_ == Mode::Quiet) return;
    const std::string line =
        fmt::format("step {:>6}/{} | loss {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}", step,
                    total, loss, tps, 100.0 * mfu, format_duration(eta));
    if (mode_ == Mode::Live) {
        fmt::print(stdout, "\r\033[K{}", line);
        live_line_ = true;
    } else {
        fmt::print(stdout, "{}\n", line);
    }
    std::fflush(stdout);
}

void Progress::message(const std::string& line) {
    if (mode_ == Mode::Quiet) return;
    if (live_line_) {
        fmt::print(stdout, "\r\033[K");
        live_line_ = false;
    }
    fmt::print(stdout, "{}\n", line);
    std::fflush(stdout);
}

void Progress::finish() {
    if (live_line_) {
        fmt::print(stdout, "\n");
        live_line_ = false;
    }
    std::fflush(stdout);
}

}  // namespace bagualu::train

// Run and checkpoint directories: locks, start-up checks and checked writes (see run_dir.h).
// flock rather than a pid file alone: the kernel drops the lock when its holder dies, however
// it dies (kill -9 included), so a crashed run never leaves a stale lock behind.
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/file_io.h"
#include "io/checkpoint/checkpoint.h"

namespace bagualu::train {

namespace fs = std::filesystem;

namespace {

// Writes all of bytes to fd; returns false with errno set on failure.
bool write_all(int fd, const char* bytes, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, bytes, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        bytes += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
    return buf;
}

// flock errors that mean the file system cannot lock at all (rather than: someone holds it).
bool lock_unsupported(int err) {
    return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

bool same_directory(const std::string& a, const std::string& b) {
    std::error_code ec;
    const bool same = fs::equivalent(a, b, ec);
    return !ec && same;
}

}  // namespace

// ---- RunDirLock ----

RunDirLock::~RunDirLock() { release(); }

RunDirLock::RunDirLock(RunDirLock&& o) noexcept : fds_(std::move(o.fds_)) { o.fds_.clear(); }

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
    if (this != &o) {
        release();
        fds_ = std::move(o.fds_);
        o.fds_.clear();
    }
    return *this;
}

void RunDirLock::release() {
    for (const int fd : fds_) ::close(fd);  // closing drops the flock
    fds_.clear();
}

void RunDirLock::add(const std::string& dir, const std::string& what) {
    const std::string path = dir + "/" + kLockFileName;
    // O_NOFOLLOW: a link planted in place of the lock file is not written through.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        input_error("{}: {} is not writable: cannot create {}: {}", dir, what, kLockFileName,
                    std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (lock_unsupported(err)) {
            // A file system mounted without lock support: train unprotected, and say so.
            log::warn(
                "{}: cannot lock {} ({}): another run into this directory would not be "
                "stopped",
                dir, kLockFileName, std::strerror(err));
        } else {
            char holder[128] = {};
            const ssize_t n  = ::pread(fd, holder, sizeof(holder) - 1, 0);
            ::close(fd);
            std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
            while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
            if (err == EWOULDBLOCK) {
                input_error(
                    "{}: {} is in use by another bagualu run ({}); wait for it to end or "
                    "choose another directory",
                    dir, what, who.empty() ? "pid unknown" : who);
            }
            input_error("{}: cannot lock {}: {}", dir, path, std::strerror(err));
        }
    }
    const std::string me = fmt::format("pid {} on {}\n", ::getpid(), host_name());
    if (::ftruncate(fd, 0) != 0 || !write_all(fd, me.data(), me.size()) || ::fsync(fd) != 0) {
        const int err = errno;
        ::close(fd);
        input_error("{}: {} is not writable: cannot write {}: {}", dir, what, path,
                    std::strerror(err));
    }
    fds_.push_back(fd);
}

// ---- the run directory ----

RunDirLock prepare_run_dir(const TrainConfig& cfg, bool force, bool resume) {
    const std::string& dir = cfg.train.run_dir;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) input_error("{}: cannot create run directory: {}", dir, ec.message());
    RunDirLock lock;
    lock.add(dir, "the run directory");

    const std::string ckpt_dir         = cfg.checkpoint_dir();
    const bool has_metrics             = fs::exists(dir + "/metrics.jsonl", ec);
    const bool has_model               = fs::exists(dir + "/model", ec);
    const std::vector<std::string> old = io::ckpt::list_complete(ckpt_dir);
    // Every refusal comes before anything is created or deleted.
    if (resume && old.empty() && (has_metrics || has_model) && !force) {
        input_error(
            "{}: --resume found no checkpoint in {}, and training from the start would "
            "replace the earlier run's {}; pass --force to do that, or choose another "
            "--run-dir",
            dir, ckpt_dir, has_metrics ? "metrics.jsonl" : "model/");
    }
    if (!resume && has_metrics && !force) {
        input_error(
            "{}: already holds a run (metrics.jsonl); pass --resume to continue it, "
            "--force to replace it, or choose another --run-dir",
            dir);
    }
    if (!resume && !old.empty() && !force) {
        input_error(
            "{}: holds {} checkpoint(s) of an earlier run; pass --resume to continue "
            "it, --force to replace it, or set checkpoint.dir elsewhere",
            ckpt_dir, old.size());
    }
    if (cfg.checkpoint.every > 0 || resume || !old.empty()) {  // used, or about to be cleared
        fs::create_directories(ckpt_dir, ec);
        if (ec) {
            input_error("{}: cannot create the checkpoint directory: {}", ckpt_dir, ec.message());
        }
        if (!same_directory(dir, ckpt_dir)) lock.add(ckpt_dir, "the checkpoint directory");
    }
    if (!resume && !old.empty()) {
        for (const std::string& c : old) fs::remove_all(c, ec);  // real directories (list_complete)
        log::info("--force: removed {} checkpoint(s) of the replaced run", old.size());
    }
    return lock;
}

void trim_metrics(const std::string& path, int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    std::string kept;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded()) break;  // a line cut by the crash: everything after it goes too
        if (j.contains("step") && j["step"].is_number() && j["step"].get<int64_t>() > step)
            continue;
        kept += line;
        kept += '\n';
    }
    if (in.bad()) input_error("{}: read error", path);
    write_run_file(path, kept);
}

void write_run_file(const std::string& path, const std::string& text) {
    data::write_file_atomic(path, text);
}

// ---- metrics.jsonl ----

MetricsWriter::~MetricsWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::open(const std::string& path, bool append) {
    BGL_CHECK(fd_ < 0, "{} is open already", path_);
    path_ = path;
    fd_ =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd_ < 0) input_error("{}: cannot write: {}", path, std::strerror(errno));
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    size_           = end > 0 ? static_cast<int64_t>(end) : 0;
}

void MetricsWriter::write(const nlohmann::json& j) {
    if (fd_ < 0) return;
    const std::string line = j.dump() + "\n";
    if (!write_all(fd_, line.data(), line.size())) {
        const int err = errno;
        // Drop the partial line so the file stays whole lines (a resume can read it).
        const bool trimmed = ::ftruncate(fd_, static_cast<off_t>(size_)) == 0;
        ::close(fd_);
        fd_ = -1;
        input_error("{}: cannot write: {} (training stopped{})", path_, std::strerror(err),
                    trimmed ? "; the lines written before are kept" : "");
    }
    size_ += static_cast<int64_t>(line.size());
}

void MetricsWriter::close() {
    if (fd_ < 0) return;
    const int fd  = fd_;
    fd_           = -1;
    const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // EINVAL: a file that cannot sync
    const int err = errno;
    if (::close(fd) != 0 || !ok) {
        input_error("{}: cannot write: {}", path_, std::strerror(ok ? errno : err));
    }
}

}  // namespace bagualu::train

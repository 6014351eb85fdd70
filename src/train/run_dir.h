// The run directory and checkpoint directory of one `train` run: taking them (an exclusive lock
// and a write check at start-up, before any step), the rules for an earlier run found there,
// and the files the run writes into them with every write checked.
//   Lock: flock on <dir>/.bagualu-lock, held for the life of the run; the file holds the
//   holder's pid and host. A second run into the same directory fails at once naming both.
//   Earlier run: a new run refuses a directory holding metrics.jsonl or checkpoints unless
//   --force; --resume refuses one with metrics.jsonl or model/ but no checkpoint unless --force
//   (it would train from the start and replace them).
// Only rank 0 (the writer) calls these. Errors are InputErrors naming the file or directory.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"

namespace bagualu::train {

// Exclusive locks on directories, released when the object dies (or the process ends).
class RunDirLock {
   public:
    RunDirLock() = default;
    ~RunDirLock();
    RunDirLock(RunDirLock&& o) noexcept;
    RunDirLock& operator=(RunDirLock&& o) noexcept;
    RunDirLock(const RunDirLock&)            = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;

    // Locks dir (which must exist): creates <dir>/.bagualu-lock and writes this process's pid
    // and host into it, which also proves the directory writable. Throws InputError naming dir
    // (and the holder's pid when another process holds it); `what` says which directory it is.
    void add(const std::string& dir, const std::string& what);

   private:
    void release();
    std::vector<int> fds_;
};

inline constexpr const char* kLockFileName = ".bagualu-lock";

// Creates and locks the run directory; applies the earlier-run rules above before creating or
// deleting anything else; then creates and locks the checkpoint directory when the run uses one
// (checkpoint.every > 0 or resume) or --force clears one, and with force (not resume) deletes
// the earlier run's complete checkpoints. The locks live as long as the returned object.
RunDirLock prepare_run_dir(const TrainConfig& cfg, bool force, bool resume);

// Keeps the lines of a resumed run's metrics.jsonl up to its checkpoint's step (the steps after
// it are trained again), through a temporary file and a rename.
void trim_metrics(const std::string& path, int64_t step);

// Writes text to path through path.tmp and a rename, every write checked.
void write_run_file(const std::string& path, const std::string& text);

// metrics.jsonl: one JSON object per line, each line written whole with write(2) (no buffering
// to lose). A failed write (a full disk) truncates the file back to its last whole line and
// throws InputError naming the file, so training stops at once instead of failing at the end.
class MetricsWriter {
   public:
    MetricsWriter() = default;  // writes nothing until open()
    ~MetricsWriter();
    MetricsWriter(const MetricsWriter&)            = delete;
    MetricsWriter& operator=(const MetricsWriter&) = delete;

    // append: keep the lines already there (a resumed run); else start the file empty.
    void open(const std::string& path, bool append);
    void write(const nlohmann::json& j);  // no-op when not open
    void close();                         // checked (fsync's result)

   private:
    std::string path_;
    int fd_       = -1;
    int64_t size_ = 0;  // bytes of whole lines written
};

}  // namespace bagualu::train

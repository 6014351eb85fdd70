// Sharded checkpoints: each rank writes the slices of the model/optimizer tensors it owns into
// its own safetensors file; rank 0 writes manifest.json last, naming every logical tensor, its
// full shape and which flat range [begin, end) lives in which file under which key, with an
// xxhash64 per file. A checkpoint is complete iff its manifest exists. Any layout can read any
// other's checkpoint, slice by slice (resharding). docs/checkpoint-format.md is the spec.
// This file knows nothing of models, optimizers or MPI: callers hand it float slices.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/safetensors_dtype.h"

namespace bagualu::io {
class SafetensorsFile;
}

namespace bagualu::io::ckpt {

// A flat range of one logical tensor, owned by the writing rank.
struct Slice {
    std::string tensor;             // logical name, e.g. "param/h.1.moe.experts.5.c_fc.weight"
    std::vector<int64_t> shape;     // the full tensor's shape
    int64_t begin = 0, end = 0;     // flat element range within the full tensor
    const void* data = nullptr;     // end - begin elements of dtype
    DType dtype      = DType::F32;  // F32, or BF16 (AdamW moments kept in bf16)
};

struct SliceRecord {
    std::string tensor;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;
    std::string key;  // tensor name inside the file
};

struct FileRecord {
    std::string name;  // relative to the checkpoint directory
    uint64_t bytes = 0;
    uint64_t xxh64 = 0;
    std::vector<SliceRecord> slices;
};

struct Manifest {
    int64_t step = 0;
    std::string config_toml;  // the resolved config of the run that wrote it
    int ranks = 1, expert_parallel = 1;
    std::vector<FileRecord> files;
    nlohmann::json state = nlohmann::json::object();  // sampler cursor, RNG, counters
};

inline constexpr const char* kManifestName = "manifest.json";

// Writes slices as 1-D tensors of their dtype to dir/name (atomic: temp file, fsync, rename) and
// returns the record, hash included (computed while writing). Throws InputError on I/O failure.
FileRecord write_slices(const std::string& dir, const std::string& name,
                        std::span<const Slice> slices);

nlohmann::json manifest_to_json(const Manifest& m);
// Strict: every field present and typed; slice ranges inside their shapes; no two slices of a
// tensor overlap. Throws InputError naming `source` and the offending field.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& source);
// Reads and validates dir/manifest.json: a regular file (a FIFO or directory in its place is
// refused before opening), valid JSON, manifest_from_json's checks, and a step that agrees with
// dir's name when dir is named step_NNNNNNNN. Throws InputError naming the file.
Manifest read_manifest(const std::string& dir);
// Writes dir/manifest.json atomically (the completion marker: write it last).
void write_manifest(const std::string& dir, const Manifest& m);

class CheckpointReader {
   public:
    // Parses and validates dir/manifest.json; checks every file's size, and its xxhash64 when
    // verify_hashes. Throws InputError naming the file on any problem.
    explicit CheckpointReader(const std::string& dir, bool verify_hashes = true);
    CheckpointReader(CheckpointReader&&) noexcept;
    CheckpointReader& operator=(CheckpointReader&&) noexcept;
    ~CheckpointReader();

    const Manifest& manifest() const { return manifest_; }
    const std::string& dir() const { return dir_; }
    bool has(const std::string& tensor) const;
    // Full shape of a logical tensor; throws if absent.
    const std::vector<int64_t>& shape(const std::string& tensor) const;
    // Fills out[0 .. end-begin) with elements [begin, end) of the tensor, from however many
    // slices cover them; throws InputError when some element is in no slice. Each shard file is
    // mapped once, on first use, and stays mapped while the reader lives. Thread-safe. A slice
    // holds F32 or BF16 values; read widens BF16 (exact), read_bf16 rounds F32 to nearest even
    // (core/dtype.h bf16_from_float), so a tensor loads in either form whichever was written.
    void read(const std::string& tensor, int64_t begin, int64_t end, float* out) const;
    void read_bf16(const std::string& tensor, int64_t begin, int64_t end, uint16_t* out) const;

   private:
    // read / read_bf16: out points at element begin's place, of the requested type
    void read_as(const std::string& tensor, int64_t begin, int64_t end, void* out,
                 DType out_dtype) const;
    struct Files;  // the mapped shard files, behind a mutex
    std::string dir_;
    Manifest manifest_;
    // tensor -> (file index, slice index) of each of its slices, in manifest order
    std::unordered_map<std::string, std::vector<std::pair<size_t, size_t>>> index_;
    std::unique_ptr<Files> files_;
};

// ---- directories of checkpoints: <root>/step_00000040 ----
std::string step_dir(const std::string& root, int64_t step);
// N for a name "step_" followed by exactly 8 digits; nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(const std::string& name);
// Complete checkpoints (with a manifest) under root, newest first: real directories named by
// step_dir (symbolic links and other names are ignored).
std::vector<std::string> list_complete(const std::string& root);
// Moves tmp_dir to final_dir (fsyncing the parent), replacing nothing: final_dir must not exist.
void commit(const std::string& tmp_dir, const std::string& final_dir);
// Deletes complete checkpoints beyond the newest `keep` (keep <= 0: keeps all). Never follows
// a symbolic link and never deletes anything outside root.
void prune(const std::string& root, int keep);
// xxhash64 of a whole file.
uint64_t file_xxh64(const std::string& path);

}  // namespace bagualu::io::ckpt

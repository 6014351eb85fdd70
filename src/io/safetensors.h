// Safetensors files: an 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then
// the byte buffer that the offsets index. The writer is atomic (temp file, fsync, rename); the
// reader maps the file read-only and validates the header strictly before handing out any
// bytes. Tensors are raw row-major little-endian data; no framework types are involved here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/safetensors_dtype.h"

namespace bagualu::io {

// One tensor to write: `data` holds numel(shape) * dtype_size(dtype) bytes, row-major.
struct TensorRef {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // [] is a scalar; a 0 anywhere makes an empty tensor
    const void* data;            // may be null when the tensor has no bytes
};

// Writes `tensors` in the given order, contiguous, after a header padded with spaces to a
// multiple of 8 bytes. `metadata` goes to "__metadata__" (omitted when empty). The file appears
// at `path` complete or not at all. Throws InputError naming `path` on any I/O failure. When
// `xxh64` is given it receives the XXH64 (seed 0) of the whole file, computed while writing.
void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       uint64_t* xxh64                                    = nullptr);

struct TensorInfo {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t numel;
    uint64_t begin;  // byte offsets into the byte buffer, as in the header: [begin, end)
    uint64_t end;
};

class SafetensorsFile {
   public:
    // Maps and validates the file at `path`. Throws InputError naming the file on any defect.
    explicit SafetensorsFile(const std::string& path);
    // Validates an in-memory copy of a file; `name` stands in for the path in error messages.
    static SafetensorsFile from_memory(std::span<const std::byte> data, const std::string& name);

    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
    ~SafetensorsFile();

    const std::string& path() const { return path_; }
    // Tensor names in the order of their data in the byte buffer (header order breaks ties).
    const std::vector<std::string>& names() const { return names_; }
    bool contains(const std::string& name) const { return index_.contains(name); }
    // Throws InputError naming the file and tensor if there is no such tensor.
    const TensorInfo& info(const std::string& name) const;
    // The tensor's raw bytes inside the file; valid while this object lives. No alignment
    // beyond 1 byte is guaranteed.
    std::span<const std::byte> bytes(const std::string& name) const;
    // The tensor as float: F32 is copied, BF16/F16/F64 are converted. Integer dtypes throw
    // InputError (they are not meant to be read as weights).
    std::vector<float> read_f32(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

   private:
    struct Storage;
    SafetensorsFile(std::unique_ptr<Storage> storage, const std::string& path);
    void parse();

    std::unique_ptr<Storage> storage_;
    std::string path_;
    std::span<const std::byte> buffer_;  // the byte buffer after the header
    std::vector<TensorInfo> tensors_;    // in names_ order
    std::vector<std::string> names_;
    std::unordered_map<std::string, std::size_t> index_;  // name -> position in tensors_
    std::map<std::string, std::string> metadata_;
};

}  // namespace bagualu::io

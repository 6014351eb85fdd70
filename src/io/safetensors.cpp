// Safetensors reader and writer. The reader trusts nothing in the file: every length and offset
// is checked against the real file size before use, and the header must describe a byte buffer
// that its tensors cover exactly (no overlaps, no holes, no trailing bytes). The writer builds
// the header first, then streams tensor bytes into a temp file that is renamed into place.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "core/error.h"

namespace bagualu::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // same limit as the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

std::string errno_text(int err) { return std::strerror(err); }

// ---- element conversions ----

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

float f16_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp  = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
        const float mag = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -mag : mag;
    }
    const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant << 13)  // inf / nan
                                    : sign | ((exp + 112) << 23) | (mant << 13);
    return std::bit_cast<float>(bits);
}

template <typename T>
T load(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// numel and byte size of `shape` with overflow checks; nullopt on overflow.
std::optional<std::pair<int64_t, uint64_t>> shape_size(std::span<const int64_t> shape,
                                                       DType dtype) {
    uint64_t numel = 1;
    for (int64_t d : shape) {
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) return std::nullopt;
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, dtype_size(dtype), &nbytes)) return std::nullopt;
    if (numel > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return std::pair{static_cast<int64_t>(numel), nbytes};
}

// ---- writing ----

// Owns the temp file until commit(); removes it on any early exit.
class TempFile {
   public:
    explicit TempFile(const std::string& path) : path_(path) {
        static std::atomic<uint64_t> counter{0};
        for (int attempt = 0; attempt < 100; ++attempt) {
            tmp_ = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
            fd_  = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd_ >= 0 || errno != EEXIST) break;
        }
        if (fd_ < 0) fail("cannot create temp file " + tmp_);
    }
    TempFile(const TempFile&)            = delete;
    TempFile& operator=(const TempFile&) = delete;
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(tmp_.c_str());
    }

    void write(const void* data, std::size_t n) {
        const char* p = static_cast<const char*>(data);
        while (n > 0) {
            const ssize_t w = ::write(fd_, p, std::min<std::size_t>(n, 1u << 30));
            if (w < 0) {
                if (errno == EINTR) continue;
                fail("write failed");
            }
            p += w;
            n -= static_cast<std::size_t>(w);
        }
    }

    void commit() {
        if (::fsync(fd_) != 0) fail("fsync failed");
        const int fd = fd_;
        fd_          = -1;
        if (::close(fd) != 0) fail("close failed");
        if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename from " + tmp_ + " failed");
        committed_ = true;
        // Make the rename itself durable; a failure here leaves a complete file, so ignore it.
        std::string dir = std::filesystem::path(path_).parent_path().string();
        if (dir.empty()) dir = ".";
        const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            ::fsync(dfd);
            ::close(dfd);
        }
    }

   private:
    [[noreturn]] void fail(const std::string& what) const {
        input_error("{}: cannot write safetensors file: {}: {}", path_, what, errno_text(errno));
    }

    std::string path_;
    std::string tmp_;
    int fd_         = -1;
    bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const std::map<std::string, std::string>& metadata, uint64_t* xxh64) {
    // The header is assembled entry by entry so that it keeps the given tensor order.
    std::string text = "{";
    std::vector<uint64_t> nbytes(tensors.size());
    try {
        if (!metadata.empty())
            text += fmt::format("\"{}\":{}", kMetadataKey, Json(metadata).dump());
        std::unordered_set<std::string> seen;
        uint64_t offset = 0;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const TensorRef& t = tensors[i];
            BGL_CHECK(t.name != kMetadataKey, "tensor name {} is reserved", t.name);
            BGL_CHECK(seen.insert(t.name).second, "duplicate tensor name {}", t.name);
            for (int64_t d : t.shape) BGL_CHECK(d >= 0, "tensor {} has negative dim {}", t.name, d);
            const auto size = shape_size(t.shape, t.dtype);
            BGL_CHECK(size.has_value(), "tensor {} is too large", t.name);
            nbytes[i] = size->second;
            BGL_CHECK(t.data != nullptr || nbytes[i] == 0, "tensor {} has no data", t.name);
            const Json entry = {{"dtype", dtype_name(t.dtype)},
                                {"shape", t.shape},
                                {"data_offsets", {offset, offset + nbytes[i]}}};
            if (text.size() > 1) text += ',';
            text += Json(t.name).dump() + ":" + entry.dump();
            offset += nbytes[i];
        }
    } catch (const Json::exception& e) {
        BGL_CHECK(false, "cannot encode the header of {}: {}", path, e.what());
    }
    text += '}';
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t header_len = text.size();

    // The hash is computed from the caller's memory on a second thread, overlapping the writes
    // and the fsync, instead of reading the file back afterwards. (The future's destructor
    // waits for it on every path out, exceptions included.)
    std::future<uint64_t> hash;
    if (xxh64 != nullptr) {
        hash = std::async(std::launch::async, [&] {
            XXH64_state_t* st = XXH64_createState();
            BGL_CHECK(st != nullptr, "cannot allocate an xxhash state");
            XXH64_reset(st, 0);
            XXH64_update(st, &header_len, sizeof(header_len));
            XXH64_update(st, text.data(), text.size());
            for (std::size_t i = 0; i < tensors.size(); ++i) {
                if (nbytes[i] > 0) XXH64_update(st, tensors[i].data, nbytes[i]);
            }
            const uint64_t h = XXH64_digest(st);
            XXH64_freeState(st);
            return h;
        });
    }
    TempFile file(path);
    file.write(&header_len, sizeof(header_len));
    file.write(text.data(), text.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) file.write(tensors[i].data, nbytes[i]);
    file.commit();
    if (hash.valid()) *xxh64 = hash.get();
}

// ---- reading ----

struct SafetensorsFile::Storage {
    std::span<const std::byte> bytes;
    void* map             = nullptr;  // mmap'd region, or null when `owned` holds the bytes
    std::size_t map_bytes = 0;
    std::vector<std::byte> owned;

    Storage()                          = default;
    Storage(const Storage&)            = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
        if (map != nullptr) ::munmap(map, map_bytes);
    }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Storage> storage, const std::string& path)
    : storage_(std::move(storage)), path_(path) {
    parse();
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: a FIFO in the file's place is refused below instead of blocking the open.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) input_error("{}: cannot open safetensors file: {}", path, errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        input_error("{}: cannot stat safetensors file: {}", path, errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        input_error("{}: not a regular file", path);
    }
    storage_         = std::make_unique<Storage>();
    const auto bytes = static_cast<std::size_t>(st.st_size);
    if (bytes > 0) {
        void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            input_error("{}: cannot map safetensors file: {}", path, errno_text(err));
        }
        storage_->map       = map;
        storage_->map_bytes = bytes;
        storage_->bytes     = {static_cast<const std::byte*>(map), bytes};
    }
    ::close(fd);
    parse();
}

SafetensorsFile SafetensorsFile::from_memory(std::span<const std::byte> data,
                                             const std::string& name) {
    auto storage = std::make_unique<Storage>();
    storage->owned.assign(data.begin(), data.end());
    storage->bytes = storage->owned;
    return SafetensorsFile(std::move(storage), name);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept            = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile()                                     = default;

namespace {

// Parses the header JSON, rejecting duplicate keys at any level (the DOM would silently keep
// one of them) and nesting deeper than a valid header needs. `top_keys` receives the top-level
// keys in file order, which the DOM (a sorted map) does not keep.
Json parse_header(std::string_view text, const std::string& path,
                  std::vector<std::string>& top_keys) {
    std::vector<std::set<std::string>> keys_seen;  // one set per open object
    auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
        switch (event) {
            case Json::parse_event_t::object_start:
            case Json::parse_event_t::array_start:
                if (depth > 2) input_error("{}: header JSON is nested too deeply", path);
                if (event == Json::parse_event_t::object_start) keys_seen.emplace_back();
                break;
            case Json::parse_event_t::object_end:
                keys_seen.pop_back();
                break;
            case Json::parse_event_t::key:
                if (!keys_seen.back().insert(parsed.get<std::string>()).second) {
                    input_error("{}: header has duplicate key \"{}\"", path,
                                parsed.get<std::string>());
                }
                if (depth == 1) top_keys.push_back(parsed.get<std::string>());
                break;
            default:
                break;
        }
        return true;
    };
    try {
        return Json::parse(text.begin(), text.end(), on_event);
    } catch (const Json::exception& e) {
        input_error("{}: header is not valid JSON: {}", path, json_error_text(e.what()));
    }
}

uint64_t get_offset(const Json& v, const std::string& path, const std::string& name) {
    if (!v.is_number_unsigned()) {
        input_error("{}: tensor \"{}\": data_offsets must be non-negative integers, got {}", path,
                    name, v.dump());
    }
    return v.get<uint64_t>();
}

TensorInfo parse_tensor_entry(const std::string& name, const Json& entry, const std::string& path) {
    if (!entry.is_object()) input_error("{}: tensor \"{}\": entry is not an object", path, name);
    for (const auto& [key, value] : entry.items()) {
        if (key != "dtype" && key != "shape" && key != "data_offsets") {
            input_error("{}: tensor \"{}\": unexpected field \"{}\"", path, name, key);
        }
    }
    if (!entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
        input_error("{}: tensor \"{}\": needs dtype, shape and data_offsets", path, name);
    }
    TensorInfo info;
    info.name        = name;
    const Json& type = entry.at("dtype");
    const auto dtype = type.is_string() ? parse_dtype(type.get<std::string>()) : std::nullopt;
    if (!dtype) {
        input_error(
            "{}: tensor \"{}\": unsupported dtype {} (expected F32, BF16, F16, F64, I32, "
            "I64 or U8)",
            path, name, type.dump());
    }
    info.dtype        = *dtype;
    const Json& shape = entry.at("shape");
    if (!shape.is_array()) input_error("{}: tensor \"{}\": shape is not an array", path, name);
    for (const Json& d : shape) {
        if (d.is_number_integer() && !d.is_number_unsigned()) {  // negative
            input_error("{}: tensor \"{}\": shape has negative dim {}", path, name, d.dump());
        }
        if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
            input_error("{}: tensor \"{}\": shape dims must be non-negative integers, got {}", path,
                        name, d.dump());
        }
        info.shape.push_back(d.get<int64_t>());
    }
    const Json& offsets = entry.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) {
        input_error("{}: tensor \"{}\": data_offsets must be [begin, end]", path, name);
    }
    info.begin = get_offset(offsets[0], path, name);
    info.end   = get_offset(offsets[1], path, name);
    if (info.begin > info.end) {
        input_error("{}: tensor \"{}\": data_offsets begin {} > end {}", path, name, info.begin,
                    info.end);
    }
    const auto size = shape_size(info.shape, info.dtype);
    if (!size) input_error("{}: tensor \"{}\": shape is too large", path, name);
    info.numel = size->first;
    if (size->second != info.end - info.begin) {
        input_error(
            "{}: tensor \"{}\": shape {} of {} needs {} bytes but data_offsets [{}, {}] "
            "span {}",
            path, name, shape.dump(), dtype_name(info.dtype), size->second, info.begin, info.end,
            info.end - info.begin);
    }
    return info;
}

}  // namespace

void SafetensorsFile::parse() {
    const std::span<const std::byte> file = storage_->bytes;
    if (file.size() < 8) {
        input_error("{}: file is {} bytes, too short for the 8-byte header length", path_,
                    file.size());
    }
    const uint64_t header_len = load<uint64_t>(file.data());
    if (header_len > kMaxHeaderBytes) {
        input_error("{}: header length {} exceeds the {} byte limit", path_, header_len,
                    kMaxHeaderBytes);
    }
    if (header_len > file.size() - 8) {
        input_error("{}: header length {} runs past the end of the file ({} bytes)", path_,
                    header_len, file.size());
    }
    const auto header_bytes = file.subspan(8, header_len);
    if (header_len == 0 || header_bytes[0] != std::byte{'{'}) {
        input_error("{}: header does not start with '{{'", path_);
    }
    const std::string_view text(reinterpret_cast<const char*>(header_bytes.data()), header_len);
    std::vector<std::string> top_keys;
    const Json header = parse_header(text, path_, top_keys);
    if (!header.is_object()) input_error("{}: header is not a JSON object", path_);
    buffer_ = file.subspan(8 + header_len);

    for (const std::string& key : top_keys) {
        const Json& value = header.at(key);
        if (key == kMetadataKey) {
            if (!value.is_object()) input_error("{}: __metadata__ is not an object", path_);
            for (const auto& [mkey, mvalue] : value.items()) {
                if (!mvalue.is_string()) {
                    input_error("{}: __metadata__ value for \"{}\" is not a string", path_, mkey);
                }
                metadata_[mkey] = mvalue.get<std::string>();
            }
            continue;
        }
        tensors_.push_back(parse_tensor_entry(key, value, path_));
    }

    // The tensors, in buffer order, must tile [0, buffer size) exactly.
    std::stable_sort(tensors_.begin(), tensors_.end(),
                     [](const TensorInfo& a, const TensorInfo& b) {
                         return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                     });
    uint64_t covered = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const TensorInfo& t = tensors_[i];
        if (t.begin < covered) {
            input_error("{}: tensor \"{}\" bytes [{}, {}) overlap tensor \"{}\"", path_, t.name,
                        t.begin, t.end, tensors_[i - 1].name);
        }
        if (t.begin > covered) {
            input_error("{}: bytes [{}, {}) of the data buffer belong to no tensor", path_, covered,
                        t.begin);
        }
        covered = t.end;
    }
    if (covered != buffer_.size()) {
        if (covered > buffer_.size()) {
            input_error("{}: tensors need {} data bytes but the file holds {} (truncated?)", path_,
                        covered, buffer_.size());
        }
        input_error("{}: {} trailing bytes after the last tensor", path_, buffer_.size() - covered);
    }

    names_.reserve(tensors_.size());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
        names_.push_back(tensors_[i].name);
        index_.emplace(tensors_[i].name, i);
    }
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) input_error("{}: no tensor named \"{}\"", path_, name);
    return tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
    const TensorInfo& t = info(name);
    return buffer_.subspan(t.begin, t.end - t.begin);
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
    const TensorInfo& t                = info(name);
    const std::span<const std::byte> b = bytes(name);
    const auto n                       = static_cast<std::size_t>(t.numel);
    std::vector<float> out(n);
    switch (t.dtype) {
        case DType::F32:
            if (n > 0) std::memcpy(out.data(), b.data(), n * sizeof(float));
            break;
        case DType::BF16:
            for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(load<uint16_t>(&b[2 * i]));
            break;
        case DType::F16:
            for (std::size_t i = 0; i < n; ++i) out[i] = f16_to_float(load<uint16_t>(&b[2 * i]));
            break;
        case DType::F64:
            for (std::size_t i = 0; i < n; ++i) {
                out[i] = static_cast<float>(load<double>(&b[8 * i]));
            }
            break;
        default:
            input_error("{}: tensor \"{}\" has dtype {}, expected F32, BF16, F16 or F64", path_,
                        name, dtype_name(t.dtype));
    }
    return out;
}

}  // namespace bagualu::io

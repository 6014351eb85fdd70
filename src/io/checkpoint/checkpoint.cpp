#include "io/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace bagualu::io::ckpt {

namespace fs = std::filesystem;

static std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t file_xxh64(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) input_error("{}: cannot open", path);
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    std::vector<char> buf(1 << 20);
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            ::close(fd);
            XXH64_freeState(st);
            input_error("{}: read failed", path);
        }
        if (n == 0) break;
        XXH64_update(st, buf.data(), static_cast<size_t>(n));
    }
    ::close(fd);
    const uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

FileRecord write_slices(const std::string& dir, const std::string& name,
                        std::span<const Slice> slices) {
    std::vector<TensorRef> refs;
    FileRecord rec;
    rec.name = name;
    for (const Slice& s : slices) {
        BGL_CHECK(s.begin >= 0 && s.end >= s.begin, "slice [{}, {}) of {}", s.begin, s.end,
                  s.tensor);
        SliceRecord r{s.tensor, s.shape, s.begin, s.end,
                      fmt::format("{}[{}:{}]", s.tensor, s.begin, s.end)};
        BGL_CHECK(s.dtype == DType::F32 || s.dtype == DType::BF16, "slice of {} in {}", s.tensor,
                  dtype_name(s.dtype));
        refs.push_back(TensorRef{r.key, s.dtype, {s.end - s.begin}, s.data});
        rec.slices.push_back(std::move(r));
    }
    const std::string path = dir + "/" + name;
    write_safetensors(path, refs, {{"format", "bagualu-checkpoint-shard"}}, &rec.xxh64);
    rec.bytes = fs::file_size(path);
    return rec;
}

nlohmann::json manifest_to_json(const Manifest& m) {
    nlohmann::json files = nlohmann::json::array();
    for (const FileRecord& f : m.files) {
        nlohmann::json slices = nlohmann::json::array();
        for (const SliceRecord& s : f.slices) {
            slices.push_back({{"tensor", s.tensor},
                              {"shape", s.shape},
                              {"begin", s.begin},
                              {"end", s.end},
                              {"key", s.key}});
        }
        files.push_back({{"name", f.name},
                         {"bytes", f.bytes},
                         {"xxh64", hex64(f.xxh64)},
                         {"slices", std::move(slices)}});
    }
    return nlohmann::json{{"format", "bagualu-checkpoint"},
                          {"version", 1},
                          {"step", m.step},
                          {"config", m.config_toml},
                          {"layout", {{"ranks", m.ranks}, {"expert_parallel", m.expert_parallel}}},
                          {"files", std::move(files)},
                          {"state", m.state}};
}

namespace {

constexpr int64_t kMaxRanks = int64_t{1} << 20;

// No directories, no hidden or special names, nothing a path or a terminal would misread.
bool plain_file_name(const std::string& name) {
    if (name.empty() || name.size() > 255 || name[0] == '.') return false;
    for (const char c : name) {
        if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            return false;
    }
    return true;
}

// Typed field access with one-line errors naming the manifest and the field.
struct Fields {
    const std::string& source;
    const nlohmann::json& at(const nlohmann::json& obj, const char* key,
                             const std::string& where) const {
        if (!obj.is_object() || !obj.contains(key))
            input_error("{}: missing {}{}", source, where, key);
        return obj[key];
    }
    int64_t integer(const nlohmann::json& obj, const char* key, const std::string& where) const {
        const auto& v = at(obj, key, where);
        if (!v.is_number_integer()) input_error("{}: {}{} must be an integer", source, where, key);
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
            input_error("{}: {}{} = {} is too large", source, where, key, v.get<uint64_t>());
        }
        return v.get<int64_t>();
    }
    std::string string(const nlohmann::json& obj, const char* key, const std::string& where) const {
        const auto& v = at(obj, key, where);
        if (!v.is_string()) input_error("{}: {}{} must be a string", source, where, key);
        return v.get<std::string>();
    }
};

}  // namespace

Manifest manifest_from_json(const nlohmann::json& j, const std::string& source) {
    const Fields f{source};
    if (f.string(j, "format", "") != "bagualu-checkpoint")
        input_error("{}: format is not bagualu-checkpoint", source);
    if (f.integer(j, "version", "") != 1)
        input_error("{}: unsupported version (expected 1)", source);
    Manifest m;
    m.step              = f.integer(j, "step", "");
    m.config_toml       = f.string(j, "config", "");
    const auto& layout  = f.at(j, "layout", "");
    const int64_t ranks = f.integer(layout, "ranks", "layout.");
    const int64_t ep    = f.integer(layout, "expert_parallel", "layout.");
    if (m.step < 0) input_error("{}: step = {} is negative", source, m.step);
    if (ranks < 1 || ranks > kMaxRanks || ep < 1 || ranks % ep != 0) {
        input_error(
            "{}: layout ranks = {}, expert_parallel = {}: need 1 <= ranks <= {} and "
            "expert_parallel dividing ranks",
            source, ranks, ep, kMaxRanks);
    }
    m.ranks           = static_cast<int>(ranks);
    m.expert_parallel = static_cast<int>(ep);
    const auto& files = f.at(j, "files", "");
    if (!files.is_array()) input_error("{}: files must be an array", source);
    if (files.size() != static_cast<size_t>(ranks)) {  // every rank writes one shard file
        input_error("{}: layout ranks = {} but files lists {} shard file(s) (one per rank)", source,
                    ranks, files.size());
    }
    // tensor -> sorted ranges, to find overlaps and shape disagreements
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;
    std::map<std::string, std::vector<int64_t>> shapes;
    std::set<std::string> names;
    for (size_t fi = 0; fi < files.size(); ++fi) {
        const std::string where = fmt::format("files[{}].", fi);
        FileRecord r;
        r.name = f.string(files[fi], "name", where);
        if (!plain_file_name(r.name) || r.name == kManifestName) {
            input_error("{}: {}name '{}' must be a plain file name", source, where, r.name);
        }
        if (!names.insert(r.name).second)
            input_error("{}: {}name '{}' appears twice", source, where, r.name);
        const int64_t bytes = f.integer(files[fi], "bytes", where);
        if (bytes < 0) input_error("{}: {}bytes = {} is negative", source, where, bytes);
        r.bytes             = static_cast<uint64_t>(bytes);
        const std::string h = f.string(files[fi], "xxh64", where);
        if (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos) {
            input_error("{}: {}xxh64 '{}' must be 16 lowercase hex digits", source, where, h);
        }
        r.xxh64            = std::stoull(h, nullptr, 16);
        const auto& slices = f.at(files[fi], "slices", where);
        if (!slices.is_array()) input_error("{}: {}slices must be an array", source, where);
        std::set<std::string> keys;
        for (size_t si = 0; si < slices.size(); ++si) {
            const std::string sw = fmt::format("{}slices[{}].", where, si);
            SliceRecord s;
            s.tensor = f.string(slices[si], "tensor", sw);
            s.key    = f.string(slices[si], "key", sw);
            s.begin  = f.integer(slices[si], "begin", sw);
            s.end    = f.integer(slices[si], "end", sw);
            if (!keys.insert(s.key).second)
                input_error("{}: {}key '{}' appears twice in {}", source, sw, s.key, r.name);
            const auto& shape = f.at(slices[si], "shape", sw);
            if (!shape.is_array()) input_error("{}: {}shape must be an array", source, sw);
            int64_t numel = 1;
            for (const auto& d : shape) {
                if (!d.is_number_integer() || d.get<int64_t>() < 0)
                    input_error("{}: {}shape must hold non-negative integers", source, sw);
                s.shape.push_back(d.get<int64_t>());
                if (s.shape.back() > 0 && numel > (int64_t{1} << 50) / s.shape.back())
                    input_error("{}: {}shape too large", source, sw);
                numel *= s.shape.back();
            }
            if (s.begin < 0 || s.end < s.begin || s.end > numel) {
                input_error("{}: {}range [{}, {}) outside tensor {} of {} elements", source, sw,
                            s.begin, s.end, s.tensor, numel);
            }
            auto [it, fresh] = shapes.emplace(s.tensor, s.shape);
            if (!fresh && it->second != s.shape)
                input_error("{}: {}shape of {} disagrees with another slice", source, sw, s.tensor);
            ranges[s.tensor].emplace_back(s.begin, s.end);
            r.slices.push_back(std::move(s));
        }
        m.files.push_back(std::move(r));
    }
    for (auto& [tensor, rs] : ranges) {
        std::sort(rs.begin(), rs.end());
        for (size_t i = 1; i < rs.size(); ++i) {
            if (rs[i].first < rs[i - 1].second)
                input_error("{}: slices of {} overlap at element {}", source, tensor, rs[i].first);
        }
    }
    m.state = j.contains("state") ? j["state"] : nlohmann::json::object();
    if (!m.state.is_object()) input_error("{}: state must be an object", source);
    return m;
}

void write_manifest(const std::string& dir, const Manifest& m) {
    const std::string path = dir + "/" + kManifestName, tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << manifest_to_json(m).dump(1) << "\n";
        out.flush();
        if (!out) input_error("{}: cannot write", tmp);
    }
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) input_error("{}: cannot rename into place: {}", path, ec.message());
}

Manifest read_manifest(const std::string& dir) {
    const std::string path = dir + "/" + kManifestName;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) {
        input_error("{}: missing (an incomplete or foreign checkpoint)", path);
    }
    // A directory, FIFO or device in its place: refused before opening (a FIFO would block).
    if (!fs::is_regular_file(st)) input_error("{}: is not a regular file", path);
    nlohmann::json j;
    {
        std::ifstream in(path);
        if (!in) input_error("{}: cannot open", path);
        try {
            j = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
            input_error("{}: invalid JSON: {}", path, json_error_text(e.what()));
        }
    }
    Manifest m = manifest_from_json(j, path);
    // What the manifest records must agree with where it sits.
    fs::path where = fs::path(dir).lexically_normal();
    if (where.filename().empty()) where = where.parent_path();  // "step_00000040/"
    if (const std::optional<int64_t> named = parse_step_dir_name(where.filename().string());
        named && *named != m.step) {
        input_error("{}: step = {} but the checkpoint directory is named for step {}", path, m.step,
                    *named);
    }
    return m;
}

struct CheckpointReader::Files {
    std::mutex mutex;
    std::vector<std::unique_ptr<SafetensorsFile>> open;  // by file index; null until first used
};

CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept            = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader()                                      = default;

CheckpointReader::CheckpointReader(const std::string& dir, bool verify_hashes)
    : dir_(dir), files_(std::make_unique<Files>()) {
    manifest_ = read_manifest(dir);
    std::error_code ec;
    for (const FileRecord& f : manifest_.files) {
        const std::string fp = dir + "/" + f.name;
        const auto fst       = fs::status(fp, ec);
        if (fst.type() == fs::file_type::not_found) input_error("{}: missing shard file", fp);
        if (!fs::is_regular_file(fst)) input_error("{}: is not a regular file (a shard file)", fp);
        const auto size = fs::file_size(fp, ec);
        if (ec) input_error("{}: cannot read shard file: {}", fp, ec.message());
        if (size != f.bytes)
            input_error("{}: {} bytes, manifest says {} (truncated?)", fp, size, f.bytes);
        if (verify_hashes && file_xxh64(fp) != f.xxh64) {
            input_error("{}: checksum mismatch (xxh64 {} expected {}): corrupted", fp,
                        hex64(file_xxh64(fp)), hex64(f.xxh64));
        }
    }
    for (size_t fi = 0; fi < manifest_.files.size(); ++fi) {
        for (size_t si = 0; si < manifest_.files[fi].slices.size(); ++si) {
            index_[manifest_.files[fi].slices[si].tensor].emplace_back(fi, si);
        }
    }
    files_->open.resize(manifest_.files.size());
}

bool CheckpointReader::has(const std::string& tensor) const { return index_.contains(tensor); }

const std::vector<int64_t>& CheckpointReader::shape(const std::string& tensor) const {
    const auto it = index_.find(tensor);
    if (it == index_.end()) input_error("{}: no tensor {} in the checkpoint", dir_, tensor);
    const auto [fi, si] = it->second.front();
    return manifest_.files[fi].slices[si].shape;
}

void CheckpointReader::read(const std::string& tensor, int64_t begin, int64_t end,
                            float* out) const {
    read_as(tensor, begin, end, out, DType::F32);
}

void CheckpointReader::read_bf16(const std::string& tensor, int64_t begin, int64_t end,
                                 uint16_t* out) const {
    read_as(tensor, begin, end, out, DType::BF16);
}

void CheckpointReader::read_as(const std::string& tensor, int64_t begin, int64_t end, void* out,
                               DType out_dtype) const {
    BGL_CHECK(begin >= 0 && end >= begin, "read of {} [{}, {})", tensor, begin, end);
    static const std::vector<std::pair<size_t, size_t>> kNone;
    const auto it   = index_.find(tensor);
    int64_t covered = 0;
    for (const auto& [fi, si] : it == index_.end() ? kNone : it->second) {
        const FileRecord& f  = manifest_.files[fi];
        const SliceRecord& s = f.slices[si];
        if (s.end <= begin || s.begin >= end) continue;
        const SafetensorsFile* file = nullptr;
        {
            std::lock_guard lock(files_->mutex);
            auto& open = files_->open[fi];
            if (!open)
                open = std::make_unique<SafetensorsFile>(dir_ + "/" + f.name);  // mapped once
            file = open.get();
        }
        const TensorInfo& ti = file->info(s.key);
        if ((ti.dtype != DType::F32 && ti.dtype != DType::BF16) || ti.numel != s.end - s.begin) {
            input_error("{}/{}: {} does not hold {} F32 or BF16 values as the manifest says", dir_,
                        f.name, s.key, s.end - s.begin);
        }
        const auto bytes = file->bytes(s.key);
        const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
        const size_t n    = static_cast<size_t>(hi - lo);
        const size_t in_e = dtype_size(ti.dtype), out_e = dtype_size(out_dtype);
        const std::byte* src = bytes.data() + static_cast<size_t>(lo - s.begin) * in_e;
        std::byte* dst = static_cast<std::byte*>(out) + static_cast<size_t>(lo - begin) * out_e;
        if (ti.dtype == out_dtype) {
            std::memcpy(dst, src, n * in_e);
        } else {
            // the mapped bytes are not aligned for the element type: a value at a time
            for (size_t i = 0; i < n; ++i) {
                if (out_dtype == DType::F32) {  // BF16 -> F32, exact
                    uint16_t h;
                    std::memcpy(&h, src + 2 * i, 2);
                    const float x = bf16_to_float(h);
                    std::memcpy(dst + 4 * i, &x, 4);
                } else {  // F32 -> BF16, to nearest even
                    float x;
                    std::memcpy(&x, src + 4 * i, 4);
                    const uint16_t h = bf16_from_float(x);
                    std::memcpy(dst + 2 * i, &h, 2);
                }
            }
        }
        covered += hi - lo;
    }
    if (covered != end - begin) {
        input_error("{}: tensor {} elements [{}, {}) are not all in the checkpoint ({} found)",
                    dir_, tensor, begin, end, covered);
    }
}

std::string step_dir(const std::string& root, int64_t step) {
    return fmt::format("{}/step_{:08d}", root, step);
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
    constexpr size_t kDigits = 8;
    if (name.size() != 5 + kDigits || name.rfind("step_", 0) != 0) return std::nullopt;
    int64_t step = 0;
    for (size_t i = 5; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return std::nullopt;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

std::vector<std::string> list_complete(const std::string& root) {
    std::vector<std::pair<int64_t, std::string>> found;
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return {};
    for (const auto& e : fs::directory_iterator(root, ec)) {
        const std::optional<int64_t> step = parse_step_dir_name(e.path().filename().string());
        // Real directories only: a symlinked step_* is never followed (nor pruned through).
        std::error_code lec;
        if (!step || !fs::is_directory(e.symlink_status(lec))) continue;
        if (!fs::exists(e.path() / kManifestName, lec)) continue;
        found.emplace_back(*step, e.path().string());
    }
    std::sort(found.begin(), found.end(), std::greater<>());
    std::vector<std::string> out;
    for (auto& [step, path] : found) out.push_back(path);
    return out;
}

void commit(const std::string& tmp_dir, const std::string& final_dir) {
    std::error_code ec;
    if (fs::exists(final_dir))
        input_error("{}: exists already; a checkpoint is never overwritten", final_dir);
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) input_error("{}: cannot rename into place: {}", final_dir, ec.message());
    const std::string parent = fs::path(final_dir).parent_path().string();
    const int fd             = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

void prune(const std::string& root, int keep) {
    if (keep <= 0) return;
    const std::vector<std::string> all = list_complete(root);
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
        std::error_code ec;
        // list_complete gives real directories directly under root; checked again right here,
        // so that nothing outside root is ever deleted (remove and remove_all delete a link
        // inside, not its target).
        if (fs::is_symlink(all[i], ec)) continue;
        fs::remove(fs::path(all[i]) / kManifestName,
                   ec);  // incomplete first, so a crash mid-delete is safe
        fs::remove_all(all[i], ec);
    }
}

}  // namespace bagualu::io::ckpt

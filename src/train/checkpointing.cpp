#include "train/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "dist/comm/checks.h"
#include "dist/comm/collectives.h"
#include "model/gpt.h"
#include "model/precision.h"

namespace bagualu::train {

namespace fs = std::filesystem;
using Clock  = std::chrono::steady_clock;
using dist::paro::ShardMap;
using dist::paro::ShardPiece;
using dist::paro::StateSpace;

namespace {

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every rank's string, on every rank (a length exchange, then one padded all-gather).
std::vector<std::string> allgather_strings(dist::Comm& comm, const std::string& mine) {
    const int P = comm.size();
    std::vector<int64_t> lens(static_cast<size_t>(P));
    const int64_t n = static_cast<int64_t>(mine.size());
    comm.allgather(&n, sizeof(n), lens.data());
    const size_t width = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
    std::string padded = mine;
    padded.resize(width);
    std::string all(width * static_cast<size_t>(P), '\0');
    if (width > 0) comm.allgather(padded.data(), width, all.data());
    std::vector<std::string> out;
    for (int r = 0; r < P; ++r)
        out.push_back(all.substr(width * static_cast<size_t>(r),
                                 static_cast<size_t>(lens[static_cast<size_t>(r)])));
    return out;
}

std::string tensor_name(const char* kind, const model::ParamSpec& s) {
    return std::string(kind) + "/" + s.name;
}

constexpr const char* kKinds[3] = {"param", "adam_m", "adam_v"};

// Where kind k of a piece lives on this rank: floats (params, float32 moments) or, for bf16
// moments, their bits (the other pointer null), which the file holds as BF16.
struct PieceData {
    float* f       = nullptr;
    uint16_t* bf16 = nullptr;
};
PieceData piece_data(const StateSpace& sp, const ShardPiece& p, float* params, int k) {
    if (k == 0) return {params + p.flat_offset, nullptr};
    const optim::MomentsRef mo = sp.moments.at(sp.flat_indexed ? p.flat_offset : p.shard_offset);
    if (mo.bf16()) return {nullptr, k == 1 ? mo.m16 : mo.v16};
    return {k == 1 ? mo.m : mo.v, nullptr};
}

// Bytes of kind k of a piece in the snapshot: its elements, floats or bf16 moments (a slice is
// only copied and written as bytes, so one after a bf16 slice need not be aligned).
size_t slice_bytes(const StateSpace& sp, const ShardPiece& p, int k) {
    return p.len * (k > 0 && sp.moments.bf16() ? sizeof(uint16_t) : sizeof(float));
}

}  // namespace

TrainerState parse_trainer_state(const nlohmann::json& state, const std::string& source) {
    const auto field = [&](const nlohmann::json& obj, const char* key,
                           const char* where) -> const nlohmann::json& {
        if (!obj.is_object() || !obj.contains(key)) {
            input_error("{}: state.{}{} is missing", source, where, key);
        }
        return obj[key];
    };
    const auto count = [&](const nlohmann::json& obj, const char* key, const char* where) {
        const nlohmann::json& v = field(obj, key, where);
        if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
            v.get<int64_t>() < 0) {
            input_error("{}: state.{}{} = {} must be a non-negative integer", source, where, key,
                        v.dump());
        }
        return v.get<int64_t>();
    };
    TrainerState out;
    const nlohmann::json& sampler = field(state, "sampler", "");
    if (sampler.is_object() && sampler.contains("blend")) {
        const nlohmann::json& splits = sampler["blend"];
        if (!splits.is_array() || splits.empty()) {
            input_error("{}: state.sampler.blend must be a non-empty array of objects", source);
        }
        for (const nlohmann::json& s : splits) {
            BlendSourceState& b     = out.blend.emplace_back();
            const nlohmann::json& d = field(s, "data", "sampler.blend[].");
            if (!d.is_string()) {
                input_error("{}: state.sampler.blend[].data = {} must be a string", source,
                            d.dump());
            }
            b.data                  = d.get<std::string>();
            b.epoch                 = count(s, "epoch", "sampler.blend[].");
            b.position              = count(s, "position", "sampler.blend[].");
            b.windows               = count(s, "windows", "sampler.blend[].");
            const nlohmann::json& e = field(s, "deficit", "sampler.blend[].");
            if (!e.is_number() || !std::isfinite(e.get<double>())) {
                input_error("{}: state.sampler.blend[].deficit = {} must be a number", source,
                            e.dump());
            }
            b.deficit = e.get<double>();
        }
    } else {
        out.epoch    = count(sampler, "epoch", "sampler.");
        out.position = count(sampler, "position", "sampler.");
        if (sampler.contains("windows")) out.windows = count(sampler, "windows", "sampler.");
    }
    if (state.is_object() && state.contains("loss_scale")) {
        const nlohmann::json& ls = state["loss_scale"];
        const nlohmann::json& sc = field(ls, "scale", "loss_scale.");
        if (!sc.is_number() || !std::isfinite(sc.get<double>()) || sc.get<double>() <= 0) {
            input_error("{}: state.loss_scale.scale = {} must be a positive number", source,
                        sc.dump());
        }
        out.has_loss_scale = true;
        out.loss_scale     = sc.get<double>();
        out.clean_steps    = count(ls, "clean_steps", "loss_scale.");
        out.steps_skipped  = count(state, "steps_skipped", "");
    }
    if (state.is_object() && state.contains("balance_bias")) {
        const nlohmann::json& layers = state["balance_bias"];
        if (!layers.is_array()) {
            input_error("{}: state.balance_bias must be an array of arrays of numbers", source);
        }
        for (const nlohmann::json& layer : layers) {
            if (!layer.is_array()) {
                input_error("{}: state.balance_bias must be an array of arrays of numbers", source);
            }
            std::vector<float>& b = out.balance_bias.emplace_back();
            for (const nlohmann::json& v : layer) {
                // a float32 value, exactly: finite and unchanged by the round trip through float
                if (!v.is_number() || !std::isfinite(v.get<double>()) ||
                    static_cast<double>(static_cast<float>(v.get<double>())) != v.get<double>()) {
                    input_error("{}: state.balance_bias holds {}: expected float32 values", source,
                                v.dump());
                }
                b.push_back(static_cast<float>(v.get<double>()));
            }
        }
    }
    return out;
}

Checkpointer::Checkpointer(const TrainConfig& cfg, const model::ParamLayout& layout,
                           dist::paro::Optimizer& opt, dist::ParallelContext& par)
    : cfg_(cfg), layout_(layout), opt_(opt), par_(par), root_(cfg.checkpoint_dir()) {
    write_job_ = [this] {  // runs on io_; reads only the snapshot
        const auto t0 = Clock::now();
        std::error_code ec;
        fs::create_directories(tmp_dir_, ec);
        if (ec) input_error("{}: cannot create: {}", tmp_dir_, ec.message());
        record_ = io::ckpt::write_slices(
            tmp_dir_, fmt::format("rank_{:05d}.safetensors", par_.rank()), slices_);
        write_s_ += seconds_since(t0);
        bytes_ += record_.bytes;
    };
    std::string error;
    if (par.rank() == 0) {
        std::error_code ec;
        fs::create_directories(root_, ec);
        if (ec) {
            error =
                fmt::format("{}: cannot create the checkpoint directory: {}", root_, ec.message());
        } else {
            for (const auto& e : fs::directory_iterator(root_, ec)) {
                const std::string name = e.path().filename().string();
                if (name.rfind("step_", 0) == 0 && name.ends_with(".tmp"))
                    fs::remove_all(e.path(), ec);
            }
        }
    }
    dist::fail_together(par.world(), error);
    // the snapshot buffer, allocated and touched now rather than at the first checkpoint
    if (cfg.checkpoint.every > 0) snapshot_ = Buffer<std::byte>(snapshot_bytes());
}

Checkpointer::~Checkpointer() {
    try {
        io_.wait(std::max(ticket_, commit_ticket_));
    } catch (...) {  // the run is ending on another error already
    }
}

std::optional<ResumePoint> Checkpointer::load_latest(float* params) {
    std::string chosen, error;
    if (par_.rank() == 0) {
        const std::vector<std::string> all = io::ckpt::list_complete(root_);
        std::vector<std::string> bad;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(root_, ec)) {
            const std::string name = e.path().filename().string();
            if (name.rfind("step_", 0) == 0 && name.size() == 13 &&
                !fs::exists(e.path() / io::ckpt::kManifestName)) {
                log::warn(
                    "{}: no manifest.json (incomplete: its run stopped before finishing it); "
                    "skipping it",
                    e.path().string());
            }
        }
        for (const std::string& dir : all) {
            try {
                io::ckpt::CheckpointReader check(dir, true);
                chosen = dir;
                break;
            } catch (const InputError& e) {
                log::warn("{}; skipping this checkpoint", e.what());
                bad.push_back(fs::path(dir).filename().string());
            }
        }
        if (chosen.empty() && !all.empty()) {
            error = fmt::format(
                "{}: no usable checkpoint ({} failed their checks); move them away "
                "or train without --resume (checkpoint.resume)",
                root_, fmt::join(bad, ", "));
        }
    }
    dist::fail_together(par_.world(), error);
    chosen = allgather_strings(par_.world(), chosen)[0];
    if (chosen.empty()) return std::nullopt;
    return load(chosen, params, false);  // rank 0 has just checked the hashes
}

ResumePoint Checkpointer::load(const std::string& dir, float* params, bool verify) {
    ResumePoint out;
    std::string error;
    std::unique_ptr<io::ckpt::CheckpointReader> reader;
    const std::vector<StateSpace> spaces = opt_.state_spaces();
    try {
        // rank 0 checks every file's hash; the others only sizes (they read what they need)
        reader = std::make_unique<io::ckpt::CheckpointReader>(dir, verify && par_.rank() == 0);
        const std::string manifest = dir + "/" + io::ckpt::kManifestName;
        out.trainer                = parse_trainer_state(reader->manifest().state, manifest);
        if (out.trainer.steps_skipped > reader->manifest().step) {
            input_error("{}: state.steps_skipped = {} exceeds the {} steps it has done", manifest,
                        out.trainer.steps_skipped, reader->manifest().step);
        }
        // the run that wrote it (every manifest holds its config): the same model, as tensors
        // of equal shapes can still belong to another one (another top_k, gate or head count),
        // and whether it scaled its loss
        const TrainConfig saved =
            config_from_text(reader->manifest().config_toml, manifest + " (config)");
        // but for the two keys that change neither the model nor its training: the rows
        // budget (memory; bitwise the same steps) and the initialisation's scale; and SWIPE's
        // rule where neither run routes with SWIPE. The balancing and router loss settings
        // change the training from here on, not the model (as train.lr does): they may change,
        // the bias's rate and rule where both runs keep the bias (rate > 0: it is in the
        // checkpoint and routes), and each change is said (out.changed).
        std::vector<KeyDifference> diff = differing_keys(cfg_, saved, "model");
        const bool swipe =
            cfg_.model.gate == GateKind::swipe || saved.model.gate == GateKind::swipe;
        const bool bias_both =
            cfg_.model.balance_bias_rate > 0 && saved.model.balance_bias_rate > 0;
        std::erase_if(diff, [&](const KeyDifference& d) {
            return d.key == "model.moe_rows_budget" || d.key == "model.init_std" ||
                   (d.key == "model.swipe_balance" && !swipe);
        });
        std::erase_if(diff, [&](const KeyDifference& d) {
            const bool training =
                d.key == "model.aux_loss_coef" || d.key == "model.router_z_loss_coef" ||
                d.key == "model.balance_loss_scope" || d.key == "model.jitter" ||
                ((d.key == "model.balance_bias_rate" || d.key == "model.balance_bias_update") &&
                 bias_both);
            if (training) out.changed.push_back(d);
            return training;
        });
        if (!diff.empty() && diff[0].key == "model.balance_bias_rate") {
            input_error(
                "{}: model.balance_bias_rate = {} here, {} in the checkpoint: the balancing bias "
                "cannot be turned on or off on resume (its rate may change while it stays on)",
                dir, diff[0].a, diff[0].b);
        }
        if (!diff.empty()) {
            input_error(
                "{}: written by another model: {} = {} here, {} in the checkpoint{} (model.* must "
                "match to resume)",
                dir, diff[0].key, diff[0].a, diff[0].b,
                diff.size() > 1 ? fmt::format(", and {} more key(s)", diff.size() - 1) : "");
        }
        out.loss_scaled = model::PrecisionPolicy::from_config(saved.precision).loss_scaling();
        for (const StateSpace& sp : spaces) {
            for (const ShardPiece& p : sp.map->pieces()) {
                const model::ParamSpec& s = layout_.spec(p.spec);
                for (int k = 0; k < 3; ++k) {
                    const std::string name = tensor_name(kKinds[k], s);
                    if (!reader->has(name)) {
                        input_error("{}: no tensor {} (a checkpoint of another model?)", dir, name);
                    }
                    if (reader->shape(name) != s.shape) {
                        input_error("{}: tensor {} has shape [{}], the model expects [{}]", dir,
                                    name, fmt::join(reader->shape(name), ", "),
                                    fmt::join(s.shape, ", "));
                    }
                    // bf16 moments read as bf16: a float32 moment is rounded to nearest even
                    const PieceData dst = piece_data(sp, p, params, k);
                    const auto b        = static_cast<int64_t>(p.elem_offset);
                    const auto e        = static_cast<int64_t>(p.elem_offset + p.len);
                    if (dst.bf16) {
                        reader->read_bf16(name, b, e, dst.bf16);
                    } else {
                        reader->read(name, b, e, dst.f);
                    }
                }
            }
        }
    } catch (const InputError& e) {
        error = e.what();
    }
    dist::fail_together(par_.world(), error);
    for (const StateSpace& sp : spaces) allgather_space(sp, params);
    opt_.masters_loaded(params);  // "param/" slices are the FP32 masters of half-stored tensors
    out.step  = reader->manifest().step;
    out.state = reader->manifest().state;
    out.dir   = dir;
    return out;
}

size_t Checkpointer::snapshot_bytes() {
    size_t bytes = 0;
    for (const StateSpace& sp : opt_.state_spaces()) {
        for (const ShardPiece& p : sp.map->pieces()) {
            for (int k = 0; k < 3; ++k) bytes += slice_bytes(sp, p, k);
        }
    }
    return bytes;
}

void Checkpointer::save(int64_t step, const nlohmann::json& state, const float* params) {
    const auto t0 = Clock::now();
    if (pending_) finalize();
    const std::vector<StateSpace> spaces = opt_.state_spaces();
    const size_t bytes                   = snapshot_bytes();
    if (snapshot_.size() != bytes) snapshot_ = Buffer<std::byte>(bytes);
    struct Copy {
        const std::byte* src;
        std::byte* dst;
        size_t bytes;
    };
    std::vector<Copy> copies;
    slices_.clear();
    size_t at = 0;
    for (size_t si = 0; si < spaces.size(); ++si) {
        const StateSpace& sp = spaces[si];
        for (const ShardPiece& p : sp.map->pieces()) {
            const model::ParamSpec& s = layout_.spec(p.spec);
            for (int k = 0; k < 3; ++k) {
                // the FP32 master weights where the parameters are stored in half precision;
                // bf16 moments as they are (the file's BF16 tensors)
                const float* master = k == 0 ? opt_.master_of(si, p) : nullptr;
                const PieceData d   = piece_data(sp, p, const_cast<float*>(params), k);
                const auto* src =
                    reinterpret_cast<const std::byte*>(master ? static_cast<const void*>(master)
                                                       : d.f  ? static_cast<const void*>(d.f)
                                                              : static_cast<const void*>(d.bf16));
                const size_t elem       = d.bf16 ? sizeof(uint16_t) : sizeof(float);
                std::byte* dst          = snapshot_.data() + at;
                constexpr size_t kChunk = size_t{1} << 18;  // bytes per copy task
                for (size_t o = 0; o < p.len * elem; o += kChunk) {
                    copies.push_back({src + o, dst + o, std::min(kChunk, p.len * elem - o)});
                }
                slices_.push_back(io::ckpt::Slice{tensor_name(kKinds[k], s), s.shape,
                                                  static_cast<int64_t>(p.elem_offset),
                                                  static_cast<int64_t>(p.elem_offset + p.len), dst,
                                                  d.bf16 ? io::DType::BF16 : io::DType::F32});
                at += slice_bytes(sp, p, k);
            }
        }
    }
    // the copy is the step loop's only pause: spread it over the compute workers
    parallel_for(static_cast<int64_t>(copies.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
    });
    step_    = step;
    state_   = state;
    tmp_dir_ = io::ckpt::step_dir(root_, step) + ".tmp";
    pending_ = true;
    ticket_  = io_.submit(write_job_);
    stall_s_ += seconds_since(t0);
}

double Checkpointer::busy() const { return pending_ && !io_.done(ticket_) ? 1.0 : 0.0; }

void Checkpointer::finalize() {
    if (!pending_) return;
    const auto t0 = Clock::now();
    std::string error;
    try {
        io_.wait(ticket_);  // this rank's file; on rank 0 also the previous checkpoint's commit
    } catch (const std::exception& e) {
        error = fmt::format("checkpoint of step {}: {}", step_, e.what());
    }
    pending_ = false;
    dist::fail_together(par_.world(), error);

    io::ckpt::Manifest mine;
    mine.files = {record_};
    const std::vector<std::string> records =
        allgather_strings(par_.world(), io::ckpt::manifest_to_json(mine).dump());
    if (par_.rank() == 0) {
        io::ckpt::Manifest m;
        m.step            = step_;
        m.config_toml     = to_toml(cfg_);
        m.ranks           = par_.size();
        m.expert_parallel = par_.ep_size();
        m.state           = state_;
        for (size_t r = 0; r < records.size(); ++r) {
            const io::ckpt::Manifest part = io::ckpt::manifest_from_json(
                nlohmann::json::parse(records[r]), fmt::format("rank {}'s record", r));
            m.files.insert(m.files.end(), part.files.begin(), part.files.end());
        }
        // The manifest's fsync, the rename and the pruning run on the I/O helper too.
        commit_job_ = [this, m = std::move(m), tmp = tmp_dir_,
                       final_dir = io::ckpt::step_dir(root_, step_)] {
            try {
                io::ckpt::write_manifest(tmp, m);
                if (fs::exists(final_dir)) {  // an unusable one skipped at resume: keep it aside
                    const std::string aside =
                        final_dir + fmt::format(".replaced-{}", std::time(nullptr));
                    fs::rename(final_dir, aside);
                    log::warn("{}: existed already (skipped at resume); moved to {}", final_dir,
                              aside);
                }
                io::ckpt::commit(tmp, final_dir);
                io::ckpt::prune(root_, static_cast<int>(cfg_.checkpoint.keep));
                last_ = final_dir;
            } catch (const std::exception& e) {
                input_error("checkpoint of step {}: {}", m.step, e.what());
            }
        };
        commit_ticket_ = io_.submit(commit_job_);
    }
    stall_s_ += seconds_since(t0);
}

void Checkpointer::close() {
    const double loop_stall = stall_s_;  // the end-of-run flush is no pause of the step loop
    finalize();
    stall_s_ = loop_stall;
    std::string error;
    if (commit_ticket_ > 0) {
        try {
            io_.wait(commit_ticket_);
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    dist::fail_together(par_.world(), error);
    last_ = allgather_strings(par_.world(), last_)[0];
}

namespace {

// The checkpoint at dir holds tensor `name` with the shape its own config implies for s.
void expect_config_tensor(const io::ckpt::CheckpointReader& reader, const std::string& dir,
                          const std::string& name, const model::ParamSpec& s) {
    if (!reader.has(name))
        input_error("{}: no tensor {} (the manifest's config disagrees with its tensors)", dir,
                    name);
    if (reader.shape(name) != s.shape) {
        input_error("{}: tensor {} has shape [{}], its config says [{}]", dir, name,
                    fmt::join(reader.shape(name), ", "), fmt::join(s.shape, ", "));
    }
}

}  // namespace

std::vector<std::string> unreadable_tensors(const std::string& dir) {
    const io::ckpt::CheckpointReader reader(dir, false);
    const TrainConfig cfg =
        config_from_text(reader.manifest().config_toml, dir + "/manifest.json (config)");
    const model::ParamLayout full = model::make_layout(cfg.model);
    std::vector<std::string> out;
    std::vector<float> buf;
    constexpr int64_t kChunk = int64_t{1} << 22;  // floats read at a time
    for (const model::ParamSpec& s : full.specs()) {
        for (const char* kind : kKinds) {
            const std::string name = tensor_name(kind, s);
            try {
                expect_config_tensor(reader, dir, name, s);
                const int64_t n = static_cast<int64_t>(s.numel);
                buf.resize(static_cast<size_t>(std::min(n, kChunk)));
                for (int64_t lo = 0; lo < n; lo += kChunk)
                    reader.read(name, lo, std::min(n, lo + kChunk), buf.data());
            } catch (const InputError& e) {
                out.push_back(fmt::format("{}: {}", name, e.what()));
            }
        }
    }
    return out;
}

CheckpointModel read_checkpoint_model(const std::string& dir) {
    io::ckpt::CheckpointReader reader(dir, true);
    CheckpointModel out;
    out.cfg  = config_from_text(reader.manifest().config_toml, dir + "/manifest.json (config)");
    out.step = reader.manifest().step;
    const model::ParamLayout full = model::make_layout(out.cfg.model);
    out.params                    = Buffer<float>(full.total_floats());
    for (const model::ParamSpec& s : full.specs()) {
        const std::string name = tensor_name("param", s);
        expect_config_tensor(reader, dir, name, s);
        reader.read(name, 0, static_cast<int64_t>(s.numel), out.params.data() + s.offset);
    }
    out.biases = parse_trainer_state(reader.manifest().state, dir + "/manifest.json").balance_bias;
    const size_t n_moe = out.cfg.model.moe_every > 0
                             ? static_cast<size_t>(out.cfg.model.n_layer / out.cfg.model.moe_every)
                             : 0;
    if (out.cfg.model.balance_bias_rate > 0 &&
        (out.biases.size() != n_moe ||
         std::any_of(out.biases.begin(), out.biases.end(), [&](const std::vector<float>& b) {
             return b.size() != static_cast<size_t>(out.cfg.model.n_experts);
         }))) {
        input_error(
            "{}/manifest.json: state.balance_bias must hold {} arrays of {} values "
            "(model.balance_bias_rate > 0)",
            dir, n_moe, out.cfg.model.n_experts);
    }
    return out;
}

}  // namespace bagualu::train

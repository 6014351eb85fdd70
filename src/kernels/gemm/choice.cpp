// ChoiceTable: a map from GEMM shape to backend, and its JSON form.
#include "kernels/gemm/choice.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm/onednn.h"

namespace bagualu::kernels::gemm {

namespace {

constexpr Path kNamedPaths[] = {Path::ref, Path::generic,  Path::avx2,  Path::avx512,
                                Path::amx, Path::openblas, Path::onednn};

const char* op_name(Trans ta, Trans tb) {
    static const char* names[] = {"NN", "NT", "TN", "TT"};
    return names[(ta == Trans::T ? 2 : 0) + (tb == Trans::T ? 1 : 0)];
}

}  // namespace

std::optional<Path> ChoiceTable::find(const GemmKey& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = choices_.find(key);
    if (it == choices_.end()) return std::nullopt;
    return it->second;
}

void ChoiceTable::set(const GemmKey& key, Path p) {
    std::lock_guard<std::mutex> lock(mutex_);
    choices_[key] = p;
}

size_t ChoiceTable::size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return choices_.size();
}

void ChoiceTable::clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    choices_.clear();
}

nlohmann::json ChoiceTable::to_json() const {
    nlohmann::json j;
    j["cpu_model"]      = cpu_features().model;
    j["onednn_version"] = onednn::version();
    j["threads"]        = compute_pool().size();
    j["choices"]        = nlohmann::json::array();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [k, p] : choices_) {
        j["choices"].push_back({{"dtype", k.bf16 ? "bf16" : "f32"},
                                {"op", op_name(k.ta, k.tb)},
                                {"m", k.m},
                                {"n", k.n},
                                {"k", k.k},
                                {"backend", path_name(p)}});
    }
    return j;
}

bool ChoiceTable::from_json(const nlohmann::json& j) {
    const auto field = [&](const nlohmann::json& o, const char* key, auto kind) {
        using T = decltype(kind);
        if (!o.is_object() || !o.contains(key)) input_error("gemm choices: missing key {}", key);
        try {
            return o.at(key).get<T>();
        } catch (const nlohmann::json::exception&) {
            input_error("gemm choices: {}={}: wrong type", key, o.at(key).dump());
        }
    };
    if (field(j, "cpu_model", std::string{}) != cpu_features().model ||
        field(j, "onednn_version", std::string{}) != onednn::version() ||
        field(j, "threads", int{}) != compute_pool().size()) {
        return false;
    }
    if (!j.contains("choices") || !j.at("choices").is_array()) {
        input_error("gemm choices: choices: expected an array");
    }
    std::map<GemmKey, Path> loaded;
    for (const nlohmann::json& c : j.at("choices")) {
        GemmKey k;
        const std::string dtype = field(c, "dtype", std::string{});
        if (dtype != "f32" && dtype != "bf16") {
            input_error("gemm choices: dtype={}: expected f32 or bf16", dtype);
        }
        k.bf16               = dtype == "bf16";
        const std::string op = field(c, "op", std::string{});
        if (op.size() != 2 || (op[0] != 'N' && op[0] != 'T') || (op[1] != 'N' && op[1] != 'T')) {
            input_error("gemm choices: op={}: expected NN, NT, TN or TT", op);
        }
        k.ta = op[0] == 'T' ? Trans::T : Trans::N;
        k.tb = op[1] == 'T' ? Trans::T : Trans::N;
        k.m  = field(c, "m", int{});
        k.n  = field(c, "n", int{});
        k.k  = field(c, "k", int{});
        if (k.m < 0 || k.n < 0 || k.k < 0) {
            input_error("gemm choices: m={} n={} k={}: expected sizes >= 0", k.m, k.n, k.k);
        }
        const std::string name = field(c, "backend", std::string{});
        bool known             = false;
        for (Path p : kNamedPaths) {
            if (name != path_name(p)) continue;
            if (!path_supported(p)) {
                input_error("gemm choices: backend={}: not supported on this CPU", name);
            }
            loaded[k] = p;
            known     = true;
        }
        if (!known) {
            input_error(
                "gemm choices: backend={}: expected ref, generic, avx2, avx512, openblas "
                "or onednn",
                name);
        }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    choices_ = std::move(loaded);
    return true;
}

ChoiceTable& choice_table() {
    static ChoiceTable t;
    return t;
}

}  // namespace bagualu::kernels::gemm

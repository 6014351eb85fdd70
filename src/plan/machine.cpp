// Machine files: every key is declared once in visit_fields() (as config.cpp does for runs), so
// reading, unknown-key checks and writing cannot disagree.
#include "plan/machine.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "config/toml_file.h"
#include "core/error.h"
#include "core/suggest.h"
#include "kernels/gemm/dispatch.h"

namespace bagualu::plan {
namespace {

template <typename M, typename V>
void visit_fields(M& m, V&& v) {
    v("", "name", m.name);
    v("", "cpu_model", m.cpu_model);
    v("", "notes", m.notes);
    v("node", "peak_fp32_gflops", m.node.peak_fp32_gflops);
    v("node", "peak_half_gflops", m.node.peak_half_gflops);
    v("node", "memory_gib", m.node.memory_gib);
    v("node", "memory_bandwidth_gbs", m.node.memory_bandwidth_gbs);
    v("node", "memory_bandwidth_core_gbs", m.node.memory_bandwidth_core_gbs);
    v("node", "cores", m.node.cores);
    v("node", "gemm_sizes", m.node.gemm_sizes);
    v("node", "gemm_efficiency", m.node.gemm_efficiency);
    v("node", "half_gemm_efficiency", m.node.half_gemm_efficiency);
    v("node", "attention_efficiency", m.node.attention_efficiency);
    v("node", "optimizer_ns_per_float", m.node.optimizer_ns_per_float);
    v("node", "baseline_rss_mib", m.node.baseline_rss_mib);
    v("node", "mpi_rss_mib", m.node.mpi_rss_mib);
    v("node", "l2_kib", m.node.l2_kib);
    v("node", "l3_kib", m.node.l3_kib);
    v("node", "gemm_path", m.node.gemm_path);
    v("node", "half_features", m.node.half_features);
    v("network", "intra_node_bandwidth_gbs", m.network.intra_node_bandwidth_gbs);
    v("network", "intra_node_latency_us", m.network.intra_node_latency_us);
    v("network", "intra_node_reduce_gbs", m.network.intra_node_reduce_gbs);
    v("network", "sync_us", m.network.sync_us);
    v("network", "injection_bandwidth_gbs", m.network.injection_bandwidth_gbs);
    v("network", "latency_us", m.network.latency_us);
    v("network", "nodes_per_supernode", m.network.nodes_per_supernode);
    v("network", "oversubscription", m.network.oversubscription);
    v("network", "supernode_latency_us", m.network.supernode_latency_us);
    v("network", "total_nodes", m.network.total_nodes);
}

const toml::node* find(const toml::table& root, const char* sec, const char* key) {
    if (*sec == 0) return root.get(key);
    const toml::table* t = root[sec].as_table();
    return t ? t->get(key) : nullptr;
}

std::string node_text(const toml::node& n) {
    std::ostringstream s;
    n.visit([&](const auto& x) { s << x; });
    return s.str();
}

template <typename T>
void read(const toml::node& n, T& out, const std::string& where) {
    if constexpr (std::is_same_v<T, std::string>) {
        auto v = n.value_exact<std::string>();
        if (!v) input_error("{}: expected a string, got {}", where, node_text(n));
        out = *v;
    } else if constexpr (std::is_same_v<T, int>) {
        auto v = n.value_exact<int64_t>();
        if (!v || *v < 0 || *v > (int64_t{1} << 30)) {
            input_error("{}: expected a non-negative integer, got {}", where, node_text(n));
        }
        out = static_cast<int>(*v);
    } else if constexpr (std::is_same_v<T, double>) {
        if (n.is_integer())
            out = static_cast<double>(*n.value_exact<int64_t>());
        else if (n.is_floating_point())
            out = *n.value_exact<double>();
        else
            input_error("{}: expected a number, got {}", where, node_text(n));
    } else {
        const toml::array* a = n.as_array();
        if (!a) input_error("{}: expected an array of numbers, got {}", where, node_text(n));
        out.clear();
        for (const toml::node& el : *a) {
            double x = 0;
            read(el, x, where);
            out.push_back(x);
        }
    }
}

}  // namespace

MachineSpec load_machine(const std::string& path) {
    toml::table root = parse_toml_file(path, "machine");
    MachineSpec m;
    std::set<std::string> sections, keys;
    visit_fields(m, [&](const char* sec, const char* key, auto&) {
        if (*sec) sections.insert(sec);
        keys.insert(*sec ? fmt::format("{}.{}", sec, key) : std::string(key));
    });
    for (const auto& [k, n] : root) {
        const std::string name(k.str());
        if (const toml::table* t = n.as_table()) {
            if (!sections.count(name)) {
                input_error("{}: unknown section [{}] (expected node, network)", path, name);
            }
            for (const auto& [k2, n2] : *t) {
                const std::string full = name + "." + std::string(k2.str());
                if (!keys.count(full))
                    input_error("{}: unknown key {}{}", path, full, did_you_mean(full, keys));
            }
        } else if (!keys.count(name)) {
            input_error("{}: unknown key {}{}", path, name, did_you_mean(name, keys));
        }
    }
    visit_fields(m, [&](const char* sec, const char* key, auto& field) {
        if (const toml::node* n = find(root, sec, key)) {
            read(
                *n, field,
                *sec ? fmt::format("{}: {}.{}", path, sec, key) : fmt::format("{}: {}", path, key));
        }
    });
    m.source = path;
    validate(m);
    return m;
}

void validate(const MachineSpec& m) {
    const std::string& src = m.source;
    auto positive          = [&](const char* key, double v) {
        if (!(v > 0)) input_error("{}: {} = {}: must be > 0", src, key, v);
        if (!std::isfinite(v)) input_error("{}: {} = {}: must be finite", src, key, v);
    };
    auto fraction = [&](const char* key, double v) {
        if (!(v > 0 && v <= 1)) input_error("{}: {} = {}: must be in (0, 1]", src, key, v);
    };
    positive("node.peak_fp32_gflops", m.node.peak_fp32_gflops);
    positive("node.memory_gib", m.node.memory_gib);
    positive("node.memory_bandwidth_gbs", m.node.memory_bandwidth_gbs);
    positive("node.cores", m.node.cores);
    if (m.node.peak_half_gflops < 0) {
        input_error("{}: node.peak_half_gflops = {}: must be >= 0 (0 = as fp32)", src,
                    m.node.peak_half_gflops);
    }
    if (m.node.gemm_sizes.empty() || m.node.gemm_sizes.size() != m.node.gemm_efficiency.size()) {
        input_error(
            "{}: node.gemm_sizes and node.gemm_efficiency must be non-empty arrays of the "
            "same length (got {} and {})",
            src, m.node.gemm_sizes.size(), m.node.gemm_efficiency.size());
    }
    for (size_t i = 0; i < m.node.gemm_sizes.size(); ++i) {
        positive("node.gemm_sizes", m.node.gemm_sizes[i]);
        fraction("node.gemm_efficiency", m.node.gemm_efficiency[i]);
        if (i > 0 && !(m.node.gemm_sizes[i] > m.node.gemm_sizes[i - 1])) {
            input_error("{}: node.gemm_sizes must be increasing", src);
        }
    }
    if (!m.node.half_gemm_efficiency.empty()) {
        if (m.node.half_gemm_efficiency.size() != m.node.gemm_sizes.size()) {
            input_error(
                "{}: node.half_gemm_efficiency must be empty (as gemm_efficiency) or as long as "
                "node.gemm_sizes (got {} and {})",
                src, m.node.half_gemm_efficiency.size(), m.node.gemm_sizes.size());
        }
        for (double e : m.node.half_gemm_efficiency) fraction("node.half_gemm_efficiency", e);
    }
    fraction("node.attention_efficiency", m.node.attention_efficiency);
    if (!(m.node.optimizer_ns_per_float >= 0)) {
        input_error("{}: node.optimizer_ns_per_float = {}: must be >= 0", src,
                    m.node.optimizer_ns_per_float);
    }
    if (m.node.baseline_rss_mib < 0 || m.node.mpi_rss_mib < 0) {
        input_error("{}: node.baseline_rss_mib and node.mpi_rss_mib must be >= 0", src);
    }
    if (!m.node.gemm_path.empty()) {
        if (!kernels::gemm::path_of_name(m.node.gemm_path)) {
            input_error(
                "{}: node.gemm_path = \"{}\": expected generic, avx2, avx512, amx, ref, openblas, "
                "onednn, auto or \"\" (packing buffers not counted)",
                src, m.node.gemm_path);
        }
        positive("node.l2_kib (with node.gemm_path)", m.node.l2_kib);
        positive("node.l3_kib (with node.gemm_path)", m.node.l3_kib);
    } else if (m.node.l2_kib < 0 || m.node.l3_kib < 0) {
        input_error("{}: node.l2_kib and node.l3_kib must be >= 0", src);
    }
    positive("network.intra_node_bandwidth_gbs", m.network.intra_node_bandwidth_gbs);
    positive("network.injection_bandwidth_gbs", m.network.injection_bandwidth_gbs);
    positive("network.nodes_per_supernode", m.network.nodes_per_supernode);
    positive("network.total_nodes", m.network.total_nodes);
    if (!(m.network.oversubscription >= 1)) {
        input_error("{}: network.oversubscription = {}: must be >= 1", src,
                    m.network.oversubscription);
    }
    if (m.network.intra_node_reduce_gbs < 0 || m.network.sync_us < 0) {
        input_error("{}: network.intra_node_reduce_gbs and network.sync_us must be >= 0", src);
    }
    if (m.network.intra_node_latency_us < 0 || m.network.latency_us < 0 ||
        m.network.supernode_latency_us < 0) {
        input_error("{}: network latencies must be >= 0", src);
    }
}

std::string to_toml(const MachineSpec& m, const std::string& comments) {
    toml::table root;
    visit_fields(m, [&](const char* sec, const char* key, const auto& field) {
        if (*sec && !root.contains(sec)) root.insert(sec, toml::table{});
        toml::table& t = *sec ? *root[sec].as_table() : root;
        using T        = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::vector<double>>) {
            toml::array a;
            for (double x : field) a.push_back(x);
            t.insert(key, std::move(a));
        } else if constexpr (std::is_same_v<T, int>) {
            t.insert(key, static_cast<int64_t>(field));
        } else {
            t.insert(key, field);
        }
    });
    std::ostringstream out;
    out << comments << root << "\n";
    return out.str();
}

}  // namespace bagualu::plan

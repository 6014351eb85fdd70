// The kernel tables of kernels/dispatch.h and the choice of the active one. Each ISA's table
// names, per family, the widest implementation it has at or below that ISA: generic (ops.cpp),
// avx2 and avx512 (the drivers of ops_avx2.cpp / ops_avx512.cpp over the items in kernels/avx2/
// and kernels/avx512/). Adding a version is a line in the table of its ISA and those above it.
#include "kernels/dispatch.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/ops_avx2.h"
#include "kernels/ops_avx512.h"
#include "kernels/ops_generic.h"

namespace bagualu::kernels {

namespace {

constexpr Isa kAllIsas[] = {Isa::generic, Isa::avx2, Isa::avx512};

constexpr KernelTable kGeneric = {
    .isa                       = Isa::generic,
    .layernorm_isa             = Isa::generic,
    .gelu_isa                  = Isa::generic,
    .attention_isa             = Isa::generic,
    .crossentropy_isa          = Isa::generic,
    .adamw_isa                 = Isa::generic,
    .convert_isa               = Isa::generic,
    .rows_isa                  = Isa::generic,
    .exp_isa                   = Isa::generic,
    .layernorm_forward_rows    = generic::layernorm_forward_rows,
    .layernorm_backward        = generic::layernorm_backward,
    .gelu_forward              = generic::gelu_forward_range,
    .gelu_backward             = generic::gelu_backward_range,
    .attention_forward         = generic::attention_forward,
    .attention_backward        = generic::attention_backward,
    .crossentropy_forward      = generic::crossentropy_forward_rows,
    .crossentropy_backward     = generic::crossentropy_backward_rows,
    .adamw_range               = generic::adamw_update_range,
    .adamw_range_bf16m         = nullptr,
    .bf16_narrow               = generic::bf16_narrow_range,
    .bf16_narrow_scaled        = generic::bf16_narrow_scaled,
    .bf16_round                = generic::bf16_round_range,
    .bf16_round_stream         = generic::bf16_round_range,
    .zero_stream               = generic::zero_range,
    .bf16_widen                = generic::bf16_widen_range,
    .bf16_bias_round           = generic::bf16_bias_round,
    .col_sums_f64              = generic::col_sums_f64,
    .col_sums_f64_bf16         = generic::col_sums_f64_bf16,
    .scaled_rows_and_dots      = generic::scaled_rows_and_dots,
    .scaled_rows_and_dots_bf16 = generic::scaled_rows_and_dots_bf16,
    .rank_rows                 = generic::rank_rows,
    .weighted_row_sum          = generic::weighted_row_sum,
    .add_row_sum               = generic::add_row_sum,
    .bias_add                  = generic::bias_add,
    .exp_f64                   = generic::exp_f64,
};

constexpr KernelTable kAvx2 = {
    .isa                       = Isa::avx2,
    .layernorm_isa             = Isa::avx2,
    .gelu_isa                  = Isa::avx2,
    .attention_isa             = Isa::avx2,
    .crossentropy_isa          = Isa::avx2,
    .adamw_isa                 = Isa::avx2,
    .convert_isa               = Isa::avx2,
    .rows_isa                  = Isa::avx2,
    .exp_isa                   = Isa::avx2,
    .layernorm_forward_rows    = avx2::layernorm_forward_rows,
    .layernorm_backward        = avx2::layernorm_backward,
    .gelu_forward              = avx2::gelu_forward_range,
    .gelu_backward             = avx2::gelu_backward_range,
    .attention_forward         = avx2::attention_forward,
    .attention_backward        = avx2::attention_backward,
    .crossentropy_forward      = avx2::crossentropy_forward_rows,
    .crossentropy_backward     = avx2::crossentropy_backward_rows,
    .adamw_range               = avx2::adamw_update_range,
    .adamw_range_bf16m         = avx2::adamw_update_range_bf16m,
    .bf16_narrow               = avx2::bf16_narrow_range,
    .bf16_narrow_scaled        = avx2::bf16_narrow_scaled,
    .bf16_round                = avx2::bf16_round_range,
    .bf16_round_stream         = avx2::bf16_round_stream,
    .zero_stream               = avx2::zero_stream,
    .bf16_widen                = avx2::bf16_widen_range,
    .bf16_bias_round           = avx2::bf16_bias_round,
    .col_sums_f64              = avx2::col_sums_f64,
    .col_sums_f64_bf16         = avx2::col_sums_f64_bf16,
    .scaled_rows_and_dots      = avx2::scaled_rows_and_dots,
    .scaled_rows_and_dots_bf16 = avx2::scaled_rows_and_dots_bf16,
    .rank_rows                 = avx2::rank_rows,
    .weighted_row_sum          = avx2::weighted_row_sum,
    .add_row_sum               = avx2::add_row_sum,
    .bias_add                  = avx2::bias_add,
    .exp_f64                   = avx2::exp_f64,
};

// AVX-512 attention, GELU, cross-entropy, AdamW and the bf16 conversions; layernorm, the row
// kernels and the double exp are the AVX2 ones (libmvec's 8-wide exp gives the 4-wide one's
// bits and was not clearly faster on an AMD Zen 5: kernels/avx2/exp64.cpp).
constexpr KernelTable kAvx512 = [] {
    KernelTable t           = kAvx2;
    t.isa                   = Isa::avx512;
    t.attention_isa         = Isa::avx512;
    t.attention_forward     = avx512::attention_forward;
    t.attention_backward    = avx512::attention_backward;
    t.gelu_isa              = Isa::avx512;
    t.gelu_forward          = avx512::gelu_forward_range;
    t.gelu_backward         = avx512::gelu_backward_range;
    t.crossentropy_isa      = Isa::avx512;
    t.crossentropy_forward  = avx512::crossentropy_forward_rows;
    t.crossentropy_backward = avx512::crossentropy_backward_rows;
    t.adamw_isa             = Isa::avx512;
    t.adamw_range           = avx512::adamw_update_range;
    t.adamw_range_bf16m     = avx512::adamw_update_range_bf16m;
    t.convert_isa           = Isa::avx512;
    t.bf16_narrow           = avx512::bf16_narrow_range;   // AVX2's without AVX512_BF16
    t.bf16_narrow_scaled    = avx512::bf16_narrow_scaled;  // the same
    t.bf16_round            = avx512::bf16_round_range;
    t.bf16_round_stream     = avx512::bf16_round_stream;
    t.bf16_widen            = avx512::bf16_widen_range;
    t.bf16_bias_round       = avx512::bf16_bias_round;
    return t;
}();

std::atomic<const KernelTable*>& active_slot() {
    static std::atomic<const KernelTable*> slot{
        &kernel_table(isa_from_env(std::getenv("BGL_ISA"), cpu_features()))};
    return slot;
}

}  // namespace

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::generic:
            return "generic";
        case Isa::avx2:
            return "avx2";
        case Isa::avx512:
            return "avx512";
    }
    return "?";
}

bool isa_supported(Isa isa, const CpuFeatures& cpu) {
    switch (isa) {
        case Isa::generic:
            return true;
        case Isa::avx2:
            return cpu.avx2_fma;
        case Isa::avx512:
            return cpu.avx512;
    }
    return false;
}

bool isa_supported(Isa isa) { return isa_supported(isa, cpu_features()); }

const char* isa_requirement(Isa isa) {
    switch (isa) {
        case Isa::generic:
            return "x86-64";
        case Isa::avx2:
            return "AVX2+FMA";
        case Isa::avx512:
            return "AVX-512F/BW/VL/DQ";
    }
    return "?";
}

Isa best_isa(const CpuFeatures& cpu) {
    if (isa_supported(Isa::avx512, cpu)) return Isa::avx512;
    if (isa_supported(Isa::avx2, cpu)) return Isa::avx2;
    return Isa::generic;
}

Isa best_isa() { return best_isa(cpu_features()); }

std::string KernelTable::describe() const {
    return fmt::format(
        "isa {}: gemm {}, layernorm {}, gelu {}, attention {}{}, crossentropy {}, adamw {}, "
        "convert {}, rows {}, exp64 {}",
        isa_name(isa), gemm_backend_name(), isa_name(layernorm_isa), isa_name(gelu_isa),
        isa_name(attention_isa),
        attention_isa == Isa::generic ? ""
        : attention_isa == Isa::avx2  ? " (head size a multiple of 8, else generic)"
                                      : " (head size a multiple of 16, else avx2 or generic)",
        isa_name(crossentropy_isa), isa_name(adamw_isa), isa_name(convert_isa), isa_name(rows_isa),
        isa_name(exp_isa));
}

const KernelTable& kernel_table(Isa isa) {
    switch (isa) {
        case Isa::avx2:
            return kAvx2;
        case Isa::avx512:
            return kAvx512;
        default:
            return kGeneric;
    }
}

const KernelTable& dispatch() { return *active_slot().load(std::memory_order_relaxed); }

void set_active_isa(Isa isa) {
    BGL_CHECK(isa_supported(isa), "isa {} is not supported on this CPU", isa_name(isa));
    active_slot().store(&kernel_table(isa), std::memory_order_relaxed);
}

Isa isa_from_env(const char* value, const CpuFeatures& cpu) {
    if (value == nullptr || *value == '\0') return best_isa(cpu);
    for (Isa isa : kAllIsas) {
        if (std::string_view(value) != isa_name(isa)) continue;
        if (isa_supported(isa, cpu)) return isa;
        std::string here;
        for (Isa s : kAllIsas) {
            if (isa_supported(s, cpu))
                here += fmt::format("{}{}", here.empty() ? "" : ", ", isa_name(s));
        }
        input_error("BGL_ISA={}: this CPU lacks {} (it runs {})", value, isa_requirement(isa),
                    here);
    }
    input_error("BGL_ISA={}: expected generic, avx2 or avx512", value);
}

}  // namespace bagualu::kernels

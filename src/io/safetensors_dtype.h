// Element types a safetensors file can hold in this codebase: sizes and the spec's names
// ("F32", "BF16", ...). Only the dtypes listed here are read or written; any other name in a
// file header is rejected by the reader. No conversions live here (see safetensors.cpp).
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace bagualu::io {

enum class DType { F32, BF16, F16, F64, I32, I64, U8 };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64,
                                       DType::I32, DType::I64,  DType::U8};

constexpr std::size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32:
            return 4;
        case DType::BF16:
            return 2;
        case DType::F16:
            return 2;
        case DType::F64:
            return 8;
        case DType::I32:
            return 4;
        case DType::I64:
            return 8;
        case DType::U8:
            return 1;
    }
    return 0;
}

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F32:
            return "F32";
        case DType::BF16:
            return "BF16";
        case DType::F16:
            return "F16";
        case DType::F64:
            return "F64";
        case DType::I32:
            return "I32";
        case DType::I64:
            return "I64";
        case DType::U8:
            return "U8";
    }
    return "?";
}

// The dtype spelled `name` in a safetensors header, or nullopt if it is not one of ours.
constexpr std::optional<DType> parse_dtype(std::string_view name) {
    for (DType t : kAllDTypes) {
        if (dtype_name(t) == name) return t;
    }
    return std::nullopt;
}

}  // namespace bagualu::io

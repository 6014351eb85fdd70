// Which GEMM implementation gemm_f32/gemm_bf16 use. Chosen once at first use: BGL_GEMM=
// ref|generic|avx2|avx512|amx|openblas|onednn|auto if set (an unknown or unsupported name is an
// error), otherwise the best of ours this CPU supports. "auto" picks per shape between the best
// of ours and oneDNN (gemm/choice.h); it runs anywhere, on ours alone where oneDNN has no native
// matmul. Tests and benchmarks may switch it.
#pragma once
#include <optional>
#include <string_view>

namespace bagualu::kernels::gemm {

// amx: the avx512 kernels, with AMX-BF16 tiles for the bf16 products.
enum class Path { ref, generic, avx2, avx512, amx, openblas, onednn, automatic };

struct KernelSpec;

// "ref", ..., "onednn", "auto".
const char* path_name(Path p);
// The path of that name (as path_name writes it), if any.
std::optional<Path> path_of_name(std::string_view name);
bool path_supported(Path p);
// The fastest of ours (never openblas, onednn or ref) the CPU supports.
Path best_path();
Path active_path();
// Throws InternalError when p is not supported on this CPU.
void set_active_path(Path p);
// The packed float kernel of a packed path (generic, avx2, avx512, amx (avx512's); generic for
// any other).
const KernelSpec& f32_spec(Path p);
// Its bf16 kernel: AMX tiles on amx; AVX512_BF16 dot products on avx512 where the CPU has them,
// else the float kernel on operands widened while packing.
const KernelSpec& bf16_spec(Path p);

}  // namespace bagualu::kernels::gemm

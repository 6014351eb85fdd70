// The packed GEMM implementations, one namespace per ISA folder. Each returns KernelSpecs whose
// functions may only be called on a CPU with that ISA (see kernels/cpu_features.h).
//   f32_kernel   float A and B.
//   bf16_kernel  bf16 A and B; avx512 has two: bf16_dot_kernel (AVX512_BF16 vdpbf16ps on packed
//                k pairs) and bf16_kernel (bf16 widened to float while packing, float kernel);
//                bf16_amx_kernel is AMX-BF16 tiles (the amx path of gemm/dispatch.h).
#pragma once
#include "kernels/gemm/driver.h"

namespace bagualu::kernels::gemm {

namespace generic {
const KernelSpec& f32_kernel();
const KernelSpec& bf16_kernel();
}  // namespace generic

namespace avx2 {
const KernelSpec& f32_kernel();
const KernelSpec& bf16_kernel();
}  // namespace avx2

namespace avx512 {
const KernelSpec& f32_kernel();
const KernelSpec& bf16_kernel();
const KernelSpec& bf16_dot_kernel();
// AMX-BF16 tiles (needs request_amx() to have succeeded).
const KernelSpec& bf16_amx_kernel();
}  // namespace avx512

}  // namespace bagualu::kernels::gemm

// Per-ISA causal attention kernels behind attention_forward / attention_backward in
// kernels/ops.h: same arguments, shapes and =/+= conventions. ops.cpp calls them when the CPU
// has the ISA and avx2::attention_shape_supported() accepts the shape, else runs its portable
// loops.
#pragma once

namespace bagualu::kernels {

namespace avx2 {
// The head size must be a multiple of 8 (one ymm register of floats).
inline bool attention_shape_supported(int hs) { return hs > 0 && hs % 8 == 0; }
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);
}  // namespace avx2

}  // namespace bagualu::kernels

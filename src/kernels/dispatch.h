// One place that decides which implementation of each kernel family runs: a table of function
// pointers per ISA (generic x86-64, AVX2+FMA, AVX-512), one of them active. The active table is
// chosen once, at first use: BGL_ISA=generic|avx2|avx512 if set (an unknown name, or an ISA this
// CPU lacks, is an InputError), otherwise the best ISA the CPU supports. A family without its
// own version for an ISA runs the next lower one (AVX-512 attention is the AVX2 kernel);
// describe() says which. The SIMD layernorm, GELU and AdamW give the generic kernels' results
// bit for bit, so on those the choice changes only the speed. GEMM keeps its own override,
// BGL_GEMM (kernels/gemm/dispatch.h); describe() reports its choice next to the rest.
// Dimension letters and =/+= conventions as in kernels/ops.h, whose entry points call the active
// table. Tests and benchmarks may call one ISA's table directly or switch the active one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace bagualu::kernels {

struct CpuFeatures;

enum class Isa { generic, avx2, avx512 };

// "generic", "avx2", "avx512": the names BGL_ISA takes (and BGL_GEMM's names for the same ISAs).
const char* isa_name(Isa isa);
bool isa_supported(Isa isa, const CpuFeatures& cpu);
bool isa_supported(Isa isa);
// What the CPU must have for isa, as a message says it ("AVX2+FMA", "AVX-512F/BW/VL/DQ").
const char* isa_requirement(Isa isa);
// The widest ISA cpu (by default this CPU) supports.
Isa best_isa(const CpuFeatures& cpu);
Isa best_isa();

// Signatures of ops.h.
struct KernelTable {
    Isa isa;  // the ISA this table was built for
    // The ISA of the implementation each family runs (at most isa).
    Isa layernorm_isa, gelu_isa, attention_isa, crossentropy_isa, adamw_isa, convert_isa, rows_isa,
        exp_isa;

    // layernorm_forward of rows [begin, end) on the calling thread (ops.h threads them;
    // kernels/mixed.h narrows them a block at a time).
    void (*layernorm_forward_rows)(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t begin,
                                   int64_t end, int C);
    void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C);
    // GELU of elements [begin, end) on the calling thread (ops.h threads them; kernels/mixed.h
    // runs them a block at a time beside the 16-bit conversions).
    void (*gelu_forward)(float* out, const float* inp, int64_t begin, int64_t end);
    void (*gelu_backward)(float* dinp, const float* inp, const float* dout, int64_t begin,
                          int64_t end);
    void (*attention_forward)(float* out, float* lse, const float* qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int B, int T, int C, int NH);
    // The cross-entropy's losses (and logsumexps) of rows [begin, end) on the calling thread, and
    // its gradient's (ops.h threads both; kernels/mixed.h narrows or rounds each gradient row
    // while it is in cache).
    void (*crossentropy_forward)(float* losses, const float* logits, const int32_t* targets,
                                 int64_t begin, int64_t end, int V, float* lse);
    void (*crossentropy_backward)(float* dlogits, const float* logits, const int32_t* targets,
                                  const float* dlosses, int64_t begin, int64_t end, int V,
                                  const float* lse);
    // AdamW on elements [begin, end) on the calling thread (ops.h adamw_update_range).
    void (*adamw_range)(float* param, const float* grad, float* m, float* v, int64_t begin,
                        int64_t end, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float c1, float c2, float grad_scale);
    // The same with m and v as bf16 bits, converted in registers (bitwise adamw_range on the
    // widened moments, m and v then rounded); null where the ISA has none (the generic table:
    // kernels/mixed.h widens and narrows a slice at a time around adamw_range).
    void (*adamw_range_bf16m)(float* param, const float* grad, uint16_t* m, uint16_t* v,
                              int64_t begin, int64_t end, float lr, float beta1, float beta2,
                              float eps, float weight_decay, float c1, float c2, float grad_scale);
    // bfloat16 conversions of n elements on the calling thread, bitwise core/dtype.h's
    // bf16_from_float / bf16_to_float (kernels/mixed.h threads them).
    void (*bf16_narrow)(uint16_t* dst, const float* x, size_t n);
    // dst[i] = bf16_from_float(w * x[i]), the product rounded to float first: bf16_narrow of a
    // scaled copy, without the copy (the experts' output gradient rows, kernels/mixed.h
    // narrow_dout_rows).
    void (*bf16_narrow_scaled)(uint16_t* dst, const float* x, float w, size_t n);
    void (*bf16_round)(float* out, const float* in, size_t n);
    // bf16_round into an out that is not in, with non-temporal stores where the ISA has them, for
    // values not read again soon (the optimizer's rounded parameters, read by the next forward
    // after the whole optimizer pass): the stores do not read the old lines first. Fenced before
    // it returns, so the values are visible to whoever the caller's thread signals next.
    void (*bf16_round_stream)(float* out, const float* in, size_t n);
    // x[i] = 0 with non-temporal stores where the ISA has them (the gradients at a step's start,
    // not read before the backward's last layers): the stores do not read the old lines first.
    // Fenced before it returns, as bf16_round_stream.
    void (*zero_stream)(float* x, size_t n);
    void (*bf16_widen)(float* out, const uint16_t* in, size_t n);
    // o[i] = bf16_to_float(bf16_from_float(o[i] + bias[i])), and with half, half[i] its 16 bits;
    // bias may be null (rounding only). One pass over a row of a product's output in cache: its
    // bias, its rounding to the activation dtype and its kept 16 bits (kernels/mixed.h).
    void (*bf16_bias_round)(float* o, const float* bias, uint16_t* half, size_t n);
    // Row sums in double and the combine's gradient rows, on the calling thread.
    void (*col_sums_f64)(double* s, const float* x, int64_t n, int64_t ld, int w);
    // The same over bf16 values, x their bits (a 16-bit operand's rows: the bias gradients).
    void (*col_sums_f64_bf16)(double* s, const uint16_t* x, int64_t n, int64_t ld, int w);
    void (*scaled_rows_and_dots)(float* const* dy, float* dots, const float* w, const float* d,
                                 const float* const* y, int n, int C);
    void (*scaled_rows_and_dots_bf16)(float* const* dy, float* dots, const float* w, const float* d,
                                      const uint16_t* const* y, int n, int C);
    void (*rank_rows)(int32_t* top, const float* x, int64_t n, int E, int R);
    void (*weighted_row_sum)(float* o, const float* w, const float* const* y, int n, int C);
    void (*add_row_sum)(float* o, const float* const* y, int n, int C);
    // o[i] += bias[i]: the bias of a product's float output, a row at a time in cache.
    void (*bias_add)(float* o, const float* bias, size_t n);
    // exp of n doubles on the calling thread (ops.h exp_f64).
    void (*exp_f64)(double* y, const double* x, int64_t n);

    // "isa avx512: gemm avx512, layernorm avx2, gelu avx512, attention avx512 (head size a
    // multiple of 16, else avx2 or generic), crossentropy avx2, adamw avx512, convert avx512, rows
    // avx2, exp64 avx2".
    std::string describe() const;
};

// The table of one ISA, whether or not this CPU supports it (calling an entry the CPU lacks
// the instructions for is undefined behaviour: check isa_supported first).
const KernelTable& kernel_table(Isa isa);

// The active table: chosen at first use from BGL_ISA (see isa_from_env) or best_isa().
const KernelTable& dispatch();
// Throws InternalError when the CPU does not support isa.
void set_active_isa(Isa isa);

// The ISA BGL_ISA names: value nullptr or empty gives best_isa() of cpu; a name that is not an
// ISA, or one cpu lacks, is an InputError naming BGL_ISA, the value and the accepted names or
// the missing feature.
Isa isa_from_env(const char* value, const CpuFeatures& cpu);

}  // namespace bagualu::kernels

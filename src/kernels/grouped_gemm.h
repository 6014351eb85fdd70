// Grouped GEMM, row-major: G independent products in one call, for the local experts of an MoE
// layer, whose rows lie one group after another in a shared buffer (no padding to a capacity).
// Both forms run on the compute pool as (group, rows, columns) rectangles that the threads take
// as they come free: a group with many rows is split, an empty group costs nothing. Never split
// over the reduction dimension, so results do not depend on the thread count, and each group's
// result is bitwise what gemm_f32 gives for it alone. Under BGL_GEMM=onednn or auto it runs the
// best of our kernels (gemm::best_path()), so bitwise what gemm_f32 gives on that path: expert
// row counts change every step, and neither a primitive nor a timing per count would pay.
// Call from outside pool jobs, as gemm_f32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/function_ref.h"
#include "kernels/gemm.h"

namespace bagualu::kernels {

// Called by the forward form on each finished rectangle of C: rows [i0, i1) of group g (counted
// from the group's first row, C_g's row i0 on) by columns [j0, j1), once every element of it holds
// its final value, on the thread that computed it, while the rectangle is in that thread's cache.
// Each element of C lies in exactly one call; calls of one product may run at the same time (on
// disjoint rectangles). For a pass over the result that would otherwise read C again from
// memory: the experts' bias add (moe/experts.cpp).
using GroupEpilogue = FunctionRef<void(int g, int i0, int i1, int j0, int j1)>;

// For g in [0, G), with M_g = offsets[g+1] - offsets[g] >= 0 rows:
//   C_g (M_g, N) = alpha * op(A_g) (M_g, K) @ op(B_g) (K, N) + beta * C_g      (= when beta == 0)
// offsets: (G+1), nondecreasing. A_g is op(A)'s rows offsets[g].. (ta == N: A + offsets[g] * lda,
// ta == T: A + offsets[g]). B_g = B + g * stride_b (stride in floats). C_g = C + offsets[g] * ldc.
// When beta == 0, C is not read.
// With a_rows (ta == N only), A is gathered: row i of the stacked A_g is A's row a_rows[i]
// (A + a_rows[i] * lda), read in place when the rows are packed, so a product over permuted
// rows needs no permuted copy; the results are bitwise those on the copy.
// With epilogue, it runs on every finished rectangle of C (GroupEpilogue above).
void grouped_gemm_f32(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                      const float* A, int lda, const float* B, int ldb, size_t stride_b, float beta,
                      float* C, int ldc, const int32_t* a_rows = nullptr,
                      GroupEpilogue epilogue = {});

// The same with A and B in bf16 (products accumulated in float32), on the active path's bf16
// kernel (the best of ours under onednn and auto): each group's result is bitwise what gemm_bf16
// gives for it alone on our kernels of that path. The experts' products whose operands hold
// half values (kernels/mixed.h grouped_gemm_half).
void grouped_gemm_bf16(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                       const bf16* A, int lda, const bf16* B, int ldb, size_t stride_b, float beta,
                       float* C, int ldc, const int32_t* a_rows = nullptr,
                       GroupEpilogue epilogue = {});

// Whether the active path's bf16 kernel packs a float B itself (rounding it to bf16 as it
// packs; ours but the generic one), so that the overload below can run.
bool grouped_gemm_bf16_float_b();
// Whether a float B stored by row (tb = N) is best packed from its floats as well, rather than
// narrowed first: where the bf16 kernel says so (gemm_bf16_float_b_rows, kernels/gemm.h).
bool grouped_gemm_bf16_float_b_rows();
// grouped_gemm_bf16 with B in float32, each value rounded to bf16 (bf16_from_float) as the
// kernel packs it: bitwise grouped_gemm_bf16 on B's narrowed copy, without the copy. B is
// packed about once per product, so this saves writing and reading a 16-bit copy of it (the
// experts' weights). Only where grouped_gemm_bf16_float_b().
void grouped_gemm_bf16(Trans ta, Trans tb, int G, const int32_t* offsets, int N, int K, float alpha,
                       const bf16* A, int lda, const float* B, int ldb, size_t stride_b, float beta,
                       float* C, int ldc, const int32_t* a_rows = nullptr,
                       GroupEpilogue epilogue = {});

// The weight-gradient form, summing over each group's rows: for g in [0, G), K_g = offsets[g+1]
// - offsets[g] >= 0,
//   C_g (M, N) = alpha * A_g^T (M, K_g) @ B_g (K_g, N) + beta * C_g     (+= when beta == 1)
// A_g = A + offsets[g] * lda, (K_g, M). B_g = B + offsets[g] * ldb, (K_g, N).
// C_g = C + g * stride_c (stride in floats). A group with K_g == 0 gets C_g = beta * C_g.
// With b_rows, B is gathered as A is above: row i of the stacked B_g is B's row b_rows[i].
// With epilogue, it runs on every finished rectangle of a C_g as the forward form's does (rows
// i of C_g, i in [0, M)); a group with K_g == 0 has none.
void grouped_gemm_tn_f32(int G, const int32_t* offsets, int M, int N, float alpha, const float* A,
                         int lda, const float* B, int ldb, float beta, float* C, int ldc,
                         size_t stride_c, const int32_t* b_rows = nullptr,
                         GroupEpilogue epilogue = {});

// The same with A and B in bf16 (products accumulated in float32), on the active path's bf16
// kernel with grouped_gemm_tn_f32's depth block, so that the depth splits at
// grouped_gemm_tn_depth_block() are exact for both (the ref and openblas paths loop over
// gemm_bf16). The experts' weight gradients on 16-bit operands (kernels/mixed.h).
void grouped_gemm_tn_bf16(int G, const int32_t* offsets, int M, int N, float alpha, const bf16* A,
                          int lda, const bf16* B, int ldb, float beta, float* C, int ldc,
                          size_t stride_c, const int32_t* b_rows = nullptr,
                          GroupEpilogue epilogue = {});

// ---- whole groups, one thread each ----
// The forms above cut every product into rectangles over all groups, so a chain of products
// and elementwise passes over the groups' rows (an expert's MLP) reads each intermediate array
// back from memory between two calls. Where the groups are many and none is large, a thread can
// instead run a whole group's chain on its own, so that its intermediates stay in its cache:
// for_each_group runs job(g) for every group with rows, whole groups handed out to the compute
// pool's threads as they come free (largest first), and inside it group_gemm_f32 and
// group_gemm_tn_f32 compute one product of that group on the calling thread, bitwise what
// grouped_gemm_f32 and grouped_gemm_tn_f32 give that group (the same packed kernel, blocks and
// strips; rectangles never change a sum).

// Whether whole groups suit these G groups (offsets as above) on the active path: a packed path
// (the ref and openblas paths have no per-thread product), at least two groups with rows, and
// none holding more than half a thread's share of all rows (a larger group would keep one
// thread busy while the others idle; the forms above split it over the threads instead).
bool whole_groups_suit(int G, const int32_t* offsets);
// Runs job(g, thread) for every g in [0, G), each on one thread of the compute pool (thread:
// its index in [0, pool size), for scratch of its own; on the calling thread alone, thread 0,
// below about 2^18 multiply-adds in all, counting madds_per_row for each row), the groups with
// the most rows first (so a group without rows, whose products only scale C by beta, comes
// last). On a packed path (whole_groups_suit). Call from outside pool jobs; job must not start
// pool work itself.
void for_each_group(int G, const int32_t* offsets, double madds_per_row,
                    FunctionRef<void(int g, int thread)> job);
// Inside a for_each_group job: one group's product on the calling thread, with M rows and
// A, a_rows, C already at the group's first row (B at its own matrix), as grouped_gemm_f32 then
// computes that group (its epilogue is the caller's, once for the whole group: rows [0, M),
// columns [0, N)).
void group_gemm_f32(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                    const int32_t* a_rows, const float* B, int ldb, float beta, float* C, int ldc);
// The same with A in bf16 and B in bf16, or in float rounded to bf16 as it is packed (where
// grouped_gemm_bf16_float_b(), for either op(B)): grouped_gemm_bf16's kernel and panels, so
// bitwise what grouped_gemm_bf16 gives that group (on B or on its narrowed copy).
void group_gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                     const int32_t* a_rows, const bf16* B, int ldb, float beta, float* C, int ldc);
void group_gemm_bf16(Trans ta, Trans tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                     const int32_t* a_rows, const float* B, int ldb, float beta, float* C, int ldc);
// Inside a for_each_group job: one group's weight-gradient product on the calling thread,
// C (M, N) = alpha * A^T (M, K) @ B (K, N) + beta * C over its K rows, A and B (or b_rows) at the
// group's first row, as grouped_gemm_tn_f32 then computes that group.
void group_gemm_tn_f32(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                       int ldb, const int32_t* b_rows, float beta, float* C, int ldc);
// The same in bf16, as grouped_gemm_tn_bf16 computes that group.
void group_gemm_tn_bf16(int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
                        int ldb, const int32_t* b_rows, float beta, float* C, int ldc);

// Rows of depth grouped_gemm_tn_f32 (and _bf16) sums as one block on the active GEMM path: a
// group's rows split at multiples of it over several calls with beta = 1 give bitwise the result of
// one call (each block is summed from zero and then added to C). 0 when the path sums the whole
// depth at once (ref, openblas), so that no split is exact. At most kMaxTnDepthBlock.
int grouped_gemm_tn_depth_block();
inline constexpr int kMaxTnDepthBlock = 256;

}  // namespace bagualu::kernels

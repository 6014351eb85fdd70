// AMX-BF16 GEMM kernel for gemm_bf16: a 32 x 32 tile of C in four 16 x 16 float tile registers,
// multiplied by tdpbf16ps 32 k values at a time from two A tiles and two B tiles.
//   A panels: (kcp / 32, 32 rows, 32 k), each row's 32 k values one 64-byte tile row, so a k
//     block of a panel is two A tiles (rows 0-15, 16-31) at a 64-byte stride;
//   B panels: the (k, k + 1) pair panels of the AVX512_BF16 kernel (pack_pairs.h), (kcp / 2,
//     32 columns, 2), which are AMX's B layout as they are: 16 pairs x 16 columns of a k block
//     are one B tile at a 128-byte stride, the next 16 columns the next tile 64 bytes on.
// kcp is the depth rounded up to 32 and zero-padded. The tile configuration is loaded when a
// thread enters a product (KernelSpec::enter) and released when it leaves, so that nothing else
// on the thread (oneDNN, the peak loop) finds or leaves a configuration it does not expect.
// Every element of C is the sum of the same tdpbf16ps steps in increasing k whatever the thread
// or thread count: bitwise the same for a fixed kc, like the other kernels.
// Compiled with the AVX-512 flags of this folder; the tile instructions by function attribute.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/avx512/tile_config.h"
#include "kernels/avx512/transpose.h"
#include "kernels/gemm/avx512/pack_pairs.h"
#include "kernels/gemm/kernels.h"

namespace bagualu::kernels::gemm::avx512 {

namespace {

constexpr int kTileMR = 32;  // two A tiles of 16 rows
constexpr int kTileNR = 32;  // two B tiles of 16 columns
constexpr int kTileK  = 32;  // bf16 values of k per tile step (16 pairs)

// Tiles 0-3 hold C (16 rows of 16 floats), 4-5 A (16 rows of 32 bf16), 6-7 B (16 pairs of 16
// columns): every tile 16 rows of 64 bytes.
__attribute__((target("amx-tile"))) void enter_tiles() {
    static const kernels::avx512::TileConfig cfg = kernels::avx512::tiles_16x64();
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void leave_tiles() { _tile_release(); }

// op(A) rows [r0, r0 + rn) x k [p0, p0 + kc) -> panels (kcp / 32, 32, 32), zero-padded.
void pack_a_amx(PackSrc src, int r0, int rn, int p0, int kc, void* dst_v) {
    auto* dst        = static_cast<bf16*>(dst_v);
    const int kblk   = (kc + kTileK - 1) / kTileK;
    const size_t kcp = size_t(kblk) * kTileK;
    if (!src.k_contiguous) {
        // Element (r, k) at row k of the source: 32 k rows of 32 values become (k, k + 1)
        // words per row (vpermt2w), then two 16 x 16 word transposes give the rows of k. A k
        // block's rows are read for every panel before the next block's.
        const __m512i lo_idx = _mm512_load_si512(kernels::avx512::kInterleave.idx[0]);
        const __m512i hi_idx = _mm512_load_si512(kernels::avx512::kInterleave.idx[1]);
        for (int b = 0; b < kblk; ++b) {
            for (int p = 0; p < rn; p += kTileMR) {
                const int rows     = std::min(kTileMR, rn - p);
                const __mmask32 in = rows >= 32 ? ~__mmask32{0} : (__mmask32{1} << rows) - 1;
                __m512i lo[16], hi[16];
                for (int g = 0; g < 16; ++g) {
                    const int k0    = b * kTileK + 2 * g;
                    const __m512i x = k0 < kc ? row32(src.row<bf16>(p0 + k0) + r0 + p, in)
                                              : _mm512_setzero_si512();
                    const __m512i y = k0 + 1 < kc ? row32(src.row<bf16>(p0 + k0 + 1) + r0 + p, in)
                                                  : _mm512_setzero_si512();
                    lo[g]           = _mm512_permutex2var_epi16(x, lo_idx, y);  // rows 0-15
                    hi[g]           = _mm512_permutex2var_epi16(x, hi_idx, y);  // rows 16-31
                }
                kernels::avx512::transpose16_epi32(lo);
                kernels::avx512::transpose16_epi32(hi);
                bf16* db = dst + size_t(p) * kcp + size_t(b) * kTileMR * kTileK;
                for (int i = 0; i < 16; ++i) {
                    _mm512_store_si512(db + size_t(i) * kTileK, lo[i]);
                    _mm512_store_si512(db + size_t(16 + i) * kTileK, hi[i]);
                }
            }
        }
        return;
    }
    // stored by row: each row's k values, a k block at a time
    for (int p = 0; p < rn; p += kTileMR) {
        const int rows = std::min(kTileMR, rn - p);
        bf16* d        = dst + size_t(p) * kcp;
        for (int r = 0; r < kTileMR; ++r) {
            const bf16* s = r < rows ? src.row<bf16>(r0 + p + r) + size_t(p0) : nullptr;
            for (int b = 0; b < kblk; ++b) {
                const int left    = kc - b * kTileK;
                const __mmask32 m = s == nullptr ? 0
                                    : left >= 32 ? ~__mmask32{0}
                                                 : (__mmask32{1} << left) - 1;
                const __m512i v   = _mm512_maskz_loadu_epi16(m, s ? s + b * kTileK : nullptr);
                _mm512_store_si512(d + size_t(b) * kTileMR * kTileK + size_t(r) * kTileK, v);
            }
        }
    }
}

// op(B) columns [r0, r0 + rn) -> the pair panels of pack_pairs_avx512, each kcp deep (k past kc
// zero), of bf16 or of float rounded to bf16 as it is packed.
template <typename T>
void pack_b_amx(PackSrc src, int r0, int rn, int p0, int kc, void* dst_v) {
    auto* dst          = static_cast<bf16*>(dst_v);
    const size_t kcp   = size_t((kc + kTileK - 1) / kTileK * kTileK);
    const size_t pairs = size_t((kc + 1) / 2);
    for (int p = 0; p < rn; p += kTileNR) {
        bf16* d = dst + size_t(p) * kcp;
        pack_pairs_avx512<kTileNR, T>(src, r0 + p, std::min(kTileNR, rn - p), p0, kc, d);
        std::memset(d + pairs * 2 * kTileNR, 0, (kcp / 2 - pairs) * 2 * kTileNR * sizeof(bf16));
    }
}

// A's two tiles of the k step at k: from a packed panel (rows of 32 k values, 64 bytes apart) or
// from A where it lies (rows lda values apart).
struct PanelA {
    const bf16* a;
    const bf16* rows0(int k) const { return a + size_t(k) * kTileMR; }
    const bf16* rows16(int k) const { return rows0(k) + 16 * kTileK; }
    size_t stride() const { return kTileK * sizeof(bf16); }
};
struct StridedA {
    const bf16* a;
    size_t lda;
    const bf16* rows0(int k) const { return a + k; }
    const bf16* rows16(int k) const { return a + 16 * lda + size_t(k); }
    size_t stride() const { return lda * sizeof(bf16); }
};

// The 32 x 32 tile of C over kcp values of k (a multiple of kTileK) from A's tiles and the B
// panel b. A whole tile with alpha 1 (every product but the scaled ones) is summed in C itself:
// the C tiles start from C (beta 1) or zero (beta 0) and are stored back where they lie, with no
// pass over a staging tile. Otherwise they start from zero and the staged sums are scaled.
template <typename ATiles>
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_tile(int kcp, ATiles a, const bf16* b,
                                                                  float* c, int ldc, float alpha,
                                                                  float beta, int m, int n) {
    const bool in_c =
        m == kTileMR && n == kTileNR && alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
    namespace t        = kernels::avx512;
    const size_t ldc_b = size_t(ldc) * sizeof(float);
    if (in_c && beta == 1.0f) {
        t::load_c_tiles(c, ldc_b);
    } else {
        t::zero_c_tiles();
    }
    for (int k = 0; k < kcp; k += kTileK) {
        const bf16* bk = b + size_t(k) * kTileNR;
        t::tile_step(a.rows0(k), a.rows16(k), a.stride(), bk, bk + 32, 2 * kTileNR * 2);
    }
    if (in_c) {
        t::store_c_tiles(c, ldc_b);
        return;
    }
    alignas(64) float tile[kTileMR * kTileNR];
    t::store_c_tiles(tile, kTileNR * 4);

    const __m512 va = _mm512_set1_ps(alpha);
    const __m512 vb = _mm512_set1_ps(beta);
    for (int i = 0; i < m; ++i) {
        float* ci = c + size_t(i) * size_t(ldc);
        for (int j = 0; j < n; j += 16) {
            const int w        = std::min(16, n - j);
            const __mmask16 mk = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1);
            __m512 t           = _mm512_mul_ps(_mm512_load_ps(tile + i * kTileNR + j), va);
            if (beta != 0.0f) t = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, ci + j), t);
            _mm512_mask_storeu_ps(ci + j, mk, t);
        }
    }
}

__attribute__((target("amx-tile,amx-bf16"))) void micro_amx(int kcp, const void* a_v,
                                                            const void* b_v, float* c, int ldc,
                                                            float alpha, float beta, int m, int n) {
    amx_tile(kcp, PanelA{static_cast<const bf16*>(a_v)}, static_cast<const bf16*>(b_v), c, ldc,
             alpha, beta, m, n);
}

// micro_amx with op(A) read where it lies: rows at lda bf16 apart, kc a multiple of kTileK; the
// same tile steps on the same values as from the packed panel, so bitwise its results. Packing
// A was about a tenth of a forward product's time (`bench kernels`, docs/results.md).
__attribute__((target("amx-tile,amx-bf16"))) void micro_amx_strided(int kc, const void* a_v,
                                                                    int lda, const void* b_v,
                                                                    float* c, int ldc, float alpha,
                                                                    float beta, int m, int n) {
    amx_tile(kc, StridedA{static_cast<const bf16*>(a_v), size_t(lda)},
             static_cast<const bf16*>(b_v), c, ldc, alpha, beta, m, n);
}

// kc 768: most of the model's depths (512, 768, 1536) are one or two k blocks, so the C tiles are
// loaded and stored once or twice a product (768 against 384: 1.01-1.43x on bench-medium's
// products of depth 512, 0.88-1.02x on the others, 1-3% on its bf16 step; docs/results.md);
// 768 also divides the fused head's row blocks (model/gpt.cpp), which then add the k blocks of
// one product in its order.
constexpr KernelSpec kAmx = [] {
    KernelSpec s{kTileMR, kTileNR,    kTileK,           2,        256, 768,
                 4096,    pack_a_amx, pack_b_amx<bf16>, micro_amx};
    s.pack_b_f32      = pack_b_amx<float>;
    s.pack_b_f32_rows = true;
    s.enter           = enter_tiles;
    s.leave           = leave_tiles;
    s.micro_strided   = micro_amx_strided;
    s.strided_k       = kTileK;
    return s;
}();

static_assert(kAmx.kc <= kMaxPairK, "the pair packer's zero row covers one k block");

}  // namespace

const KernelSpec& bf16_amx_kernel() { return kAmx; }

}  // namespace bagualu::kernels::gemm::avx512

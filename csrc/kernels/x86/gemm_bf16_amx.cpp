// AMX-BF16 GEMM kernel (Bf16Kernel::kAmxBf16): `tdpbf16ps` on 16-row tiles, blocks of 32 rows × 2 panels
// (x86/amx_tiles.inc), then the AVX-512 epilogue of the `vdpbf16ps` kernel (bf16_epilogue_avx512.inc) on each row
// of the block's stored tiles.  Same packed B, same A rows, same numerics as gemm_bf16.h describes: the products of
// two bf16 values are exact in fp32 and accumulate in fp32, so results differ from the other kernels only by the
// order of the fp32 sums (and, as `vdpbf16ps`, denormal inputs are flushed to zero).
//
// Why: one tdpbf16ps is 16 × 16 × 32 products, issued every 16 cycles: 16× the products per cycle of one zmm
// `vdpbf16ps` per cycle.  Measured 7.2-12.6× the `vdpbf16ps` kernel at DeiT linear shapes and 5.5-6.7× on
// attention's products (table bf16_kernel_parts, benchmarks/results/2026-11-28-intel-r-xeon-avx512.json).
//
// The ISA is enabled for this file only (cpu_features checks cpuid, XCR0 and the kernel's permission for the tile
// state); it includes only immintrin.h and plain headers (gemm_bf16_isa.h explains why).
#if defined(__clang__)
#pragma clang attribute push(                                                                                  \
    __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16"))), \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16")
#endif

#include "kernels/gemm_bf16_isa.h"
#include "kernels/x86/avx512_prelude.h"

namespace vitfast {
namespace gemm16 {
namespace {

using gemm::kNr;
using x86::gelu16_for_bf16;
using x86::round_bf16_16;

#include "kernels/x86/amx_tiles.inc"
#include "kernels/x86/bf16_epilogue_avx512.inc"

struct DotBf16 {
  static inline __attribute__((always_inline)) void c0() { _tile_dpbf16ps(0, 4, 6); }
  static inline __attribute__((always_inline)) void c1() { _tile_dpbf16ps(1, 4, 7); }
  static inline __attribute__((always_inline)) void c2() { _tile_dpbf16ps(2, 5, 6); }
  static inline __attribute__((always_inline)) void c3() { _tile_dpbf16ps(3, 5, 7); }
};

// Rows [0, rows) of the block in s.c through the epilogue to C (row 0 at c, column 0 of the pair) and/or c16.
static inline void store_rows(const float* acc, int rows, int np, float* c, int64_t ldc, const TileEpilogue& e,
                              const TileRows& t) {
  for (int r = 0; r < rows; ++r) {
    float* ci = c != nullptr ? c + r * ldc : nullptr;
    for (int q = 0; q < np; ++q) {
      const __m512 v = epilogue16(_mm512_load_ps(acc + 32 * r + 16 * q), e, t, ci, q, r);
      if (ci != nullptr) _mm512_mask_storeu_ps(ci + 16 * q, e.mask[q], v);
      if (t.c16 != nullptr) store_bf16(t.c16 + r * e.ldc16 + 16 * q, e.mask[q], v);
    }
  }
}

}  // namespace

void gemm_bf16_block_amx(const Bf16BlockArgs& g) {
  if (g.m <= 0 || g.panel_end <= g.panel_begin) return;
  AmxScratch& s = amx_scratch();
  const int64_t k_bytes = g.k2 * 2, steps = k_bytes / 64, tail = k_bytes % 64;
  const int64_t lda = g.lda * 2, bs = g.b_panel_stride * 2;
  const uint8_t* a = reinterpret_cast<const uint8_t*>(g.a);
  schedule(g.m, g.panel_begin, g.panel_end, bs, s, [&](int64_t i, int rows, int64_t p, int np) {
    products<DotBf16>(a + i * lda, lda, reinterpret_cast<const uint8_t*>(g.b), bs, p, np, steps, tail, rows, s);
    const int64_t col = p * kNr;
    const TileEpilogue e = pair_epilogue(g, p, np);
    TileRows t;
    t.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
    t.row_scale = g.row_scale != nullptr ? g.row_scale + i : nullptr;
    t.c16 = g.c16 != nullptr ? g.c16 + i * g.ldc16 + col : nullptr;
    t.pf = nullptr;
    t.pf_lines = 0;
    store_rows(reinterpret_cast<const float*>(s.c), rows, np, g.c != nullptr ? g.c + i * g.ldc + col : nullptr, g.ldc,
               e, t);
  });
  // Back to the initial tile state: the next context switch saves no tile data, and code after us (oneDNN in the
  // same thread) configures its own tiles anyway.
  _tile_release();
}

}  // namespace gemm16
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

// AMX-INT8 GEMM kernel (Int8Kernel::kAmxInt8): `tdpbssd` (s8 × s8, four products summed into s32) on 16-row tiles,
// blocks of 32 rows × 2 panels (x86/amx_tiles.inc), then the AVX-512 epilogue of the VNNI kernel
// (int8_epilogue_avx512.inc) on each row of the block's stored tiles.  B is the plain s8 pack ([k4][16][4], qw
// itself, as the scalar and NEON kernels'): with a signed × signed product there is no u8 offset and no rowsum
// correction.  The int32 sums are exact, as in every kernel (gemm_int8.h), so results equal theirs bit for bit
// wherever the epilogue's fp32 operations are the same.
//
// Why: one tdpbssd is 16 × 16 × 64 products, issued every 16 cycles: 16× the products per cycle of one zmm
// `vpdpbusd` per cycle.  Measured 2.6-3.8× the VNNI kernel at DeiT shapes and 1.18-1.92× ONNX Runtime's AMX
// MatMulInteger, at 25-40% of the register-only tdpbssd rate (table int8_gemm_shapes); the block alone reaches
// 72-85% with its operands in L1 and the fp32 epilogue is 35-45% of the time (table amx_int8_bounds, both in
// benchmarks/results/2026-11-29-intel-r-xeon-avx512.json; amx_tiles.inc says what was tried about the gap).
//
// The ISA is enabled for this file only (cpu_features checks cpuid, XCR0 and the kernel's permission for the tile
// state); it includes only immintrin.h and plain headers (gemm_int8_isa.h explains why).
#if defined(__clang__)
#pragma clang attribute push(                                                                                   \
    __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,amx-tile,amx-int8"))), \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,amx-tile,amx-int8")
#endif

#include "kernels/gemm_int8_isa.h"
#include "kernels/x86/avx512_prelude.h"

namespace vitfast {
namespace gemm8 {
namespace {

using x86::gelu16;

constexpr int kNr = 16;

#include "kernels/x86/amx_tiles.inc"
#include "kernels/x86/int8_epilogue_avx512.inc"

struct DotInt8 {
  static inline __attribute__((always_inline)) void c0() { _tile_dpbssd(0, 4, 6); }
  static inline __attribute__((always_inline)) void c1() { _tile_dpbssd(1, 4, 7); }
  static inline __attribute__((always_inline)) void c2() { _tile_dpbssd(2, 5, 6); }
  static inline __attribute__((always_inline)) void c3() { _tile_dpbssd(3, 5, 7); }
};

}  // namespace

void gemm_int8_block_amx(const Int8BlockArgs& g) {
  if (g.m <= 0 || g.panel_end <= g.panel_begin) return;
  AmxScratch& s = amx_scratch();
  const int64_t steps = g.k4 / 64, tail = g.k4 % 64;
  const uint8_t* a = reinterpret_cast<const uint8_t*>(g.a);
  schedule(g.m, g.panel_begin, g.panel_end, g.b_panel_stride, s, [&](int64_t i, int rows, int64_t p, int np) {
    products<DotInt8>(a + i * g.lda, g.lda, reinterpret_cast<const uint8_t*>(g.b), g.b_panel_stride, p, np, steps,
                      tail, rows, s);
    const int64_t col = p * kNr;
    Epi e = pair_epilogue(g, p, np);
    e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
    float* c = g.c + i * g.ldc + col;
    for (int r = 0; r < rows; ++r) {
      float* ci = c + r * g.ldc;
      const float sa = g.sa[i + r];
      for (int q = 0; q < np; ++q)
        _mm512_mask_storeu_ps(ci + 16 * q, e.mask[q],
                              epilogue16(_mm512_load_si512(s.c + 32 * r + 16 * q), 0, sa, e, ci, q, r));
    }
  });
  _tile_release();  // as gemm_bf16_block_amx
}

}  // namespace gemm8
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

// The loop nest shared by every ISA path (included only by gemm_scalar.cpp, x86/gemm_avx2.cpp and
// arm/gemm_neon.cpp).  Everything here has internal linkage (anonymous namespace), so each ISA file gets
// its own copy compiled for its own target: no ODR hazard even under `#pragma GCC target("avx2,fma")`.
//
// Loop order (BLIS-style, without packing A):
//   for each K block (kc deep)                       -- cache blocking over K
//     for each packed panel of kNr columns          -- the kc × kNr micro-panel of B stays in L1 ...
//       for each kMr-row tile of A                  -- ... while the row tiles stream A from L2
//         micro-kernel: kMr × kNr accumulators in registers across the whole K block
// The epilogue (bias, GELU, addend) runs in the last K block only; earlier blocks write partial sums to C.
#pragma once

#include <stdint.h>

#include "kernels/gemm_isa.h"
#include "kernels/next_pair_prefetch.h"

namespace vitfast {
namespace gemm {
namespace {

// What a micro-kernel does with its accumulators once its K block is done.
struct TileEpilogue {
  bool load_c;         // acc += C (a later K block, or accumulate mode)
  const float* bias;   // kNr values, or nullptr (non-null only in the last K block)
  bool gelu;           // only in the last K block
  const float* addend; // at this tile's (row 0, col 0), or nullptr (only in the last K block)
  int64_t ld_addend;
  const float* row_scale;  // at this tile's row 0, or nullptr (only in the last K block): after load_c, before bias
  int n_store;         // columns to load/store, 1..kNr (< kNr only on the tail panel of an unpadded C)
  NextPairShare next;  // this tile's share of the next panel's lines, for a tile that prefetches them to L2
                       // (next_pair_prefetch.h: the AVX2 tile does; NEON and scalar ignore it)
};

template <class Isa>
void run_gemm_block(const GemmBlockArgs& g) {
  const bool prefetch = next_panel_prefetch_enabled();
  // Equal K blocks no deeper than kc (so a K of 384 with kc 256 gives 2 × 192, not 256 + 128).
  const int64_t kc_max = g.kc > 0 ? g.kc : (g.k > 0 ? g.k : 1);
  const int64_t n_kblocks = g.k > 0 ? (g.k + kc_max - 1) / kc_max : 1;
  for (int64_t kb = 0; kb < n_kblocks; ++kb) {
    const int64_t k0 = g.k * kb / n_kblocks;
    const int64_t k1 = g.k * (kb + 1) / n_kblocks;
    const bool last = kb + 1 == n_kblocks;
    for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
      const float* bp = g.b + p * g.b_panel_stride + k0 * kNr;
      const int64_t col = p * kNr;
      const int64_t valid = g.n - col;
      TileEpilogue e;
      e.load_c = g.accumulate || kb > 0;
      e.bias = (last && g.bias != nullptr) ? g.bias + col : nullptr;
      e.gelu = last && g.gelu;
      e.ld_addend = g.ld_addend;
      // A partial tail panel is stored whole only into a padded C with no addend (the addend is a real
      // [m × n] matrix whose padding columns must never be read).
      e.n_store = (valid >= kNr || (g.c_padded && g.addend == nullptr)) ? int(kNr) : int(valid);
      // The next panel of this K block, whose lines the row tiles after the first ask L2 for.
      const int64_t np_next = next_panels(p + 1, g.panel_end, 1, prefetch);
      const char* next = np_next > 0 ? reinterpret_cast<const char*>(bp + g.b_panel_stride) : nullptr;
      for (int64_t i = 0; i < g.m; i += kMr) {
        const float* a = g.a + i * g.lda + k0;
        float* c = g.c + i * g.ldc + col;
        e.addend = (last && g.addend != nullptr) ? g.addend + i * g.ld_addend + col : nullptr;
        e.row_scale = (last && g.row_scale != nullptr) ? g.row_scale + i : nullptr;
        e.next = next_pair_share(next, 0, np_next, k1 - k0, k1 - k0, i / kMr);
        switch (g.m - i >= kMr ? kMr : g.m - i) {
          case 6: Isa::template tile<6>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
          case 5: Isa::template tile<5>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
          case 4: Isa::template tile<4>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
          case 3: Isa::template tile<3>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
          case 2: Isa::template tile<2>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
          default: Isa::template tile<1>(k1 - k0, a, g.lda, bp, c, g.ldc, e); break;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gemm
}  // namespace vitfast

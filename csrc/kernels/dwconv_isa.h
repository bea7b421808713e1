// The contract between dwconv_attention.cpp and the per-ISA depthwise-convolution rows (dwconv_scalar.cpp,
// x86/dwconv_avx2.cpp and x86/dwconv_avx512.cpp, the last two instantiating x86/dwconv_body.inc).  A plain header for the same reason as gemm_isa.h: PODs and declarations only, since
// it is included by files compiled under `#pragma GCC target`.
#pragma once

#include <stdint.h>

namespace vitfast {
namespace dwconv {

// One output grid row of eq. 11 over `cols` channels:
//   u[j · ld + d] = Σ_(r, c) taps[(r · k + c) · cols + d] · rows[r][(j + c − k/2) · ld + d],   j ∈ [0, grid_w)
// rows[r]: the V grid row i + r − k/2 ([grid_w × ld]), or nullptr when it lies outside the grid (zero padding);
// columns j + c − k/2 outside [0, grid_w) are skipped likewise.  u is written, not accumulated.  The scalar path
// adds the taps in (r, c) order; the SIMD paths sum each source row r over c, then add the rows in order (k
// independent FMA chains).
//
// SIMD paths: `cols` a multiple of 16 (taps zero padded to it, V's padding columns finite), ld >= cols.
void conv_grid_row_scalar(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                          int64_t grid_w, int64_t ksize);

#if defined(__x86_64__) || defined(__i386__)
void conv_grid_row_avx2(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                        int64_t grid_w, int64_t ksize);
void conv_grid_row_avx512(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                          int64_t grid_w, int64_t ksize);
#endif

}  // namespace dwconv
}  // namespace vitfast

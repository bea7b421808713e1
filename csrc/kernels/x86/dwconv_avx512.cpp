// AVX-512 rows of the depthwise convolution of dwconv_attention (contract: kernels/dwconv_isa.h).
//
// Why SIMD code for < 1% of the op's FLOPs: at ViT-L width (D = 1024, 24×24 grid) the compiler's baseline
// (SSE2) loop took 2.3 ms per call (9 read-modify-write passes over U; thread CPU time, loaded Zen 4), about
// as much as the op's whole margin over the eager reference, whose GEMMs are as fast as ours.  Here U is
// written once and every V vector is read once per 16-channel slice (see row_fixed).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

#include "kernels/dwconv_isa.h"

namespace vitfast {
namespace dwconv {
namespace {

// K known at compile time (3: the paper's default).  Per 16-channel slice: the K² taps in registers and a sliding
// window of K columns of each of the K source rows (win[r][c] = V[row r][j + c − K/2]), so each V vector is
// loaded once per slice.  Why a window and not K² loads per token: with D = 1024 a V row of the band is 4 KiB
// long, so the K² vectors one token reads all map to the same L1 set and evict each other.  Padding columns
// enter the window as zeros: t·0 adds nothing (weights are finite).  The caller pads the row stride ld so that
// consecutive tokens do not alias in L1 either (dwconv_attention.cpp: band_ld).
template <int K>
void row_fixed(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld, int64_t grid_w) {
  constexpr int P = K / 2;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t d = 0; d < cols; d += 16) {
    __m512 t[K * K];
    for (int i = 0; i < K * K; ++i) t[i] = _mm512_loadu_ps(taps + i * cols + d);
    __m512 win[K][K];
    for (int r = 0; r < K; ++r)
      for (int c = 0; c < K; ++c) {
        const int64_t jj = c - P;
        win[r][c] = rows[r] != nullptr && jj >= 0 && jj < grid_w ? _mm512_loadu_ps(rows[r] + jj * ld + d) : zero;
      }
    for (int64_t j = 0; j < grid_w; ++j) {
      // One accumulator per source row (K independent FMA chains; one chain of K² FMAs ran at the FMA latency,
      // 3× slower), then the rows added in order.  A row outside the grid has a zero window: it adds 0.
      __m512 acc[K];
      for (int r = 0; r < K; ++r) {
        acc[r] = zero;
        for (int c = 0; c < K; ++c) acc[r] = _mm512_fmadd_ps(t[r * K + c], win[r][c], acc[r]);
      }
      __m512 sum = acc[0];
      for (int r = 1; r < K; ++r) sum = _mm512_add_ps(sum, acc[r]);
      _mm512_storeu_ps(u + j * ld + d, sum);
      const int64_t next = j + 1 + (K - 1) - P;  // the column entering the window
      for (int r = 0; r < K; ++r) {
        for (int c = 0; c + 1 < K; ++c) win[r][c] = win[r][c + 1];
        win[r][K - 1] = rows[r] != nullptr && next < grid_w ? _mm512_loadu_ps(rows[r] + next * ld + d) : zero;
      }
    }
  }
}

// Any odd k: taps read from L1 at each use.
void row_any(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld, int64_t grid_w,
             int64_t k) {
  const int64_t p = k / 2;
  for (int64_t d = 0; d < cols; d += 16)
    for (int64_t j = 0; j < grid_w; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t r = 0; r < k; ++r) {
        const float* v = rows[r];
        if (v == nullptr) continue;
        for (int64_t c = 0; c < k; ++c) {
          const int64_t jj = j + c - p;
          if (jj >= 0 && jj < grid_w)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(taps + (r * k + c) * cols + d), _mm512_loadu_ps(v + jj * ld + d),
                                  acc);
        }
      }
      _mm512_storeu_ps(u + j * ld + d, acc);
    }
}

}  // namespace

void conv_grid_row_avx512(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                          int64_t grid_w, int64_t ksize) {
  switch (ksize) {
    case 1: row_fixed<1>(u, rows, taps, cols, ld, grid_w); return;
    case 3: row_fixed<3>(u, rows, taps, cols, ld, grid_w); return;
    default: row_any(u, rows, taps, cols, ld, grid_w, ksize); return;
  }
}

}  // namespace dwconv
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

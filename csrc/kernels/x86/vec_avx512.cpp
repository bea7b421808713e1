// AVX-512 vector kernels over rows (contract: kernels/gemm_isa.h): the two row softmaxes of attention and the
// row LayerNorm, 16 lanes with opmask tails.  The standalone GELU of the AVX-512 path is gelu_avx2 (every AVX-512
// CPU has AVX2; the GEMM epilogue's GELU is gelu16, avx512_math.h).
//
// The ISA is enabled for this file only (no -mavx512f anywhere; never -march=native); cpu_features picks this
// path at run time.  Same include discipline as gemm_avx512.cpp (see gemm_isa.h).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

// GCC 12 reports the `_mm512_undefined_ps()` pass-through inside its own _mm512_min_ps as maybe-uninitialized
// (a false positive in avx512fintrin.h, not in this file).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/gemm_isa.h"
#include "kernels/x86/avx512_math.h"
#include "kernels/x86/vec_body.inc"

namespace vitfast {
#include "kernels/x86/softmax_exp_avx512.inc"
}  // namespace vitfast

namespace vitfast {
namespace gemm {

using x86::exp16_nonpositive;

// The three passes of vec_body.inc (scale + max, exp + sum, normalise) at 16 lanes.
void softmax_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  softmax_rows<x86::Avx512>(s, rows, n, ld, scale);
}


// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum;
// 16 lanes and masked tails, rows in interleaved pairs.  Each row's arithmetic is the same whichever group it
// falls in, so a row's result does not depend on how many rows one call covers.
void softmax_exp_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2)
    x86::softmax_exp_row_group<2>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, x86::InPlace{s + r * ld, ld});
  if (r < rows)
    x86::softmax_exp_row_group<1>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, x86::InPlace{s + r * ld, ld});
}


namespace {

// R rows of layer_norm_rows at once (two passes and the normalisation), their reductions interleaved: one row
// alone waits on its sum's cross-lane reduction before the variance pass, and on the variance's before the
// normalisation; at ViT widths (12-48 vectors a row) those latencies, not the loads, set the pace.
template <int R>
static inline __attribute__((always_inline)) void layer_norm_group(const float* x, float* y, int64_t c,
                                                                   const float* gamma, const float* beta, float eps) {
  const __mmask16 tail = __mmask16((1u << (c % 16)) - 1u);
  const int64_t body = c - c % 16;
  // Pass 1 sums deviations from the row's first value (see layer_norm_rows_scalar): mean = x0 + Σ(x − x0)/c.
  __m512 s0[R], s1[R], e0[R], e1[R], mean[R], rstd[R], x0[R];
  float mean1[R];
  for (int r = 0; r < R; ++r) {
    s0[r] = s1[r] = _mm512_setzero_ps();
    x0[r] = _mm512_set1_ps(x[r * c]);
  }
  int64_t j = 0;
  for (; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
      s1[r] = _mm512_add_ps(s1[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), x0[r]));
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
  if (j < c)
    for (int r = 0; r < R; ++r)
      s1[r] = _mm512_add_ps(s1[r], _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), x0[r]));
  for (int r = 0; r < R; ++r) {
    mean1[r] = x[r * c] + _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c);
    mean[r] = _mm512_set1_ps(mean1[r]);
    s0[r] = s1[r] = e0[r] = e1[r] = _mm512_setzero_ps();
  }
  // Pass 2: Σd² and Σd (the corrected two-pass of layer_norm_rows_scalar).
  for (j = 0; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d0);
      e1[r] = _mm512_add_ps(e1[r], d1);
      s0[r] = _mm512_fmadd_ps(d0, d0, s0[r]);
      s1[r] = _mm512_fmadd_ps(d1, d1, s1[r]);
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d);
      s0[r] = _mm512_fmadd_ps(d, d, s0[r]);
    }
  if (j < c)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), mean[r]);
      e1[r] = _mm512_add_ps(e1[r], d);
      s1[r] = _mm512_fmadd_ps(d, d, s1[r]);
    }
  for (int r = 0; r < R; ++r) {
    const float corr = _mm512_reduce_add_ps(_mm512_add_ps(e0[r], e1[r])) / float(c);
    const float var = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c) - corr * corr;
    rstd[r] = _mm512_set1_ps(1.0f / __builtin_sqrtf((var < 0.0f ? 0.0f : var) + eps));
    mean[r] = _mm512_set1_ps(mean1[r] + corr);
  }
  for (j = 0; j < c; j += 16) {
    const __mmask16 m = j + 16 <= c ? __mmask16(0xFFFF) : tail;
    const __m512 g = gamma != nullptr ? _mm512_maskz_loadu_ps(m, gamma + j) : _mm512_setzero_ps();
    const __m512 b = beta != nullptr ? _mm512_maskz_loadu_ps(m, beta + j) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + r * c + j), mean[r]), rstd[r]);
      if (gamma != nullptr) v = _mm512_mul_ps(v, g);
      if (beta != nullptr) v = _mm512_add_ps(v, b);
      _mm512_mask_storeu_ps(y + r * c + j, m, v);
    }
  }
}

}  // namespace

// Rows in interleaved pairs; each row's arithmetic is the same whichever group it falls in.  At [197, C] and one
// thread this runs in about a quarter to a half of the time of torch's F.layer_norm (docs/performance.md).
void layer_norm_rows_avx512(const float* x, float* y, int64_t rows, int64_t c, const float* gamma,
                            const float* beta, float eps) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) layer_norm_group<2>(x + r * c, y + r * c, c, gamma, beta, eps);
  if (r < rows) layer_norm_group<1>(x + r * c, y + r * c, c, gamma, beta, eps);
}

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

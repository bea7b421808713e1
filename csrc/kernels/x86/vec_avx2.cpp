// AVX2/FMA vector kernels over rows (contract: kernels/gemm_isa.h): the standalone erf-GELU, the two row
// softmaxes of attention and the row LayerNorm.  8 lanes, masked tails with the body's arithmetic.
//
// The ISA is enabled for this file only (setup.py and CMake pass no -mavx2, never -march=native); the
// functions are chosen at run time by cpu_features (cpuid + XGETBV).  Only immintrin.h and our own plain
// headers are included (see gemm_isa.h).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

#include "kernels/gemm_isa.h"
#include "kernels/x86/avx2_math.h"
#include "kernels/x86/vec_body.inc"

namespace vitfast {
namespace gemm {

using x86::Avx2;

void gelu_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, x86::gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {  // one masked tail, same arithmetic as the body
    const __m256i m = x86::lane_mask(int(n - i));
    _mm256_maskstore_ps(x + i, m, x86::gelu8(_mm256_maskload_ps(x + i, m)));
  }
}

void softmax_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  softmax_rows<Avx2>(s, rows, n, ld, scale);
}

// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum.
void softmax_exp_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i tail = x86::lane_mask(int(n % 8));
  const int64_t body = n - n % 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    __m256 vmax = _mm256_set1_ps(row_max[r]);
    int64_t j = 0;
    // The scaled scores are stored back and the exp pass reads them, so exp(t − m) has t rounded exactly as in
    // the max: the max's own term is exactly 0.  fma(s, scale, −m) was up to half an ulp off (~1e22 for scores
    // near 1e29), exp of which made the row NaN where torch stays finite; a separate mul/sub GCC contracts again.
    for (; j < body; j += 8) {
      const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
      _mm256_storeu_ps(row + j, t);
      vmax = _mm256_max_ps(t, vmax);  // t first: maxps returns its second operand for a NaN t (the max skips it)
    }
    if (j < n) {
      const __m256 t = _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), vscale);
      _mm256_maskstore_ps(row + j, tail, t);
      vmax = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), t, _mm256_castsi256_ps(tail)),
                           vmax);
    }
    const float mx = x86::hmax8(vmax);
    // A row whose scores so far are all -inf subtracts 0: see softmax_exp_row_group in vec_avx512.cpp.
    const __m256 vmx = _mm256_set1_ps(mx == -__builtin_inff() ? 0.0f : mx);
    const __m256 vsum = exp_and_sum<Avx2>(row, body, n, tail, vmx);
    row_max[r] = mx;
    row_sum[r] = x86::hsum8(vsum);
  }
}

// Same two passes as layer_norm_rows_avx512 (gemm_isa.h), 8 lanes, one row at a time, masked tails.
void layer_norm_rows_avx2(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                          float eps) {
  using x86::hsum8;
  const __m256i tail = x86::lane_mask(int(c % 8));
  const int64_t body = c - c % 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    // Pass 1 sums deviations from the row's first value (see layer_norm_rows_scalar).
    const __m256 x0 = _mm256_set1_ps(xr[0]);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t j = 0;
    for (; j + 16 <= body; j += 16) {
      s0 = _mm256_add_ps(s0, _mm256_sub_ps(_mm256_loadu_ps(xr + j), x0));
      s1 = _mm256_add_ps(s1, _mm256_sub_ps(_mm256_loadu_ps(xr + j + 8), x0));
    }
    for (; j < body; j += 8) s0 = _mm256_add_ps(s0, _mm256_sub_ps(_mm256_loadu_ps(xr + j), x0));
    if (j < c)
      s1 = _mm256_add_ps(
          s1, _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(xr + j, tail), x0), _mm256_castsi256_ps(tail)));
    const float mean1 = xr[0] + hsum8(_mm256_add_ps(s0, s1)) / float(c);
    __m256 mean = _mm256_set1_ps(mean1);
    // Pass 2: Σd² and Σd (the corrected two-pass of layer_norm_rows_scalar).
    s0 = s1 = _mm256_setzero_ps();
    __m256 e0 = _mm256_setzero_ps(), e1 = e0;
    for (j = 0; j + 16 <= body; j += 16) {
      const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(xr + j), mean);
      const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(xr + j + 8), mean);
      e0 = _mm256_add_ps(e0, d0);
      e1 = _mm256_add_ps(e1, d1);
      s0 = _mm256_fmadd_ps(d0, d0, s0);
      s1 = _mm256_fmadd_ps(d1, d1, s1);
    }
    for (; j < body; j += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(xr + j), mean);
      e0 = _mm256_add_ps(e0, d);
      s0 = _mm256_fmadd_ps(d, d, s0);
    }
    if (j < c) {
      const __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(xr + j, tail), mean), _mm256_castsi256_ps(tail));
      e1 = _mm256_add_ps(e1, d);
      s1 = _mm256_fmadd_ps(d, d, s1);
    }
    const float corr = hsum8(_mm256_add_ps(e0, e1)) / float(c);
    const float var = hsum8(_mm256_add_ps(s0, s1)) / float(c) - corr * corr;
    const __m256 rstd = _mm256_set1_ps(1.0f / __builtin_sqrtf((var < 0.0f ? 0.0f : var) + eps));
    mean = _mm256_set1_ps(mean1 + corr);
    // Plain loads and stores in the body, masked ones for the tail only: a masked store (vmaskmovps) is
    // microcoded on AMD Zen (several cycles each), and masking every vector of the row made this pass most of
    // the op's time at DeiT-Ti rows (197 × 192).  Same arithmetic, so the same bits.
    for (j = 0; j < body; j += 8) {
      __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + j), mean), rstd);
      if (gamma != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(gamma + j));
      if (beta != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(beta + j));
      _mm256_storeu_ps(yr + j, v);
    }
    if (j < c) {
      __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(xr + j, tail), mean), rstd);
      if (gamma != nullptr) v = _mm256_mul_ps(v, _mm256_maskload_ps(gamma + j, tail));
      if (beta != nullptr) v = _mm256_add_ps(v, _mm256_maskload_ps(beta + j, tail));
      _mm256_maskstore_ps(yr + j, tail, v);
    }
  }
}

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

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

#include "kernels/gemm_int8_isa.h"
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

namespace {
// Pass 1 of softmax_exp_rows_avx2: t = s · scale stored back, and max(init, max_j t) (NaN lanes skipped).  The
// fused P path of attention_int8 (softmax_quantize_rows_avx2 below) runs this same code, so it takes the same
// maximum and can fall back to pass 2 on the stored t.
//
// The scaled scores are stored back and the exp pass reads them, so exp(t − m) has t rounded exactly as in the
// max: the max's own term is exactly 0.  fma(s, scale, −m) was up to half an ulp off (~1e22 for scores near
// 1e29), exp of which made the row NaN where torch stays finite; a separate mul/sub GCC contracts again.
inline __attribute__((always_inline)) float scale_store_max(float* row, int64_t n, __m256 vscale, float init) {
  const __m256i tail = x86::lane_mask(int(n % 8));
  const int64_t body = n - n % 8;
  __m256 vmax = _mm256_set1_ps(init);
  int64_t j = 0;
  for (; j < body; j += 8) {
    const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
    _mm256_storeu_ps(row + j, t);
    vmax = _mm256_max_ps(t, vmax);  // t first: maxps returns its second operand for a NaN t (the max skips it)
  }
  if (j < n) {
    const __m256 t = _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), vscale);
    _mm256_maskstore_ps(row + j, tail, t);
    vmax = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), t, _mm256_castsi256_ps(tail)), vmax);
  }
  return x86::hmax8(vmax);
}

// The exp pass's subtrahend: a row whose scores so far are all -inf subtracts 0 (see softmax_exp_row_group in
// vec_avx512.cpp).
inline __m256 exp_shift(float mx) { return _mm256_set1_ps(mx == -__builtin_inff() ? 0.0f : mx); }
}  // namespace

// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum.
void softmax_exp_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i tail = x86::lane_mask(int(n % 8));
  const int64_t body = n - n % 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const float mx = scale_store_max(row, n, vscale, row_max[r]);
    const __m256 vsum = exp_and_sum<Avx2>(row, body, n, tail, exp_shift(mx));
    row_max[r] = mx;
    row_sum[r] = x86::hsum8(vsum);
  }
}

}  // namespace gemm

namespace gemm8 {

// gemm_int8.h: softmax_quantize_rows.  Per row: pass 1 as softmax_exp_rows_avx2, then one pass that takes each
// exp e (exp8_for_bf16: the codes keep 7 bits), keeps the maximum of the exps' bits (the row's max e, NaN above
// all), and stores the code rne(e · 127) (quantize_rows' rule when the row's amax is 1) with the codes' sum.  A row
// whose max e is not exactly 1 or that holds a NaN runs the two steps on its stored t instead.  Codes 32 at a time
// (x86::low_bytes32), then 8.
void softmax_quantize_rows_avx2(const SoftmaxQuantizeArgs& a) {
  const __m256 vscale = _mm256_set1_ps(a.scale), k127 = _mm256_set1_ps(127.0f);
  const int64_t n = a.n, body = n - n % 8, n4 = (n + 3) / 4 * 4;
  const __m256i tail = x86::lane_mask(int(n % 8));
  for (int64_t r = 0; r < a.rows; ++r) {
    float* row = a.s + r * a.ld;
    int8_t* out = a.q + r * a.lda;
    const __m256 vmx = gemm::exp_shift(gemm::scale_store_max(row, n, vscale, -__builtin_inff()));
    // The unsigned maximum of the exps' bit patterns: 1.0f's exactly when the max exp is 1 and no exp is NaN
    // (softmax_quantize_rows_avx512's ToInt8 explains it).
    __m256i emax = _mm256_setzero_si256();
    __m256i vsum = _mm256_setzero_si256();
    auto code = [&](__m256 e) {
      emax = _mm256_max_epu32(_mm256_castps_si256(e), emax);
      const __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(e, k127));
      vsum = _mm256_add_epi32(vsum, i);
      return i;
    };
    auto exp_at = [&](int64_t j) { return x86::exp8_for_bf16(_mm256_sub_ps(_mm256_loadu_ps(row + j), vmx)); };
    int64_t j = 0;
    for (; j + 32 <= body; j += 32) {
      const __m256i i0 = code(exp_at(j)), i1 = code(exp_at(j + 8)), i2 = code(exp_at(j + 16)),
                    i3 = code(exp_at(j + 24));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), x86::low_bytes32(i0, i1, i2, i3));
    }
    for (; j < body; j += 8)
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), x86::low_bytes8(code(exp_at(j))));
    if (j < n) {  // masked-off lanes: e = 0, code 0
      const __m256 e = x86::exp8_for_bf16(_mm256_sub_ps(_mm256_maskload_ps(row + j, tail), vmx));
      int8_t tmp[16];
      const __m256 e_in = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), x86::low_bytes8(code(e_in)));
      for (int64_t c = j; c < n; ++c) out[c] = tmp[c - j];
    }
    for (int64_t c = n; c < n4; ++c) out[c] = 0;
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(emax), _mm256_extracti128_si256(emax, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    if (uint32_t(_mm_cvtsi128_si32(h)) == 0x3F800000u) {  // max exp exactly 1.0f, no NaN
      a.sa[r] = 1.0f / 127.0f;  // amax / 127 with amax = 1
      a.rowsum[r] = x86::hsum8_epi32(vsum);
    } else {  // the two steps: pass 2 of softmax_exp_rows_avx2 on the stored t, then quantize_rows
      gemm::exp_and_sum<x86::Avx2, true>(row, body, n, tail, vmx);
      quantize_rows_avx2(QuantizeArgs{row, a.ld, 1, n, nullptr, out, a.lda, a.sa + r, a.rowsum + r});
    }
  }
}

}  // namespace gemm8

namespace gemm {

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

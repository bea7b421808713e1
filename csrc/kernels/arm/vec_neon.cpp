// NEON vector kernels over rows (contract: kernels/gemm_isa.h): the standalone erf-GELU, the two row softmaxes
// of attention and the row LayerNorm; 4 lanes, tails through a padded vector or scalar code.
#include <arm_neon.h>
#include <stdint.h>

#include "kernels/arm/neon_math.h"
#include "kernels/gemm_isa.h"
#include "kernels/scalar_math.h"

namespace vitfast {
namespace gemm {

using arm::exp4_for_bf16;
using arm::exp4_nonpositive;
using arm::gelu4;

void gelu_neon(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, gelu4(vld1q_f32(x + i)));
  if (i < n) {  // one tail through a padded vector, same arithmetic as the body
    float t[4] = {0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    vst1q_f32(t, gelu4(vld1q_f32(t)));
    for (int64_t j = i; j < n; ++j) x[j] = t[j - i];
  }
}

namespace {

// Pass 1 of both softmaxes: the row scaled in place (stored: the exp pass reads these rounded values, so t − m is
// exactly 0 for the max, see softmax_exp_rows_avx2 in x86/vec_avx2.cpp), and max(init, its maximum).
float scale_row_and_max(float* row, int64_t n, float scale, float init) {
  const int64_t body = n - n % 4;
  float32x4_t vmax = vdupq_n_f32(init);
  float mx = init;
  int64_t j = 0;
  for (; j < body; j += 4) {
    const float32x4_t t = vmulq_n_f32(vld1q_f32(row + j), scale);
    vst1q_f32(row + j, t);
    vmax = vmaxnmq_f32(vmax, t);
  }
  for (; j < n; ++j) {
    row[j] *= scale;
    mx = row[j] > mx ? row[j] : mx;
  }
  return vmaxnmvq_f32(vmax) > mx ? vmaxnmvq_f32(vmax) : mx;
}

// Pass 2: row = Exp(row − sub) in place; returns its sum.
template <float32x4_t (*Exp)(float32x4_t) = exp4_nonpositive>
float exp_row_and_sum(float* row, int64_t n, float sub) {
  const int64_t body = n - n % 4;
  const float32x4_t vsub = vdupq_n_f32(sub);
  float32x4_t vsum = vdupq_n_f32(0.0f);
  int64_t j = 0;
  for (; j < body; j += 4) {
    const float32x4_t e = Exp(vsubq_f32(vld1q_f32(row + j), vsub));
    vst1q_f32(row + j, e);
    vsum = vaddq_f32(vsum, e);
  }
  float sum = vaddvq_f32(vsum);
  if (j < n) {  // one tail through a padded vector, same arithmetic as the body
    float t[4] = {0, 0, 0, 0};
    for (int64_t q = j; q < n; ++q) t[q - j] = row[q];
    vst1q_f32(t, Exp(vsubq_f32(vld1q_f32(t), vsub)));
    for (int64_t q = j; q < n; ++q) {
      row[q] = t[q - j];
      sum += t[q - j];
    }
  }
  return sum;
}

}  // namespace

void softmax_rows_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  const int64_t body = n - n % 4;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const float mx = scale_row_and_max(row, n, scale, -__builtin_inff());
    const float inv = 1.0f / exp_row_and_sum(row, n, mx);
    int64_t j = 0;
    for (; j < body; j += 4) vst1q_f32(row + j, vmulq_n_f32(vld1q_f32(row + j), inv));
    for (; j < n; ++j) row[j] *= inv;
  }
}

// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum.
void softmax_exp_rows_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const float mx = scale_row_and_max(row, n, scale, row_max[r]);
    // a row whose scores so far are all -inf subtracts 0, not -inf: see softmax_exp_row_group in x86/vec_avx512.cpp
    row_sum[r] = exp_row_and_sum(row, n, mx == -__builtin_inff() ? 0.0f : mx);
    row_max[r] = mx;
  }
}

void softmax_exp_rows_for_bf16_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                    float* row_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const float mx = scale_row_and_max(row, n, scale, row_max[r]);
    row_sum[r] = exp_row_and_sum<exp4_for_bf16>(row, n, mx == -__builtin_inff() ? 0.0f : mx);
    row_max[r] = mx;
  }
}

// Same two passes as the x86 paths (gemm_isa.h), 4 lanes, scalar tails.
void layer_norm_rows_neon(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                          float eps) {
  const int64_t body = c - c % 4;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    // Pass 1 sums deviations from the row's first value (see layer_norm_rows_scalar).
    const float x0 = xr[0];
    const float32x4_t vx0 = vdupq_n_f32(x0);
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;
    int64_t j = 0;
    for (; j + 8 <= body; j += 8) {
      s0 = vaddq_f32(s0, vsubq_f32(vld1q_f32(xr + j), vx0));
      s1 = vaddq_f32(s1, vsubq_f32(vld1q_f32(xr + j + 4), vx0));
    }
    for (; j < body; j += 4) s0 = vaddq_f32(s0, vsubq_f32(vld1q_f32(xr + j), vx0));
    float sum = vaddvq_f32(vaddq_f32(s0, s1));
    for (; j < c; ++j) sum += xr[j] - x0;
    const float mean = x0 + sum / float(c);
    float32x4_t vmean = vdupq_n_f32(mean);
    s0 = s1 = vdupq_n_f32(0.0f);
    float32x4_t e0 = s0, e1 = s0;
    for (j = 0; j + 8 <= body; j += 8) {
      const float32x4_t d0 = vsubq_f32(vld1q_f32(xr + j), vmean), d1 = vsubq_f32(vld1q_f32(xr + j + 4), vmean);
      e0 = vaddq_f32(e0, d0);
      e1 = vaddq_f32(e1, d1);
      s0 = vfmaq_f32(s0, d0, d0);
      s1 = vfmaq_f32(s1, d1, d1);
    }
    for (; j < body; j += 4) {
      const float32x4_t d = vsubq_f32(vld1q_f32(xr + j), vmean);
      e0 = vaddq_f32(e0, d);
      s0 = vfmaq_f32(s0, d, d);
    }
    float var = vaddvq_f32(vaddq_f32(s0, s1));
    float dsum = vaddvq_f32(vaddq_f32(e0, e1));
    for (; j < c; ++j) {
      dsum += xr[j] - mean;
      var = __builtin_fmaf(xr[j] - mean, xr[j] - mean, var);
    }
    const float corr = dsum / float(c);  // corrected two-pass: pass 1's rounding, large when x0 is an outlier
    var = var / float(c) - corr * corr;
    const float rstd = 1.0f / __builtin_sqrtf((var < 0.0f ? 0.0f : var) + eps);
    const float32x4_t vrstd = vdupq_n_f32(rstd);
    const float mean2 = mean + corr;
    vmean = vdupq_n_f32(mean2);
    for (j = 0; j < body; j += 4) {
      float32x4_t v = vmulq_f32(vsubq_f32(vld1q_f32(xr + j), vmean), vrstd);
      if (gamma != nullptr) v = vmulq_f32(v, vld1q_f32(gamma + j));
      if (beta != nullptr) v = vaddq_f32(v, vld1q_f32(beta + j));
      vst1q_f32(yr + j, v);
    }
    normalise_row_scalar(xr, yr, j, c, mean2, rstd, gamma, beta);
  }
}

}  // namespace gemm
}  // namespace vitfast

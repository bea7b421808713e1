// Portable vector kernels over rows: the "scalar" path of the erf-GELU, the two row softmaxes and the row
// LayerNorm (contract: gemm_isa.h), always compiled, the fallback on any CPU.  Plain C++ (std::exp, std::erf),
// which the compiler vectorises for the baseline ISA only.
#include <cmath>
#include <limits>

#include "kernels/gemm_isa.h"
#include "kernels/scalar_math.h"

namespace vitfast {
namespace gemm {

void gelu_scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = gelu1(x[i]);
}

void softmax_rows_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      row[j] *= scale;
      mx = std::fmax(mx, row[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  }
}

namespace {
template <float (*Exp)(float)>
void exp_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max, float* row_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    float mx = row_max[r];
    // Scaled scores stored back, read by the exp pass: t − m is exactly 0 for the max (see softmax_exp_rows_avx2 in x86/vec_avx2.cpp).
    for (int64_t j = 0; j < n; ++j) {
      row[j] *= scale;
      mx = std::fmax(mx, row[j]);
    }
    const float sub = mx == -std::numeric_limits<float>::infinity() ? 0.0f : mx;  // all -inf so far: see x86/vec_avx512.cpp
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = Exp(row[j] - sub);
      sum += row[j];
    }
    row_max[r] = mx;
    row_sum[r] = sum;
  }
}

float exp_std(float x) { return std::exp(x); }
}  // namespace

void softmax_exp_rows_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum) {
  exp_rows<exp_std>(s, rows, n, ld, scale, row_max, row_sum);
}

void softmax_exp_rows_for_bf16_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                      float* row_sum) {
  exp_rows<exp_for_bf16>(s, rows, n, ld, scale, row_max, row_sum);
}

void layer_norm_rows_scalar(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                            float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    // The mean as x0 + Σ(x − x0)/c: the sum runs over deviations, not over values that may all be ~1000× the
    // spread (a ViT's residual stream), whose rounding would land in the mean.  Four partial sums per pass, as
    // the SIMD paths keep several lanes: shorter rounding chains than one.
    const float x0 = xr[0];
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j = 0; j < c; ++j) s[j % 4] += xr[j] - x0;
    const float mean = x0 + ((s[0] + s[1]) + (s[2] + s[3])) / float(c);
    float q[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j = 0; j < c; ++j) {
      const float d = xr[j] - mean;
      e[j % 4] += d;
      q[j % 4] = std::fma(d, d, q[j % 4]);
    }
    // Corrected two-pass: the residual mean of the deviations fixes pass 1's rounding (large when x0 is an outlier).
    const float corr = ((e[0] + e[1]) + (e[2] + e[3])) / float(c);
    // Only a rounding-negative variance is clamped: a NaN one (inf − inf at ~1e30 spreads) stays NaN, as in torch.
    const float var = ((q[0] + q[1]) + (q[2] + q[3])) / float(c) - corr * corr;
    const float rstd = 1.0f / std::sqrt((var < 0.0f ? 0.0f : var) + eps);
    const float mean2 = mean + corr;
    normalise_row_scalar(xr, yr, 0, c, mean2, rstd, gamma, beta);
  }
}

}  // namespace gemm
}  // namespace vitfast

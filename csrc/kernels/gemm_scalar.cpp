// Portable GEMM micro-kernel: the "scalar" path, always compiled, the fallback on any CPU.  No ISA-specific
// intrinsics: plain C++ plus the compiler's generic 4-wide vector type, which lowers to the *baseline* ISA
// only (SSE2 on x86-64, NEON on aarch64, scalar code elsewhere).  Same 6 × 16 block and driver as the SIMD
// paths.  GELU uses std::erf.
#include <cmath>
#include <limits>

#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {
namespace {

inline float gelu1(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

struct Scalar {
  template <int MR>
  static void tile(int64_t k, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                   const TileEpilogue& e) {
    // Portable 4-wide vectors (GCC/Clang vector extension: SSE2 on x86-64, NEON on ARM, plain scalar code
    // elsewhere), two passes of 8 columns so MR × 2 accumulators fit 16 registers.  Plain nested loops
    // over a float[6][16] block were vectorised across rows by GCC and ran at ~3.5 GFLOP/s.
    typedef float v4 __attribute__((vector_size(16)));
    float acc[MR][kNr];
    for (int half = 0; half < kNr; half += 8) {
      v4 h0[MR], h1[MR];
      for (int i = 0; i < MR; ++i) h0[i] = h1[i] = v4{0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t p = 0; p < k; ++p) {
        v4 b0, b1;
        __builtin_memcpy(&b0, b + p * kNr + half, sizeof(v4));
        __builtin_memcpy(&b1, b + p * kNr + half + 4, sizeof(v4));
        for (int i = 0; i < MR; ++i) {
          const float ai = a[i * lda + p];
          h0[i] += ai * b0;
          h1[i] += ai * b1;
        }
      }
      for (int i = 0; i < MR; ++i) {
        __builtin_memcpy(&acc[i][half], &h0[i], sizeof(v4));
        __builtin_memcpy(&acc[i][half + 4], &h1[i], sizeof(v4));
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc;
      for (int j = 0; j < e.n_store; ++j) {
        float v = acc[i][j];
        if (e.load_c) v += ci[j];
        if (e.bias != nullptr) v += e.bias[j];
        if (e.gelu) v = gelu1(v);
        if (e.addend != nullptr) v += e.addend[i * e.ld_addend + j];
        ci[j] = v;
      }
    }
  }
};

}  // namespace

void gemm_block_scalar(const GemmBlockArgs& args) { run_gemm_block<Scalar>(args); }

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

void softmax_exp_rows_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    float mx = row_max[r];
    // Scaled scores stored back, read by the exp pass: t − m is exactly 0 for the max (see softmax_exp_rows_avx2).
    for (int64_t j = 0; j < n; ++j) {
      row[j] *= scale;
      mx = std::fmax(mx, row[j]);
    }
    const float sub = mx == -std::numeric_limits<float>::infinity() ? 0.0f : mx;  // all -inf so far: see avx512
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - sub);
      sum += row[j];
    }
    row_max[r] = mx;
    row_sum[r] = sum;
  }
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
    for (int64_t j = 0; j < c; ++j) {
      float v = (xr[j] - mean2) * rstd;
      if (gamma != nullptr) v *= gamma[j];
      if (beta != nullptr) v += beta[j];
      yr[j] = v;
    }
  }
}

}  // namespace gemm
}  // namespace vitfast

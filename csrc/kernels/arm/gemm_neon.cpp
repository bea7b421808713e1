// NEON GEMM micro-kernels (6 × 16: 24 q-register accumulators, vfmaq_f32) and the vectorised erf-GELU.
// NEON is baseline on aarch64, so no target pragma is needed; the same plain-header rule as the AVX2 file
// keeps the file free of STL templates.
#include <arm_neon.h>
#include <stdint.h>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"
#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {
namespace {

static inline float32x4_t horner(float32x4_t x, const float* c, int n) {
  float32x4_t r = vdupq_n_f32(c[n - 1]);
  for (int i = n - 2; i >= 0; --i) r = vfmaq_f32(vdupq_n_f32(c[i]), r, x);
  return r;
}

// Exact-form GELU: 0.5·x·(1 + erf(x/√2)), erf from the piecewise polynomials of erf_poly.h.
static inline float32x4_t gelu4(float32x4_t x) {
  const float32x4_t z = vminq_f32(vabsq_f32(vmulq_n_f32(x, kInvSqrt2)), vdupq_n_f32(kErfMax));
  const float32x4_t small = vmulq_f32(z, horner(vmulq_f32(z, z), kErfP, 7));
  const float32x4_t big =
      vminq_f32(horner(vsubq_f32(z, vdupq_n_f32(kErfCenter)), kErfQ, 13), vdupq_n_f32(1.0f));
  float32x4_t erf_abs = vbslq_f32(vcgtq_f32(z, vdupq_n_f32(kErfSplit)), big, small);
  erf_abs = vbslq_f32(vcgeq_f32(z, vdupq_n_f32(kErfMax)), vdupq_n_f32(1.0f), erf_abs);
  // erf(−z) = −erf(z): copy the sign bit of x.
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
  const float32x4_t erf = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(erf_abs), sign));
  const float32x4_t half_x = vmulq_n_f32(x, 0.5f);
  return vfmaq_f32(half_x, half_x, erf);
}

// exp(x) for x <= 0 (softmax after max subtraction), Cephes' method (exp_poly.h); x < kExpMin gives 0.
static inline float32x4_t exp4_nonpositive(float32x4_t x) {
  const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(kExpMin));
  x = vmaxq_f32(x, vdupq_n_f32(kExpMin));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, kLog2e));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(kLn2Hi));
  r = vfmsq_f32(r, n, vdupq_n_f32(kLn2Lo));
  const float32x4_t p = horner(r, kExpP, 6);
  const float32x4_t er = vaddq_f32(vfmaq_f32(r, vmulq_f32(r, r), p), vdupq_n_f32(1.0f));
  const int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t e = vmulq_f32(er, vreinterpretq_f32_s32(pow2n));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), tiny));
}

struct Neon {
  template <int MR>
  static inline __attribute__((always_inline)) void tile(int64_t k, const float* a, int64_t lda, const float* b,
                                                         float* c, int64_t ldc, const TileEpilogue& e) {
    float32x4_t acc[MR][4];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = vdupq_n_f32(0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float* bp = b + p * kNr;
      // Same B prefetch as the AVX2 path (see kPrefetchLines there); harmless past the end of the buffer.
      __builtin_prefetch(bp + 64 * kNr);
      const float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4), b2 = vld1q_f32(bp + 8),
                        b3 = vld1q_f32(bp + 12);
      for (int i = 0; i < MR; ++i) {
        const float32x4_t ai = vld1q_dup_f32(a + i * lda + p);
        acc[i][0] = vfmaq_f32(acc[i][0], ai, b0);
        acc[i][1] = vfmaq_f32(acc[i][1], ai, b1);
        acc[i][2] = vfmaq_f32(acc[i][2], ai, b2);
        acc[i][3] = vfmaq_f32(acc[i][3], ai, b3);
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc;
      if (e.n_store == kNr) {
        for (int j = 0; j < 4; ++j) {
          float32x4_t v = acc[i][j];
          if (e.load_c) v = vaddq_f32(v, vld1q_f32(ci + 4 * j));
          if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
          if (e.gelu) v = gelu4(v);
          if (e.addend != nullptr) v = vaddq_f32(v, vld1q_f32(e.addend + i * e.ld_addend + 4 * j));
          vst1q_f32(ci + 4 * j, v);
        }
      } else {
        // Tail panel: go through a stack tile so no byte past column n is read or written.
        float t[kNr] = {0};
        for (int j = 0; j < 4; ++j) vst1q_f32(t + 4 * j, acc[i][j]);
        if (e.load_c)
          for (int j = 0; j < e.n_store; ++j) t[j] += ci[j];
        for (int j = 0; j < 4; ++j) {
          float32x4_t v = vld1q_f32(t + 4 * j);
          if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
          if (e.gelu) v = gelu4(v);
          vst1q_f32(t + 4 * j, v);
        }
        if (e.addend != nullptr)
          for (int j = 0; j < e.n_store; ++j) t[j] += e.addend[i * e.ld_addend + j];
        for (int j = 0; j < e.n_store; ++j) ci[j] = t[j];
      }
    }
  }
};

}  // namespace

void gemm_block_neon(const GemmBlockArgs& args) { run_gemm_block<Neon>(args); }

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
// exactly 0 for the max, see softmax_exp_rows_avx2), and max(init, its maximum).
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

// Pass 2: row = exp(row − sub) in place; returns its sum.
float exp_row_and_sum(float* row, int64_t n, float sub) {
  const int64_t body = n - n % 4;
  const float32x4_t vsub = vdupq_n_f32(sub);
  float32x4_t vsum = vdupq_n_f32(0.0f);
  int64_t j = 0;
  for (; j < body; j += 4) {
    const float32x4_t e = exp4_nonpositive(vsubq_f32(vld1q_f32(row + j), vsub));
    vst1q_f32(row + j, e);
    vsum = vaddq_f32(vsum, e);
  }
  float sum = vaddvq_f32(vsum);
  if (j < n) {  // one tail through a padded vector, same arithmetic as the body
    float t[4] = {0, 0, 0, 0};
    for (int64_t q = j; q < n; ++q) t[q - j] = row[q];
    vst1q_f32(t, exp4_nonpositive(vsubq_f32(vld1q_f32(t), vsub)));
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
    // a row whose scores so far are all -inf subtracts 0, not -inf: see softmax_exp_row_group in gemm_avx512.cpp
    row_sum[r] = exp_row_and_sum(row, n, mx == -__builtin_inff() ? 0.0f : mx);
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
    for (; j < c; ++j) {
      float v = (xr[j] - mean2) * rstd;
      if (gamma != nullptr) v *= gamma[j];
      if (beta != nullptr) v += beta[j];
      yr[j] = v;
    }
  }
}

}  // namespace gemm
}  // namespace vitfast

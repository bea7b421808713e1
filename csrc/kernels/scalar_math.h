// Plain-C++ helpers of the portable paths: the exact erf-GELU of one value (the scalar GEMM epilogue and
// gelu_scalar) and the normalising pass of the row LayerNorm (the whole row in vec_scalar.cpp, the tail columns
// after the vector body in arm/vec_neon.cpp: one arithmetic, so the NEON tail gets the scalar path's bits).
// Included only by baseline-ISA files (no `#pragma GCC target`), so <cmath> is safe here; internal linkage all
// the same (see gemm_isa.h).
#pragma once

#include <stdint.h>

#include <cmath>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"

namespace vitfast {
namespace gemm {
namespace {

inline float gelu1(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

// The bf16 GEMMs' GELU (erf_poly.h: kGeluBf16) in scalar arithmetic: the vector forms' operations (x86/avx512_math.h
// gelu16_for_bf16, arm/neon_math.h gelu4_for_bf16), each rounded once, so the same bits.  NaN through fmin stays
// NaN: fmin(NaN, m) = m, and the last fma then takes a = NaN.
inline float gelu_for_bf16(float x) {
  const float a = std::fabs(x);
  const float t = std::fma(std::fmin(a, kGeluBf16Max), kGeluBf16Scale, -1.0f);
  float e = kGeluBf16[12];
  for (int i = 11; i >= 0; --i) e = std::fma(e, t, kGeluBf16[i]);
  return std::fma(a, e, x * 0.5f);
}

// exp(x) for x <= 0 rounded to bf16 next (exp_poly.h: kExp2Bf16P) in scalar arithmetic: the operations of the vector
// forms (x86/avx512_math.h exp16_for_bf16, arm/neon_math.h exp4_for_bf16), each rounded once, so the same bits.
inline float exp_for_bf16(float x) {
  if (std::isnan(x)) return x;
  if (x < kExpMin) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  const float f = std::fma(x, kLog2e, -n);
  float p = kExp2Bf16P[4];
  for (int i = 3; i >= 0; --i) p = std::fma(p, f, kExp2Bf16P[i]);
  return std::ldexp(p, int(n));  // a normal number for x >= kExpMin: exact
}

// y[j] = (x[j] − mean) · rstd  [· gamma[j]]  [+ beta[j]]  for j in [begin, end)   (gamma, beta: nullptr or per column)
static inline __attribute__((always_inline)) void normalise_row_scalar(const float* x, float* y, int64_t begin,
                                                                       int64_t end, float mean, float rstd,
                                                                       const float* gamma, const float* beta) {
  for (int64_t j = begin; j < end; ++j) {
    float v = (x[j] - mean) * rstd;
    if (gamma != nullptr) v *= gamma[j];
    if (beta != nullptr) v += beta[j];
    y[j] = v;
  }
}

}  // namespace
}  // namespace gemm
}  // namespace vitfast

// Plain-C++ helpers of the portable paths: the exact erf-GELU of one value (the scalar GEMM epilogue and
// gelu_scalar) and the normalising pass of the row LayerNorm (the whole row in vec_scalar.cpp, the tail columns
// after the vector body in arm/vec_neon.cpp: one arithmetic, so the NEON tail gets the scalar path's bits).
// Included only by baseline-ISA files (no `#pragma GCC target`), so <cmath> is safe here; internal linkage all
// the same (see gemm_isa.h).
#pragma once

#include <stdint.h>

#include <cmath>

namespace vitfast {
namespace gemm {
namespace {

inline float gelu1(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

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

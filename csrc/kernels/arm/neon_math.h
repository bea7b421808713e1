// NEON building blocks shared by the NEON files (gemm_neon.cpp, vec_neon.cpp): the vectorised erf-GELU and exp
// at 4 lanes.  NEON is baseline on aarch64 (no target pragma); internal linkage all the same, like the x86
// headers (see gemm_isa.h).
#pragma once

#include <arm_neon.h>
#include <stdint.h>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"

namespace vitfast {
namespace arm {
namespace {

static inline float32x4_t horner(float32x4_t x, const float* c, int n) {
  float32x4_t r = vdupq_n_f32(c[n - 1]);
  for (int i = n - 2; i >= 0; --i) r = vfmaq_f32(vdupq_n_f32(c[i]), r, x);
  return r;
}

// Exact-form GELU: 0.5·x·(1 + erf(x/√2)), erf from the piecewise polynomials of erf_poly.h.
static inline float32x4_t gelu4(float32x4_t x) {
  const float32x4_t z = vminq_f32(vabsq_f32(vmulq_n_f32(x, gemm::kInvSqrt2)), vdupq_n_f32(gemm::kErfMax));
  const float32x4_t small = vmulq_f32(z, horner(vmulq_f32(z, z), gemm::kErfP, 7));
  const float32x4_t big =
      vminq_f32(horner(vsubq_f32(z, vdupq_n_f32(gemm::kErfCenter)), gemm::kErfQ, 13), vdupq_n_f32(1.0f));
  float32x4_t erf_abs = vbslq_f32(vcgtq_f32(z, vdupq_n_f32(gemm::kErfSplit)), big, small);
  erf_abs = vbslq_f32(vcgeq_f32(z, vdupq_n_f32(gemm::kErfMax)), vdupq_n_f32(1.0f), erf_abs);
  // erf(−z) = −erf(z): copy the sign bit of x.
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
  const float32x4_t erf = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(erf_abs), sign));
  const float32x4_t half_x = vmulq_n_f32(x, 0.5f);
  return vfmaq_f32(half_x, half_x, erf);
}

// The bf16 GEMMs' GELU (erf_poly.h: kGeluBf16; the scalar form gemm::gelu_for_bf16 gives the same bits).  vminnmq
// (IEEE minNum) returns the number for a NaN operand, as _mm512_min_ps and fmin do here: t = 1, and the last FMA
// keeps the NaN through a.
static inline float32x4_t gelu4_for_bf16(float32x4_t x) {
  const float32x4_t a = vabsq_f32(x);
  const float32x4_t t = vfmaq_f32(vdupq_n_f32(-1.0f), vminnmq_f32(a, vdupq_n_f32(gemm::kGeluBf16Max)),
                                  vdupq_n_f32(gemm::kGeluBf16Scale));
  return vfmaq_f32(vmulq_n_f32(x, 0.5f), a, horner(t, gemm::kGeluBf16, 13));
}

// exp(x) for x <= 0 (softmax after max subtraction), Cephes' method (exp_poly.h); x < gemm::kExpMin gives 0.
static inline float32x4_t exp4_nonpositive(float32x4_t x) {
  const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(gemm::kExpMin));
  x = vmaxq_f32(x, vdupq_n_f32(gemm::kExpMin));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, gemm::kLog2e));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(gemm::kLn2Hi));
  r = vfmsq_f32(r, n, vdupq_n_f32(gemm::kLn2Lo));
  const float32x4_t p = horner(r, gemm::kExpP, 6);
  const float32x4_t er = vaddq_f32(vfmaq_f32(r, vmulq_f32(r, r), p), vdupq_n_f32(1.0f));
  const int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t e = vmulq_f32(er, vreinterpretq_f32_s32(pow2n));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), tiny));
}

// exp(x) for x <= 0 rounded to bf16 next (exp_poly.h: kExp2Bf16P), exp16_for_bf16's operations (x86/avx512_math.h)
// at 4 lanes: 2^n applied as a multiply by the normal number 2^n (n >= −126 for x >= kExpMin, and the product is
// >= 2^-125.6, so exact: vscalefps's result).  x < kExpMin gives 0; a NaN stays NaN.
static inline float32x4_t exp4_for_bf16(float32x4_t x) {
  const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(gemm::kExpMin));
  const float32x4_t log2e = vdupq_n_f32(gemm::kLog2e);
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, log2e));
  const float32x4_t f = vfmaq_f32(vnegq_f32(n), x, log2e);  // x·log2e − n, one rounding
  const float32x4_t p = horner(f, gemm::kExp2Bf16P, 5);
  const int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t e = vmulq_f32(p, vreinterpretq_f32_s32(pow2n));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), tiny));
}

}  // namespace
}  // namespace arm
}  // namespace vitfast

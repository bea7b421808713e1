// AVX-512 building blocks shared by the AVX-512 files (gemm_avx512.cpp, vec_avx512.cpp, dwconv_avx512.cpp): the
// vectorised erf-GELU and exp, and `Avx512`, the 16-lane vector traits the width-generic bodies
// (dwconv_body.inc, vec_body.inc) are instantiated with.
//
// Include only after `#pragma GCC target("avx512f,...")` (or clang's attribute push); internal linkage
// throughout, for the reason given in avx2_math.h and gemm_isa.h.
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"

namespace vitfast {
namespace x86 {
namespace {

#define VITFAST_AVX512_INLINE static inline __attribute__((always_inline))

static inline __m512 horner16(__m512 x, const float* c, int n) {
  __m512 r = _mm512_set1_ps(c[n - 1]);
  for (int i = n - 2; i >= 0; --i) r = _mm512_fmadd_ps(r, x, _mm512_set1_ps(c[i]));
  return r;
}

// Exact-form GELU 0.5·x·(1 + erf(x/√2)): the same piecewise erf polynomials (erf_poly.h) and order of
// operations as gelu8 in avx2_math.h, with mask registers instead of blends.  Each polynomial is evaluated
// only when some lane needs it (most vectors of a ViT's hidden activations lie in one piece), which halves
// the epilogue's arithmetic; lanes get exactly what the blend of both would give.
static inline __m512 gelu16(__m512 x) {
  const __m512 sign_mask = _mm512_set1_ps(-0.0f);
  const __m512 z = _mm512_min_ps(_mm512_andnot_ps(sign_mask, _mm512_mul_ps(x, _mm512_set1_ps(gemm::kInvSqrt2))),
                                 _mm512_set1_ps(gemm::kErfMax));
  const __mmask16 is_big = _mm512_cmp_ps_mask(z, _mm512_set1_ps(gemm::kErfSplit), _CMP_GT_OQ);
  __m512 erf_abs = _mm512_setzero_ps();
  if (is_big != 0xFFFF) erf_abs = _mm512_mul_ps(z, horner16(_mm512_mul_ps(z, z), gemm::kErfP, 7));
  if (is_big != 0) {
    const __m512 big = _mm512_min_ps(horner16(_mm512_sub_ps(z, _mm512_set1_ps(gemm::kErfCenter)), gemm::kErfQ, 13),
                                     _mm512_set1_ps(1.0f));
    erf_abs = _mm512_mask_blend_ps(is_big, erf_abs, big);
    erf_abs = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_set1_ps(gemm::kErfMax), _CMP_GE_OQ), erf_abs,
                                   _mm512_set1_ps(1.0f));
  }
  const __m512 erf = _mm512_or_ps(erf_abs, _mm512_and_ps(x, sign_mask));  // erf(−z) = −erf(z)
  const __m512 half_x = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half_x, erf, half_x);
}

// The bf16 GEMMs' GELU (erf_poly.h: kGeluBf16; the scalar form gemm::gelu_for_bf16 gives the same bits): x/2 + a·G(t)
// with a = |x|, t = min(a, max)·scale − 1.  _mm512_min_ps returns its second operand for a NaN first: t = 1, and the
// last FMA keeps the NaN through a.
static inline __m512 gelu16_for_bf16(__m512 x) {
  const __m512 a = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
  const __m512 t = _mm512_fmadd_ps(_mm512_min_ps(a, _mm512_set1_ps(gemm::kGeluBf16Max)),
                                   _mm512_set1_ps(gemm::kGeluBf16Scale), _mm512_set1_ps(-1.0f));
  return _mm512_fmadd_ps(a, horner16(t, gemm::kGeluBf16, 13), _mm512_mul_ps(x, _mm512_set1_ps(0.5f)));
}

// The last step of a GEMM tile row's per-row epilogue (the fp32 and int8 kernels' plain stores): + the addend row
// (addend_row: nullptr for none) under each panel's mask, then C's row; NP = 1 or 2 panels of 16 columns.
template <int NP>
static inline __attribute__((always_inline)) void add_row_and_store(__m512 v0, __m512 v1, const float* addend_row,
                                                                    const __mmask16* mask, float* ci) {
  if (addend_row != nullptr) {
    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(mask[0], addend_row));
    if (NP > 1) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(mask[1], addend_row + 16));
  }
  _mm512_mask_storeu_ps(ci, mask[0], v0);
  if (NP > 1) _mm512_mask_storeu_ps(ci + 16, mask[1], v1);
}

// fp32 -> bf16, 16 lanes, round to nearest even on the bit patterns (gemm16::to_bf16's portable rounding, not
// vcvtneps2bf16, which flushes denormals): the bf16 bits in each 32-bit lane's low half, a NaN kept quiet.
static inline __m512i round_bf16_16(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

// exp(x) for x <= 0 (softmax after max subtraction): the Cephes reduction of exp_poly.h, as exp8_nonpositive
// in avx2_math.h, with 2^n applied by vscalefps; x < kExpMin gives 0.
static inline __m512 exp16_nonpositive(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(gemm::kExpMin), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_set1_ps(gemm::kExpMin), x);  // NaN stays NaN: see exp8_nonpositive in avx2_math.h
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(gemm::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(gemm::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(gemm::kLn2Lo), r);
  const __m512 p = horner16(r, gemm::kExpP, 6);
  const __m512 er = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(__mmask16(~tiny), er, n);
}

// exp(x) for x <= 0 where the result is rounded to bf16 next (exp_poly.h: kExp2Bf16P); x < kExpMin gives 0, a NaN
// stays NaN (it passes through every step).  Never a denormal for x >= kExpMin (2^n · 2^f >= 2^-125.6).
static inline __m512 exp16_for_bf16(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(gemm::kExpMin), _CMP_LT_OQ);
  const __m512 log2e = _mm512_set1_ps(gemm::kLog2e);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // One rounding, spelled out: GCC may or may not contract a separate product and difference, and the scalar and
  // NEON forms (scalar_math.h, arm/neon_math.h) must give these bits.
  const __m512 f = _mm512_fmsub_ps(x, log2e, n);
  return _mm512_maskz_scalef_ps(__mmask16(~tiny), horner16(f, gemm::kExp2Bf16P, 5), n);
}

// The 16-lane vector traits of the width-generic bodies.  A tail (the last n % 16 columns of a row) is handled
// with an opmask: masked loads read zeros, masked stores and arithmetic leave the other lanes alone.
struct Avx512 {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  // dwconv_body.inc: 32 zmm registers hold the 9 taps of a 3 × 3 kernel beside the window.
  static constexpr bool kTapsInRegisters = true;

  VITFAST_AVX512_INLINE V zero() { return _mm512_setzero_ps(); }
  VITFAST_AVX512_INLINE V set1(float x) { return _mm512_set1_ps(x); }
  VITFAST_AVX512_INLINE V load(const float* p) { return _mm512_load_ps(p); }
  VITFAST_AVX512_INLINE V loadu(const float* p) { return _mm512_loadu_ps(p); }
  VITFAST_AVX512_INLINE void store(float* p, V v) { _mm512_store_ps(p, v); }
  VITFAST_AVX512_INLINE void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  VITFAST_AVX512_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  VITFAST_AVX512_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  VITFAST_AVX512_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  VITFAST_AVX512_INLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
  VITFAST_AVX512_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  VITFAST_AVX512_INLINE V exp_nonpositive(V x) { return exp16_nonpositive(x); }
  VITFAST_AVX512_INLINE V exp_for_bf16(V x) { return exp16_for_bf16(x); }
  VITFAST_AVX512_INLINE float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  VITFAST_AVX512_INLINE float reduce_max(V v) { return _mm512_reduce_max_ps(v); }

  VITFAST_AVX512_INLINE Mask tail_mask(int n) { return __mmask16((1u << n) - 1u); }
  VITFAST_AVX512_INLINE V maskload(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  VITFAST_AVX512_INLINE void maskstore(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  VITFAST_AVX512_INLINE V max_tail(V acc, V t, Mask m) { return _mm512_mask_max_ps(acc, m, acc, t); }
  VITFAST_AVX512_INLINE V add_tail(V acc, V t, Mask m) { return _mm512_mask_add_ps(acc, m, acc, t); }
};

#undef VITFAST_AVX512_INLINE

}  // namespace
// In-register transpose of 16 rows of 16 32-bit elements: on return r[c] holds element c of every input row (row i
// in element i).  Unpacks within 128-bit lanes (rows 4g..4g+3, columns 4L + j), then a 4 × 4 transpose of the
// 128-bit lanes: 64 shuffles for 256 elements.
static inline __attribute__((always_inline)) void transpose16_epi32(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  __m512i u[4][4];  // u[g][j], lane L: column 4L + j of rows 4g..4g+3
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0x44), b = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0xEE);
    const __m512i c = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0x44), d = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(a, c, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
  }
}

}  // namespace x86
}  // namespace vitfast

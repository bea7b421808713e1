// AVX2/FMA building blocks shared by the AVX2 files (gemm_avx2.cpp, gemm_int8_avx2.cpp, vec_avx2.cpp, dwconv_avx2.cpp):
// the lane mask of a partial vector, the vectorised erf-GELU and exp, int8 codes to bytes, and `Avx2`, the 8-lane vector traits the
// width-generic bodies (dwconv_body.inc, vec_body.inc) are instantiated with.
//
// Include only after `#pragma GCC target("avx2,fma")` (or clang's attribute push): everything here is compiled
// for AVX2.  Everything has internal linkage (anonymous namespace), so each including file gets its own copy
// and no AVX2 code can be picked by the linker for a caller on a CPU without AVX2 (see gemm_isa.h).
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"

namespace vitfast {
namespace x86 {
namespace {

#define VITFAST_AVX2_INLINE static inline __attribute__((always_inline))

// Lane mask for the first n (0..8) lanes of a ymm, for partial tails.
static inline __m256i lane_mask(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

static inline __m256 horner(__m256 x, const float* c, int n) {
  __m256 r = _mm256_set1_ps(c[n - 1]);
  for (int i = n - 2; i >= 0; --i) r = _mm256_fmadd_ps(r, x, _mm256_set1_ps(c[i]));
  return r;
}

// Exact-form GELU: 0.5·x·(1 + erf(x/√2)), erf from the piecewise polynomials of erf_poly.h.
static inline __m256 gelu8(__m256 x) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 z = _mm256_min_ps(_mm256_andnot_ps(sign_mask, _mm256_mul_ps(x, _mm256_set1_ps(gemm::kInvSqrt2))),
                                 _mm256_set1_ps(gemm::kErfMax));
  const __m256 small = _mm256_mul_ps(z, horner(_mm256_mul_ps(z, z), gemm::kErfP, 7));
  const __m256 big = _mm256_min_ps(horner(_mm256_sub_ps(z, _mm256_set1_ps(gemm::kErfCenter)), gemm::kErfQ, 13),
                                   _mm256_set1_ps(1.0f));
  __m256 erf_abs = _mm256_blendv_ps(small, big, _mm256_cmp_ps(z, _mm256_set1_ps(gemm::kErfSplit), _CMP_GT_OQ));
  erf_abs = _mm256_blendv_ps(erf_abs, _mm256_set1_ps(1.0f), _mm256_cmp_ps(z, _mm256_set1_ps(gemm::kErfMax), _CMP_GE_OQ));
  const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(x, sign_mask));  // erf(−z) = −erf(z)
  const __m256 half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(half_x, erf, half_x);
}

// exp(x) for x <= 0 (softmax after max subtraction), Cephes' method (exp_poly.h); x < kExpMin gives 0.
static inline __m256 exp8_nonpositive(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(gemm::kExpMin), _CMP_LT_OQ);
  // Bound first, x second: maxps returns its second operand when either is NaN, so a NaN score stays NaN
  // (and so does its row, as in torch) instead of becoming exp(gemm::kExpMin) ≈ 0, a silently dropped key.
  x = _mm256_max_ps(_mm256_set1_ps(gemm::kExpMin), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(gemm::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(gemm::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(gemm::kLn2Lo), r);
  const __m256 p = horner(r, gemm::kExpP, 6);
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r), _mm256_set1_ps(1.0f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(er, _mm256_castsi256_ps(pow2n)));
}

// exp(x) for x <= 0 where the result is rounded to bf16 or quantized to int8 next (exp_poly.h: kExp2Bf16P), the
// bits of exp16_for_bf16 and of the scalar gemm::exp_for_bf16: 2^n applied through the exponent field (exact: n >=
// −126 for x >= kExpMin), x < kExpMin gives 0, a NaN stays NaN (p is NaN).
static inline __m256 exp8_for_bf16(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(gemm::kExpMin), _CMP_LT_OQ);
  const __m256 log2e = _mm256_set1_ps(gemm::kLog2e);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_fmsub_ps(x, log2e, n);  // one rounding, as the other forms
  const __m256 p = horner(f, gemm::kExp2Bf16P, 5);
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n)));
}

// Horizontal sum and maximum of the 8 lanes.
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// int8 codes held in s32 lanes (|c| <= 127), as bytes in lane order.  Eight: the low byte of each lane gathered by
// one vpshufb per 128-bit half, the halves joined (3 shuffles).  Thirty-two: two vpackssdw, one vpacksswb (nothing
// saturates at |c| <= 127) and one vpermd undoing the packs' per-half interleave (4 shuffles for 4× the codes; the
// shuffle port, not the arithmetic, sets the pace of a quantization pass).
static inline __m128i low_bytes8(__m256i i) {
  const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_shuffle_epi8(i, gather);
  return _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

static inline __m256i low_bytes32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Sum of the 8 int32 lanes.
static inline int32_t hsum8_epi32(__m256i v) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

// The 8-lane vector traits of the width-generic bodies.  A tail (the last n % 8 columns of a row) is handled
// with a lane mask in an integer vector and vmaskmovps loads/stores.
struct Avx2 {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8;
  // dwconv_body.inc: 16 ymm registers cannot hold the K² taps beside the window, so the taps go to L1.
  static constexpr bool kTapsInRegisters = false;

  VITFAST_AVX2_INLINE V zero() { return _mm256_setzero_ps(); }
  VITFAST_AVX2_INLINE V set1(float x) { return _mm256_set1_ps(x); }
  VITFAST_AVX2_INLINE V load(const float* p) { return _mm256_load_ps(p); }
  VITFAST_AVX2_INLINE V loadu(const float* p) { return _mm256_loadu_ps(p); }
  VITFAST_AVX2_INLINE void store(float* p, V v) { _mm256_store_ps(p, v); }
  VITFAST_AVX2_INLINE void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  VITFAST_AVX2_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  VITFAST_AVX2_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  VITFAST_AVX2_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  VITFAST_AVX2_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
  VITFAST_AVX2_INLINE V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  VITFAST_AVX2_INLINE V exp_nonpositive(V x) { return exp8_nonpositive(x); }
  VITFAST_AVX2_INLINE V exp_for_bf16(V x) { return exp8_for_bf16(x); }
  VITFAST_AVX2_INLINE float reduce_add(V v) { return hsum8(v); }
  VITFAST_AVX2_INLINE float reduce_max(V v) { return hmax8(v); }

  VITFAST_AVX2_INLINE Mask tail_mask(int n) { return lane_mask(n); }
  VITFAST_AVX2_INLINE V maskload(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  VITFAST_AVX2_INLINE void maskstore(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
  // max(acc, t) over the lanes of m; acc elsewhere (a masked-off lane enters as -inf).
  VITFAST_AVX2_INLINE V max_tail(V acc, V t, Mask m) {
    return _mm256_max_ps(acc, _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), t, _mm256_castsi256_ps(m)));
  }
  // acc + t over the lanes of m; acc elsewhere.
  VITFAST_AVX2_INLINE V add_tail(V acc, V t, Mask m) { return _mm256_add_ps(acc, _mm256_and_ps(t, _mm256_castsi256_ps(m))); }
};

#undef VITFAST_AVX2_INLINE

}  // namespace
}  // namespace x86
}  // namespace vitfast

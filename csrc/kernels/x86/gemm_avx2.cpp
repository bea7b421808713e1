// AVX2/FMA GEMM micro-kernels (6 × 16, twelve ymm accumulators) and the vectorised erf-GELU.
//
// The ISA is enabled for this file only (setup.py and CMake pass no -mavx2, never -march=native); the
// function is chosen at run time by cpu_features (cpuid + XGETBV).  Only immintrin.h and our own plain
// headers are included: an STL inline template instantiated here would carry AVX2 code under a name that
// other translation units share (ODR), and could be picked by the linker for a non-AVX2 caller.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"
#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {
namespace {

// Lane mask for the first n (0..8) lanes of a ymm, for the partial tail panel.
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
  const __m256 z = _mm256_min_ps(_mm256_andnot_ps(sign_mask, _mm256_mul_ps(x, _mm256_set1_ps(kInvSqrt2))),
                                 _mm256_set1_ps(kErfMax));
  const __m256 small = _mm256_mul_ps(z, horner(_mm256_mul_ps(z, z), kErfP, 7));
  const __m256 big = _mm256_min_ps(horner(_mm256_sub_ps(z, _mm256_set1_ps(kErfCenter)), kErfQ, 13),
                                   _mm256_set1_ps(1.0f));
  __m256 erf_abs = _mm256_blendv_ps(small, big, _mm256_cmp_ps(z, _mm256_set1_ps(kErfSplit), _CMP_GT_OQ));
  erf_abs = _mm256_blendv_ps(erf_abs, _mm256_set1_ps(1.0f), _mm256_cmp_ps(z, _mm256_set1_ps(kErfMax), _CMP_GE_OQ));
  const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(x, sign_mask));  // erf(−z) = −erf(z)
  const __m256 half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(half_x, erf, half_x);
}

// exp(x) for x <= 0 (softmax after max subtraction), Cephes' method (exp_poly.h); x < kExpMin gives 0.
static inline __m256 exp8_nonpositive(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  // Bound first, x second: maxps returns its second operand when either is NaN, so a NaN score stays NaN
  // (and so does its row, as in torch) instead of becoming exp(kExpMin) ≈ 0, a silently dropped key.
  x = _mm256_max_ps(_mm256_set1_ps(kExpMin), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  const __m256 p = horner(r, kExpP, 6);
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r), _mm256_set1_ps(1.0f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(er, _mm256_castsi256_ps(pow2n)));
}

// Distance of the software prefetch of the packed B panel, in k steps (= 64-byte lines); tuned 8..128.
constexpr int64_t kPrefetchLines = 64;
// How many k steps before the epilogue the tile's C and addend lines are prefetched (as in the AVX-512 path):
// ~800 cycles of FMAs, enough to hide an L3 or DRAM miss.
constexpr int64_t kCPrefetchSteps = 128;

// Prefetch of the lines a tile's epilogue touches: the 16 floats of each C row and of each addend row (two
// addresses per row: one line when 64-byte aligned, two otherwise).
template <int MR>
static inline __attribute__((always_inline)) void prefetch_tile_rows(const float* c, int64_t ldc,
                                                                     const TileEpilogue& e) {
  for (int r = 0; r < MR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNr - 1), _MM_HINT_T0);
    if (e.addend != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(e.addend + r * e.ld_addend), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(e.addend + r * e.ld_addend + kNr - 1), _MM_HINT_T0);
    }
  }
}

struct Avx2 {
  // One kMr×kNr tile: C[MR × 16] (=|+=) epilogue(A[MR × k] · Bpanel[k × 16]).
  template <int MR>
  static inline __attribute__((always_inline)) void tile(int64_t k, const float* a, int64_t lda, const float* b,
                                                         float* c, int64_t ldc, const TileEpilogue& e) {
    // Twelve named accumulators (not arrays: GCC then keeps all of them in ymm registers; rows >= MR are
    // dead code).  Rows 0-2 are addressed from a0, rows 3-5 from a3, with lda as the scaled index, so the
    // loop needs only a0, a3, lda, b and the counter in general registers.
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float* a0 = a;
    const float* a3 = MR > 3 ? a + 3 * lda : a;  // never form a pointer past a short tile's rows
    // The hot loop: per k two B loads (one 64-byte line of the packed panel), MR broadcasts, 2·MR FMAs.
#define VITFAST_AVX2_ROW(row, ptr, off)                    \
  if (MR > row) {                                          \
    const __m256 t = _mm256_broadcast_ss(ptr + off);       \
    c##row##0 = _mm256_fmadd_ps(t, b0, c##row##0);         \
    c##row##1 = _mm256_fmadd_ps(t, b1, c##row##1);         \
  }
    // Two ranges of k, with the epilogue's C and addend lines prefetched in between.  A row tile reads one
    // 64-byte line from each of 6 rows of the residual (3 KiB apart at DeiT-B), which neither stays in L2 between
    // panels nor is caught by the hardware prefetcher: without this, the residual GEMM of channel_idle_ffn ran 5%
    // slower than the same GEMM without it.  Interleaved in one process on Zen 3 (DeiT-B, θ .75, batch 1):
    // the op 1.02-1.04× faster, its residual GEMM 1.05×, its accumulate GEMM 1.04×, same bits; attention
    // (P·V, K = N = 197 or 577) unchanged.  A short K (the K = 64 score GEMM) has nothing to hide it behind and
    // skips it.  Whether C is read (accumulate) or only written made no difference: always prefetched.
    const int64_t k_tail = k > kCPrefetchSteps ? k - kCPrefetchSteps : 0;
    for (int64_t p_begin = 0, p_end = k_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = k) {
      if (pass == 1 && k_tail > 0) prefetch_tile_rows<MR>(c, ldc, e);
#pragma GCC unroll 4
      for (int64_t p = p_begin; p < p_end; ++p) {
        const __m256 b0 = _mm256_load_ps(b);
        const __m256 b1 = _mm256_load_ps(b + 8);
        // B arrives from L3 on the first row tile of each panel; the hardware prefetcher alone left ~5% on
        // the table (measured on Zen 4 at DeiT-B shapes), so ask for the line kPrefetchLines k-steps ahead.
        // For later row tiles the line is already in L1/L2 and the prefetch is a spare load-port slot.
        // (Prefetching past the end of the buffer is harmless: prefetches never fault.)
        _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * kNr), _MM_HINT_T0);
        b += kNr;
        VITFAST_AVX2_ROW(0, a0, 0)
        VITFAST_AVX2_ROW(1, a0, lda)
        VITFAST_AVX2_ROW(2, a0, 2 * lda)
        VITFAST_AVX2_ROW(3, a3, 0)
        VITFAST_AVX2_ROW(4, a3, lda)
        VITFAST_AVX2_ROW(5, a3, 2 * lda)
        ++a0;
        ++a3;
      }
    }
#undef VITFAST_AVX2_ROW
    // Back to arrays for the epilogue loop (`r % MR` only keeps the dead branches' indices in range).
    __m256 acc0[MR], acc1[MR];
    acc0[0] = c00, acc1[0] = c01;
    if (MR > 1) acc0[1 % MR] = c10, acc1[1 % MR] = c11;
    if (MR > 2) acc0[2 % MR] = c20, acc1[2 % MR] = c21;
    if (MR > 3) acc0[3 % MR] = c30, acc1[3 % MR] = c31;
    if (MR > 4) acc0[4 % MR] = c40, acc1[4 % MR] = c41;
    if (MR > 5) acc0[5 % MR] = c50, acc1[5 % MR] = c51;

    if (e.n_store == kNr) {
      for (int i = 0; i < MR; ++i) {
        float* ci = c + i * ldc;
        if (e.load_c) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(ci));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(ci + 8));
        }
        if (e.bias != nullptr) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(e.bias));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(e.bias + 8));
        }
        if (e.gelu) {
          acc0[i] = gelu8(acc0[i]);
          acc1[i] = gelu8(acc1[i]);
        }
        if (e.addend != nullptr) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(e.addend + i * e.ld_addend));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(e.addend + i * e.ld_addend + 8));
        }
        _mm256_storeu_ps(ci, acc0[i]);
        _mm256_storeu_ps(ci + 8, acc1[i]);
      }
    } else {
      // Tail panel of an unpadded C: masked loads/stores so no byte past column n is touched.
      const __m256i m0 = lane_mask(e.n_store);
      const __m256i m1 = lane_mask(e.n_store - 8);
      for (int i = 0; i < MR; ++i) {
        float* ci = c + i * ldc;
        if (e.load_c) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_maskload_ps(ci, m0));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_maskload_ps(ci + 8, m1));
        }
        if (e.bias != nullptr) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(e.bias));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(e.bias + 8));
        }
        if (e.gelu) {
          acc0[i] = gelu8(acc0[i]);
          acc1[i] = gelu8(acc1[i]);
        }
        if (e.addend != nullptr) {
          acc0[i] = _mm256_add_ps(acc0[i], _mm256_maskload_ps(e.addend + i * e.ld_addend, m0));
          acc1[i] = _mm256_add_ps(acc1[i], _mm256_maskload_ps(e.addend + i * e.ld_addend + 8, m1));
        }
        _mm256_maskstore_ps(ci, m0, acc0[i]);
        _mm256_maskstore_ps(ci + 8, m1, acc1[i]);
      }
    }
  }
};

}  // namespace

void gemm_block_avx2(const GemmBlockArgs& args) { run_gemm_block<Avx2>(args); }

void gelu_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {  // one masked tail, same arithmetic as the body
    const __m256i m = lane_mask(int(n - i));
    _mm256_maskstore_ps(x + i, m, gelu8(_mm256_maskload_ps(x + i, m)));
  }
}

void softmax_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i tail = lane_mask(int(n % 8));
  const int64_t body = n - n % 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    // Pass 1: scale, and the row maximum (masked lanes of the tail read as -inf).
    __m256 vmax = _mm256_set1_ps(-__builtin_inff());
    int64_t j = 0;
    for (; j < body; j += 8) {
      const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
      _mm256_storeu_ps(row + j, t);
      vmax = _mm256_max_ps(vmax, t);
    }
    if (j < n) {
      const __m256 t = _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), vscale);
      _mm256_maskstore_ps(row + j, tail, t);
      vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), t, _mm256_castsi256_ps(tail)));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(m4));
    // Pass 2: exp(t - max) and the sum.
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < body; j += 8) {
      const __m256 e = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), mx));
      _mm256_storeu_ps(row + j, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    if (j < n) {
      const __m256 e = _mm256_and_ps(exp8_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(row + j, tail), mx)),
                                     _mm256_castsi256_ps(tail));
      _mm256_maskstore_ps(row + j, tail, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(vsum), _mm256_extractf128_ps(vsum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    // Pass 3: normalise.
    const __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(s4));
    for (j = 0; j < body; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
    if (j < n) _mm256_maskstore_ps(row + j, tail, _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), inv));
  }
}

// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum.
void softmax_exp_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i tail = lane_mask(int(n % 8));
  const int64_t body = n - n % 8;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    __m256 vmax = _mm256_set1_ps(row_max[r]);
    int64_t j = 0;
    // The scaled scores are stored back and the exp pass reads them, so exp(t − m) has t rounded exactly as in
    // the max: the max's own term is exactly 0.  fma(s, scale, −m) was up to half an ulp off (~1e22 for scores
    // near 1e29), exp of which made the row NaN where torch stays finite; a separate mul/sub GCC contracts again.
    for (; j < body; j += 8) {
      const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
      _mm256_storeu_ps(row + j, t);
      vmax = _mm256_max_ps(t, vmax);  // t first: maxps returns its second operand for a NaN t (the max skips it)
    }
    if (j < n) {
      const __m256 t = _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), vscale);
      _mm256_maskstore_ps(row + j, tail, t);
      vmax = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), t, _mm256_castsi256_ps(tail)),
                           vmax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float mx = _mm_cvtss_f32(m4);
    const __m256 vmx = _mm256_set1_ps(mx == -__builtin_inff() ? 0.0f : mx);  // all -inf so far: see avx512
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < body; j += 8) {
      const __m256 e = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), vmx));
      _mm256_storeu_ps(row + j, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    if (j < n) {
      const __m256 e = _mm256_and_ps(exp8_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(row + j, tail), vmx)),
                                     _mm256_castsi256_ps(tail));
      _mm256_maskstore_ps(row + j, tail, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(vsum), _mm256_extractf128_ps(vsum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    row_max[r] = mx;
    row_sum[r] = _mm_cvtss_f32(s4);
  }
}

namespace {

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

// Same two passes as layer_norm_rows_avx512 (gemm_isa.h), 8 lanes, one row at a time, masked tails.
void layer_norm_rows_avx2(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                          float eps) {
  const __m256i tail = lane_mask(int(c % 8));
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
    // Plain loads and stores in the body, masked ones for the tail only: a masked store (vmaskmovps) is slow on
    // AMD Zen (microcoded, several cycles each), and masking every vector of the row made this pass take ~75%
    // of the op (DeiT-Ti rows on Zen 3: 197 × 192 took ~50 µs).  Same arithmetic, so the same bits.
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

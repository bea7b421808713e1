// AVX-512 GEMM micro-kernels (14 × 32: two packed 16-column panels, 28 zmm accumulators) and their driver.
//
// Why a second x86 path when Zen 4 runs a 512-bit FMA as two 256-bit halves (no more FLOPs per cycle than
// AVX2): the AVX2 6 × 16 tile spends 8 loads (2 B lines + 6 broadcasts) and ~23 instructions per 12 FMAs,
// and its 16-column B panel (K × 64 B) is re-streamed from L2 for every 6 rows.  Here one k step issues 2 B
// loads + 14 broadcasts for 28 zmm FMAs (= 56 ymm FMAs): ~4× fewer loads and ~3× fewer instructions per
// FLOP, and each B line is reused by 14 rows instead of 6.  The packed layout is unchanged (panels of
// kNr = 16 columns, one 64-byte line per k = one zmm): the tile simply reads two neighbouring panels, so one
// packed weight still serves every ISA path.
//
// The ISA is enabled for this file only (no -mavx512f anywhere; never -march=native); cpu_features picks
// this path at run time (cpuid AVX512F/DQ/BW/VL + XGETBV: the OS saves opmask and ZMM state).  Same include
// discipline as gemm_avx2.cpp: only immintrin.h and our plain headers (no STL inline code under this target).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

// GCC 12 reports the `_mm512_undefined_ps()` pass-through inside its own _mm512_min_ps as maybe-uninitialized
// (a false positive in avx512fintrin.h, not in this file).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/erf_poly.h"
#include "kernels/exp_poly.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {
namespace {

// Rows of the register tile: 14 rows × 2 panels = 28 accumulators + 2 B vectors + 1 broadcast = 31 of the
// 32 zmm registers.
constexpr int kMr512 = 14;
// Distance of the software prefetch of each packed B panel, in k steps (= 64-byte lines), as in the AVX2 path.
constexpr int64_t kPrefetchLines = 64;
// k steps before the end of a tile's K loop at which its C rows (and addend rows) are prefetched.  While the
// tile ran, ~K × 128 B of B panels streamed through the 32 KiB L1, so the lines the epilogue reads and
// writes are gone; fetched ~128 × 28 cycles ahead they are back in time.  Measured on Zen 4, channel_idle_ffn
// at DeiT-B (three 197 × 768 × 768 GEMMs, one thread, 8 alternations of two builds): 6.46 -> 6.35 ms median;
// 16 steps ahead was too late (6.27 vs 6.21 for 128 in one pair of runs).
constexpr int64_t kCPrefetchSteps = 128;

struct Tile512Epilogue {
  bool load_c;           // acc += C (a later K block, or accumulate mode)
  const float* bias;     // 32 values (zero padded), or nullptr (only in the last K block)
  bool gelu;             // only in the last K block
  const float* addend;   // at this tile's (row 0, col 0), or nullptr (only in the last K block)
  int64_t ld_addend;
  __mmask16 mask[2];     // columns of each panel that may be loaded/stored (all 16 except on a tail panel)
};

static inline __m512 horner16(__m512 x, const float* c, int n) {
  __m512 r = _mm512_set1_ps(c[n - 1]);
  for (int i = n - 2; i >= 0; --i) r = _mm512_fmadd_ps(r, x, _mm512_set1_ps(c[i]));
  return r;
}

// Exact-form GELU 0.5·x·(1 + erf(x/√2)): the same piecewise erf polynomials (erf_poly.h) and order of
// operations as gelu8 in gemm_avx2.cpp, with mask registers instead of blends.  Each polynomial is evaluated
// only when some lane needs it (most vectors of a ViT's hidden activations lie in one piece), which halves
// the epilogue's arithmetic; lanes get exactly what the blend of both would give.
static inline __m512 gelu16(__m512 x) {
  const __m512 sign_mask = _mm512_set1_ps(-0.0f);
  const __m512 z = _mm512_min_ps(_mm512_andnot_ps(sign_mask, _mm512_mul_ps(x, _mm512_set1_ps(kInvSqrt2))),
                                 _mm512_set1_ps(kErfMax));
  const __mmask16 is_big = _mm512_cmp_ps_mask(z, _mm512_set1_ps(kErfSplit), _CMP_GT_OQ);
  __m512 erf_abs = _mm512_setzero_ps();
  if (is_big != 0xFFFF) erf_abs = _mm512_mul_ps(z, horner16(_mm512_mul_ps(z, z), kErfP, 7));
  if (is_big != 0) {
    const __m512 big = _mm512_min_ps(horner16(_mm512_sub_ps(z, _mm512_set1_ps(kErfCenter)), kErfQ, 13),
                                     _mm512_set1_ps(1.0f));
    erf_abs = _mm512_mask_blend_ps(is_big, erf_abs, big);
    erf_abs = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_set1_ps(kErfMax), _CMP_GE_OQ), erf_abs,
                                   _mm512_set1_ps(1.0f));
  }
  const __m512 erf = _mm512_or_ps(erf_abs, _mm512_and_ps(x, sign_mask));  // erf(−z) = −erf(z)
  const __m512 half_x = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half_x, erf, half_x);
}

static inline __m512 epilogue16(__m512 v, const Tile512Epilogue& e, const float* ci, int q, int64_t row) {
  const __mmask16 m = e.mask[q];
  if (e.load_c) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, ci + 16 * q));
  if (e.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(e.bias + 16 * q));
  if (e.gelu) v = gelu16(v);
  if (e.addend != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, e.addend + row * e.ld_addend + 16 * q));
  return v;
}

// Prefetch of the lines a tile's epilogue touches: NP × 64 B of each C row, and of each addend row.
template <int MR, int NP>
static inline __attribute__((always_inline)) void prefetch_tile_rows(const float* c, int64_t ldc,
                                                                     const Tile512Epilogue& e) {
  for (int r = 0; r < MR; ++r) {
    for (int q = 0; q < NP; ++q) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16 * q), _MM_HINT_T0);
      if (e.addend != nullptr)
        _mm_prefetch(reinterpret_cast<const char*>(e.addend + r * e.ld_addend + 16 * q), _MM_HINT_T0);
    }
  }
}

// One tile: C[MR × 16·NP] (=|+=) epilogue(A[MR × k] · B[k × 16·NP]), NP = 1 or 2 panels (the second one
// `b_stride` floats after the first).
template <int MR, int NP>
static inline __attribute__((always_inline)) void tile(int64_t k, const float* a, int64_t lda, const float* b,
                                                       int64_t b_stride, float* c, int64_t ldc,
                                                       const Tile512Epilogue& e) {
  // Named accumulators (GCC keeps them in registers; see gemm_avx2.cpp).  Rows are addressed from five base
  // pointers (rows 3j .. 3j+2 from a_{3j} with lda as the scaled index) so the loop needs few GPRs.
  __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0, c2_1 = c0_0;
  __m512 c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
  __m512 c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0, c8_1 = c0_0;
  __m512 c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0, c11_1 = c0_0;
  __m512 c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
  const float* a0 = a;
  const float* a3 = MR > 3 ? a + 3 * lda : a;  // never form a pointer past a short tile's rows
  const float* a6 = MR > 6 ? a + 6 * lda : a;
  const float* a9 = MR > 9 ? a + 9 * lda : a;
  const float* a12 = MR > 12 ? a + 12 * lda : a;
  const float* b1p = b + (NP > 1 ? b_stride : 0);
#define VITFAST_AVX512_ROW(row, ptr, off)            \
  if (MR > row) {                                    \
    const __m512 t = _mm512_set1_ps(ptr[off]);       \
    c##row##_0 = _mm512_fmadd_ps(t, b0, c##row##_0); \
    if (NP > 1) c##row##_1 = _mm512_fmadd_ps(t, b1, c##row##_1); \
  }
  // Two ranges of k: [0, k_tail) and [k_tail, k), with the C tile's lines prefetched in between.  A short K
  // (attention's K = 64 score GEMM) has not evicted them and skips it: at 197 × 64 × 197 the prefetches cost
  // 3% (100.0 vs 102.9 GFLOP/s).
  const int64_t k_tail = k > kCPrefetchSteps ? k - kCPrefetchSteps : 0;
  for (int64_t p_begin = 0, p_end = k_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = k) {
    if (pass == 1 && k_tail > 0) prefetch_tile_rows<MR, NP>(c, ldc, e);
#pragma GCC unroll 2
    for (int64_t p = p_begin; p < p_end; ++p) {
      const __m512 b0 = _mm512_load_ps(b);
      const __m512 b1 = NP > 1 ? _mm512_load_ps(b1p) : b0;
      // The first row tile of a panel pair reads B from L3: ask for the lines ahead (see gemm_avx2.cpp).
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * kNr), _MM_HINT_T0);
      if (NP > 1) _mm_prefetch(reinterpret_cast<const char*>(b1p + kPrefetchLines * kNr), _MM_HINT_T0);
      b += kNr;
      b1p += kNr;
      VITFAST_AVX512_ROW(0, a0, 0)
      VITFAST_AVX512_ROW(1, a0, lda)
      VITFAST_AVX512_ROW(2, a0, 2 * lda)
      VITFAST_AVX512_ROW(3, a3, 0)
      VITFAST_AVX512_ROW(4, a3, lda)
      VITFAST_AVX512_ROW(5, a3, 2 * lda)
      VITFAST_AVX512_ROW(6, a6, 0)
      VITFAST_AVX512_ROW(7, a6, lda)
      VITFAST_AVX512_ROW(8, a6, 2 * lda)
      VITFAST_AVX512_ROW(9, a9, 0)
      VITFAST_AVX512_ROW(10, a9, lda)
      VITFAST_AVX512_ROW(11, a9, 2 * lda)
      VITFAST_AVX512_ROW(12, a12, 0)
      VITFAST_AVX512_ROW(13, a12, lda)
      ++a0;
      ++a3;
      ++a6;
      ++a9;
      ++a12;
    }
  }
#undef VITFAST_AVX512_ROW
  // Epilogue row by row (C is written once per tile; masked loads/stores never touch a column past n).
#define VITFAST_AVX512_STORE(row)                                                                   \
  if (MR > row) {                                                                                   \
    float* ci = c + row * ldc;                                                                      \
    _mm512_mask_storeu_ps(ci, e.mask[0], epilogue16(c##row##_0, e, ci, 0, row));                    \
    if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], epilogue16(c##row##_1, e, ci, 1, row));   \
  }
  VITFAST_AVX512_STORE(0)
  VITFAST_AVX512_STORE(1)
  VITFAST_AVX512_STORE(2)
  VITFAST_AVX512_STORE(3)
  VITFAST_AVX512_STORE(4)
  VITFAST_AVX512_STORE(5)
  VITFAST_AVX512_STORE(6)
  VITFAST_AVX512_STORE(7)
  VITFAST_AVX512_STORE(8)
  VITFAST_AVX512_STORE(9)
  VITFAST_AVX512_STORE(10)
  VITFAST_AVX512_STORE(11)
  VITFAST_AVX512_STORE(12)
  VITFAST_AVX512_STORE(13)
#undef VITFAST_AVX512_STORE
}

template <int NP>
void row_tiles(const GemmBlockArgs& g, int64_t k0, int64_t k1, const float* bp, int64_t col,
               const Tile512Epilogue& base, bool last) {
  Tile512Epilogue e = base;
  // Balanced row tiles: 197 rows become 2 × 14 + 13 × 13, not 14 × 14 + 1 (a 1-row tile has only two
  // accumulator chains, so it runs at the FMA latency, not its throughput).
  const int64_t tiles = (g.m + kMr512 - 1) / kMr512;
  const int64_t rows_small = tiles > 0 ? g.m / tiles : 0, n_big = tiles > 0 ? g.m % tiles : 0;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int64_t rows = rows_small + (t < n_big ? 1 : 0);
    const float* a = g.a + i * g.lda + k0;
    float* c = g.c + i * g.ldc + col;
    e.addend = (last && g.addend != nullptr) ? g.addend + i * g.ld_addend + col : nullptr;
    const int64_t kk = k1 - k0, bs = g.b_panel_stride;
    i += rows;
    switch (rows) {
      case 14: tile<14, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 13: tile<13, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 12: tile<12, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 11: tile<11, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 10: tile<10, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 9: tile<9, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 8: tile<8, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 7: tile<7, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 6: tile<6, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 5: tile<5, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 4: tile<4, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 3: tile<3, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 2: tile<2, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      default: tile<1, NP>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
    }
  }
}

// exp(x) for x <= 0 (softmax after max subtraction): the Cephes reduction of exp_poly.h, as exp8_nonpositive
// in gemm_avx2.cpp, with 2^n applied by vscalefps; x < kExpMin gives 0.
static inline __m512 exp16_nonpositive(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_set1_ps(kExpMin), x);  // NaN stays NaN: see exp8_nonpositive in gemm_avx2.cpp
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  const __m512 p = horner16(r, kExpP, 6);
  const __m512 er = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(__mmask16(~tiny), er, n);
}

}  // namespace

// Same three passes as softmax_rows_avx2 (scale + max, exp + sum, normalise), 16 lanes and masked tails.
void softmax_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __mmask16 tail = __mmask16((1u << (n % 16)) - 1u);
  const int64_t body = n - n % 16;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    __m512 vmax = _mm512_set1_ps(-__builtin_inff());
    int64_t j = 0;
    for (; j < body; j += 16) {
      const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(row + j), vscale);
      _mm512_storeu_ps(row + j, t);
      vmax = _mm512_max_ps(vmax, t);
    }
    if (j < n) {
      const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + j), vscale);
      _mm512_mask_storeu_ps(row + j, tail, t);
      vmax = _mm512_mask_max_ps(vmax, tail, vmax, t);
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (j = 0; j < body; j += 16) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx));
      _mm512_storeu_ps(row + j, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    if (j < n) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), mx));
      _mm512_mask_storeu_ps(row + j, tail, e);
      vsum = _mm512_mask_add_ps(vsum, tail, vsum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (j = 0; j < body; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), inv));
    if (j < n) _mm512_mask_storeu_ps(row + j, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + j), inv));
  }
}

namespace {

// R rows of softmax_exp_rows at once, their passes interleaved.  One row alone is a chain of latencies: its
// maximum must be reduced across lanes before its first exp can start, and its sum at the end; at ViT widths
// (13 vectors per row at N = 197) those reductions and the exp's dependency chain, not the FP pipes, set the
// pace.  Two rows side by side give the out-of-order core two independent chains to overlap.
template <int R>
static inline __attribute__((always_inline)) void softmax_exp_row_group(float* s, int64_t n, int64_t ld,
                                                                         __m512 vscale, float* row_max,
                                                                         float* row_sum) {
  const __mmask16 tail = __mmask16((1u << (n % 16)) - 1u);
  const int64_t body = n - n % 16;
  // Two running maxima per row: one max chain per 16 columns would run at the max latency.
  __m512 vmax0[R], vmax1[R];
  for (int r = 0; r < R; ++r) vmax0[r] = vmax1[r] = _mm512_set1_ps(row_max[r]);
  int64_t j = 0;
  // The scaled scores are stored back in the max pass and the exp pass reads them: exp(t − m) with t rounded
  // exactly as in the max, so the max's own term is exactly 0.  An fma(s, scale, −m) (the exact product) is up to
  // half an ulp off the rounded max, ~1e22 for scores near 1e29: exp of it was 0 or inf for the max itself and
  // the row turned NaN where torch stays finite.  (A separate mul and sub is no cure: GCC contracts them.)
  for (; j + 32 <= body; j += 32) {
    for (int r = 0; r < R; ++r) {
      float* row = s + r * ld;
      const __m512 t0 = _mm512_mul_ps(_mm512_loadu_ps(row + j), vscale);
      const __m512 t1 = _mm512_mul_ps(_mm512_loadu_ps(row + j + 16), vscale);
      _mm512_storeu_ps(row + j, t0);
      _mm512_storeu_ps(row + j + 16, t1);
      vmax0[r] = _mm512_max_ps(t0, vmax0[r]);  // t first: maxps returns its second operand for a NaN t
      vmax1[r] = _mm512_max_ps(t1, vmax1[r]);
    }
  }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(s + r * ld + j), vscale);
      _mm512_storeu_ps(s + r * ld + j, t);
      vmax0[r] = _mm512_max_ps(t, vmax0[r]);
    }
  if (j < n)
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + r * ld + j), vscale);
      _mm512_mask_storeu_ps(s + r * ld + j, tail, t);
      vmax1[r] = _mm512_mask_max_ps(vmax1[r], tail, t, vmax1[r]);
    }
  __m512 mx[R], vsum0[R], vsum1[R];
  for (int r = 0; r < R; ++r) {
    row_max[r] = _mm512_reduce_max_ps(_mm512_max_ps(vmax0[r], vmax1[r]));
    // A row whose scores so far are all -inf (a flash key tile of overflowed scores): subtract 0, not -inf,
    // whose exp(-inf - -inf) = NaN poisoned the row for good (see the Triton kernels' m_sub).
    mx[r] = _mm512_set1_ps(row_max[r] == -__builtin_inff() ? 0.0f : row_max[r]);
    vsum0[r] = vsum1[r] = _mm512_setzero_ps();
  }
  for (j = 0; j + 32 <= body; j += 32) {
    for (int r = 0; r < R; ++r) {
      float* row = s + r * ld;
      const __m512 e0 = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx[r]));
      const __m512 e1 = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16), mx[r]));
      _mm512_storeu_ps(row + j, e0);
      _mm512_storeu_ps(row + j + 16, e1);
      vsum0[r] = _mm512_add_ps(vsum0[r], e0);
      vsum1[r] = _mm512_add_ps(vsum1[r], e1);
    }
  }
  for (; j < body; j += 16) {
    for (int r = 0; r < R; ++r) {
      float* row = s + r * ld;
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx[r]));
      _mm512_storeu_ps(row + j, e);
      vsum0[r] = _mm512_add_ps(vsum0[r], e);
    }
  }
  if (j < n) {
    for (int r = 0; r < R; ++r) {
      float* row = s + r * ld;
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), mx[r]));
      _mm512_mask_storeu_ps(row + j, tail, e);
      vsum1[r] = _mm512_mask_add_ps(vsum1[r], tail, vsum1[r], e);
    }
  }
  for (int r = 0; r < R; ++r) row_sum[r] = _mm512_reduce_add_ps(_mm512_add_ps(vsum0[r], vsum1[r]));
}

}  // namespace

// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum;
// 16 lanes and masked tails, rows in interleaved pairs.  Each row's arithmetic is the same whichever group it
// falls in, so a row's result does not depend on how many rows one call covers.
void softmax_exp_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) softmax_exp_row_group<2>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r);
  if (r < rows) softmax_exp_row_group<1>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r);
}

// Same contract and loop order as run_gemm_block (gemm_driver.h), over pairs of panels: for each K block,
// for each pair of panels (a last odd panel alone), for each 14-row tile.
void gemm_block_avx512(const GemmBlockArgs& g) {
  const int64_t kc_max = g.kc > 0 ? g.kc : (g.k > 0 ? g.k : 1);
  const int64_t n_kblocks = g.k > 0 ? (g.k + kc_max - 1) / kc_max : 1;
  for (int64_t kb = 0; kb < n_kblocks; ++kb) {
    const int64_t k0 = g.k * kb / n_kblocks;
    const int64_t k1 = g.k * (kb + 1) / n_kblocks;
    const bool last = kb + 1 == n_kblocks;
    for (int64_t p = g.panel_begin; p < g.panel_end; p += 2) {
      const int np = g.panel_end - p >= 2 ? 2 : 1;
      const float* bp = g.b + p * g.b_panel_stride + k0 * kNr;
      const int64_t col = p * kNr;
      Tile512Epilogue e;
      e.load_c = g.accumulate || kb > 0;
      e.bias = (last && g.bias != nullptr) ? g.bias + col : nullptr;
      e.gelu = last && g.gelu;
      e.ld_addend = g.ld_addend;
      e.addend = nullptr;
      for (int q = 0; q < 2; ++q) {
        // A partial tail panel is stored whole only into a padded C with no addend (as in gemm_driver.h).
        const int64_t valid = g.n - (col + q * kNr);
        const bool whole = valid >= kNr || (g.c_padded && g.addend == nullptr);
        e.mask[q] = q < np ? (whole ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1u)) : __mmask16(0);
      }
      if (np == 2)
        row_tiles<2>(g, k0, k1, bp, col, e, last);
      else
        row_tiles<1>(g, k0, k1, bp, col, e, last);
    }
  }
}

namespace {

// R rows of layer_norm_rows at once (two passes and the normalisation), their reductions interleaved: one row
// alone waits on its sum's cross-lane reduction before the variance pass, and on the variance's before the
// normalisation; at ViT widths (12-48 vectors a row) those latencies, not the loads, set the pace.
template <int R>
static inline __attribute__((always_inline)) void layer_norm_group(const float* x, float* y, int64_t c,
                                                                   const float* gamma, const float* beta, float eps) {
  const __mmask16 tail = __mmask16((1u << (c % 16)) - 1u);
  const int64_t body = c - c % 16;
  // Pass 1 sums deviations from the row's first value (see layer_norm_rows_scalar): mean = x0 + Σ(x − x0)/c.
  __m512 s0[R], s1[R], e0[R], e1[R], mean[R], rstd[R], x0[R];
  float mean1[R];
  for (int r = 0; r < R; ++r) {
    s0[r] = s1[r] = _mm512_setzero_ps();
    x0[r] = _mm512_set1_ps(x[r * c]);
  }
  int64_t j = 0;
  for (; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
      s1[r] = _mm512_add_ps(s1[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), x0[r]));
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
  if (j < c)
    for (int r = 0; r < R; ++r)
      s1[r] = _mm512_add_ps(s1[r], _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), x0[r]));
  for (int r = 0; r < R; ++r) {
    mean1[r] = x[r * c] + _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c);
    mean[r] = _mm512_set1_ps(mean1[r]);
    s0[r] = s1[r] = e0[r] = e1[r] = _mm512_setzero_ps();
  }
  // Pass 2: Σd² and Σd (the corrected two-pass of layer_norm_rows_scalar).
  for (j = 0; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d0);
      e1[r] = _mm512_add_ps(e1[r], d1);
      s0[r] = _mm512_fmadd_ps(d0, d0, s0[r]);
      s1[r] = _mm512_fmadd_ps(d1, d1, s1[r]);
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d);
      s0[r] = _mm512_fmadd_ps(d, d, s0[r]);
    }
  if (j < c)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), mean[r]);
      e1[r] = _mm512_add_ps(e1[r], d);
      s1[r] = _mm512_fmadd_ps(d, d, s1[r]);
    }
  for (int r = 0; r < R; ++r) {
    const float corr = _mm512_reduce_add_ps(_mm512_add_ps(e0[r], e1[r])) / float(c);
    const float var = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c) - corr * corr;
    rstd[r] = _mm512_set1_ps(1.0f / __builtin_sqrtf((var < 0.0f ? 0.0f : var) + eps));
    mean[r] = _mm512_set1_ps(mean1[r] + corr);
  }
  for (j = 0; j < c; j += 16) {
    const __mmask16 m = j + 16 <= c ? __mmask16(0xFFFF) : tail;
    const __m512 g = gamma != nullptr ? _mm512_maskz_loadu_ps(m, gamma + j) : _mm512_setzero_ps();
    const __m512 b = beta != nullptr ? _mm512_maskz_loadu_ps(m, beta + j) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + r * c + j), mean[r]), rstd[r]);
      if (gamma != nullptr) v = _mm512_mul_ps(v, g);
      if (beta != nullptr) v = _mm512_add_ps(v, b);
      _mm512_mask_storeu_ps(y + r * c + j, m, v);
    }
  }
}

}  // namespace

// Measured at [197, C] on Zen 4, one thread: 5.3 / 10.8 / 23 µs at C = 192 / 384 / 768, against 19.5 / 29.5 /
// 49.5 µs for torch's F.layer_norm (its affine path; the non-affine one is twice as slow).
void layer_norm_rows_avx512(const float* x, float* y, int64_t rows, int64_t c, const float* gamma,
                            const float* beta, float eps) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) layer_norm_group<2>(x + r * c, y + r * c, c, gamma, beta, eps);
  if (r < rows) layer_norm_group<1>(x + r * c, y + r * c, c, gamma, beta, eps);
}

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

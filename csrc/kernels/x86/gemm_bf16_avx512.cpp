// AVX512_BF16 GEMM micro-kernels: `vdpbf16ps`, 14 × 32 tiles (two packed 16-column panels, 28 zmm accumulators),
// the same tile shape, row balancing, C prefetch and masked epilogue as the fp32 AVX-512 path (gemm_avx512.cpp),
// over pairs of k: one k-pair step is 2 B loads (64 bytes = 16 columns × 2 k each) + 14 broadcasts of a row's
// 32-bit bf16 pair, for 28 vdpbf16ps = 56 × 16 products, twice the products of the fp32 tile's step for the same
// instruction count (layout and numerics: gemm_bf16.h).
//
// The ISA is enabled for this file only (cpu_features checks cpuid 7.1 eax bit 5 on top of the AVX-512 state);
// it includes only immintrin.h and plain headers (gemm_bf16_isa.h explains why).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma")
#endif

#include "kernels/gemm_bf16_isa.h"
#include "kernels/x86/avx512_prelude.h"

namespace vitfast {
#include "kernels/x86/softmax_exp_avx512.inc"
}  // namespace vitfast

namespace vitfast {
namespace gemm16 {
namespace {

using gemm::kNr;
using x86::gelu16_for_bf16;
using x86::round_bf16_16;

constexpr int kMr512 = 14;
// B prefetch distance in k-pair steps (64-byte lines), as the fp32 path's kPrefetchLines.
constexpr int64_t kPrefetchLines = 64;
// k-pair steps before the end of a tile at which its C (and addend) rows are prefetched: the fp32 path's 128 steps
// of 128 B of B each, in the same bytes of B streamed.
constexpr int64_t kCPrefetchSteps = 128;

#include "kernels/x86/bf16_epilogue_avx512.inc"

static inline __attribute__((always_inline)) __m512i broadcast_pair(const uint16_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The bf16-only store of the once-per-row epilogue below: vcvtneps2bf16 gives round_bf16_16's bits for every value
// but a denormal (it flushes those; NaNs are kept quiet by both), so a vector holding one (vfpclassps, no constant
// register) goes to the integer rounding out of line: inlined, its five constants were hoisted above the tile's
// main loop, which has no registers to spare (see VITFAST_BF16_STORE_PLAIN16).
__attribute__((noinline)) void store_bf16_rounded(uint16_t* p, __mmask16 m, __m512 v) { store_bf16(p, m, v); }
static inline __attribute__((always_inline)) void store_bf16_fast(uint16_t* p, __mmask16 m, __m512 v) {
  if (__builtin_expect(_mm512_mask_fpclass_ps_mask(m, v, 0x20) != 0, 0))
    store_bf16_rounded(p, m, v);
  else
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

template <int MR, int NP>
static inline __attribute__((always_inline)) void tile(int64_t steps, const uint16_t* a, int64_t lda,
                                                       const uint16_t* b, int64_t b_stride, float* c, int64_t ldc,
                                                       const TileEpilogue& e, const TileRows& t) {
  __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0, c2_1 = c0_0;
  __m512 c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
  __m512 c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0, c8_1 = c0_0;
  __m512 c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0, c11_1 = c0_0;
  __m512 c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
  const uint16_t* a0 = a;
  const uint16_t* a3 = MR > 3 ? a + 3 * lda : a;
  const uint16_t* a6 = MR > 6 ? a + 6 * lda : a;
  const uint16_t* a9 = MR > 9 ? a + 9 * lda : a;
  const uint16_t* a12 = MR > 12 ? a + 12 * lda : a;
  const uint16_t* b1p = b + (NP > 1 ? b_stride : 0);
#define VITFAST_BF16_ROW(row, ptr, off)                                        \
  if (MR > row) {                                                              \
    const __m512bh t = (__m512bh)broadcast_pair(ptr + (off));                  \
    c##row##_0 = _mm512_dpbf16_ps(c##row##_0, t, b0);                          \
    if (NP > 1) c##row##_1 = _mm512_dpbf16_ps(c##row##_1, t, b1);              \
  }
  const int64_t s_tail = steps > kCPrefetchSteps ? steps - kCPrefetchSteps : 0;
  // The next panel pair's share of this tile, one line every pf_every steps across the whole tile (bursts of one
  // line per step left DeiT-B's 96 KiB pairs partly unfetched: more misses in flight than the core keeps).
  const int64_t pf_every = t.pf_lines > 0 ? (steps / t.pf_lines > 1 ? steps / t.pf_lines : 1) : steps + 1;
  const char* pf = t.pf;
  int64_t pf_at = 0, pf_left = t.pf_lines;
  for (int64_t p_begin = 0, p_end = s_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = steps) {
    if (pass == 1 && s_tail > 0 && c != nullptr) {
      for (int r = 0; r < MR; ++r)
        for (int q = 0; q < NP; ++q) {
          _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16 * q), _MM_HINT_T0);
          if (t.addend != nullptr)
            _mm_prefetch(reinterpret_cast<const char*>(t.addend + r * e.ld_addend + 16 * q), _MM_HINT_T0);
        }
    }
#pragma GCC unroll 2
    for (int64_t p = p_begin; p < p_end; ++p) {
      const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
      const __m512bh b1 = NP > 1 ? (__m512bh)_mm512_load_si512(b1p) : b0;
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * 2 * kNr), _MM_HINT_T0);
      if (NP > 1) _mm_prefetch(reinterpret_cast<const char*>(b1p + kPrefetchLines * 2 * kNr), _MM_HINT_T0);
      if (p == pf_at && pf_left > 0) {
        _mm_prefetch(pf, _MM_HINT_T1);
        pf += 64;
        pf_at += pf_every;
        --pf_left;
      }
      b += 2 * kNr;
      b1p += 2 * kNr;
      VITFAST_BF16_ROW(0, a0, 0)
      VITFAST_BF16_ROW(1, a0, lda)
      VITFAST_BF16_ROW(2, a0, 2 * lda)
      VITFAST_BF16_ROW(3, a3, 0)
      VITFAST_BF16_ROW(4, a3, lda)
      VITFAST_BF16_ROW(5, a3, 2 * lda)
      VITFAST_BF16_ROW(6, a6, 0)
      VITFAST_BF16_ROW(7, a6, lda)
      VITFAST_BF16_ROW(8, a6, 2 * lda)
      VITFAST_BF16_ROW(9, a9, 0)
      VITFAST_BF16_ROW(10, a9, lda)
      VITFAST_BF16_ROW(11, a9, 2 * lda)
      VITFAST_BF16_ROW(12, a12, 0)
      VITFAST_BF16_ROW(13, a12, lda)
      a0 += 2;
      a3 += 2;
      a6 += 2;
      a9 += 2;
      a12 += 2;
    }
  }
#undef VITFAST_BF16_ROW
// The finished values to C (fp32) and/or its bf16 copy (round_bf16_16: convert_rows' bits), the same columns.
#define VITFAST_BF16_STORE(row)                                                                       \
  if (MR > row) {                                                                                     \
    float* ci = c != nullptr ? c + row * ldc : nullptr;                                               \
    const __m512 v0 = epilogue16(c##row##_0, e, t, ci, 0, row);                                          \
    if (ci != nullptr) _mm512_mask_storeu_ps(ci, e.mask[0], v0);                                      \
    if (t.c16 != nullptr) store_bf16(t.c16 + row * e.ldc16, e.mask[0], v0);                           \
    if (NP > 1) {                                                                                     \
      const __m512 v1 = epilogue16(c##row##_1, e, t, ci, 1, row);                                        \
      if (ci != nullptr) _mm512_mask_storeu_ps(ci + 16, e.mask[1], v1);                               \
      if (t.c16 != nullptr) store_bf16(t.c16 + row * e.ldc16 + 16, e.mask[1], v1);                    \
    }                                                                                                 \
  }
// Row `row`'s values through the row scale, then the bias (epilogue16's order), as v0 and v1.
#define VITFAST_BF16_SCALE_BIAS(row)                                                                  \
    __m512 v0 = c##row##_0, v1 = c##row##_1;                                                          \
    if (rs != nullptr) {                                                                              \
      const __m512 f = _mm512_set1_ps(rs[row]);                                                       \
      v0 = _mm512_mul_ps(v0, f);                                                                      \
      v1 = _mm512_mul_ps(v1, f);                                                                      \
    }                                                                                                 \
    if (e.bias != nullptr) {                                                                          \
      v0 = _mm512_add_ps(v0, _mm512_loadu_ps(e.bias));                                                \
      if (NP > 1) v1 = _mm512_add_ps(v1, _mm512_loadu_ps(e.bias + 16));                               \
    }
#define VITFAST_BF16_EACH_ROW(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)
// Without GELU, a bf16 copy or accumulation (attention's products, the bias and residual linears), the options are
// tested once per row instead of for every register: the general epilogue below tests each for every register
// (~170 branches per 14 × 32 tile), which at K = 64 (Q·Kᵀ, 32 k-pair steps) cost as much as a third of the tile
// (measured 71% -> 84% of the vdpbf16ps peak at 42 × 64 × 197).  Same operations in the same order, so the same
// values.
#define VITFAST_BF16_ADDEND(row)                                                                      \
    if (t.addend != nullptr) {                                                                        \
      const float* ai = t.addend + row * e.ld_addend;                                                 \
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(e.mask[0], ai));                                   \
      if (NP > 1) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(e.mask[1], ai + 16));                  \
    }
#define VITFAST_BF16_STORE_PLAIN(row)                                                                 \
  if (MR > row) {                                                                                     \
    float* ci = c + row * ldc;                                                                        \
    VITFAST_BF16_SCALE_BIAS(row)                                                                      \
    VITFAST_BF16_ADDEND(row)                                                                          \
    _mm512_mask_storeu_ps(ci, e.mask[0], v0);                                                         \
    if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], v1);                                        \
  }
// The same once-per-row form for a result wanted only as bf16 (C nullptr: the bf16 block's qkv GEMM, attention's
// P·V into the heads' bf16 rows): row scale and/or bias, then the bf16 store.  Through the general epilogue the qkv
// GEMM's bias + bf16 store ran ~3% under the plain fp32 store at DeiT-B's 197 × 768 × 768 (bf16_kernel_parts.py).
#define VITFAST_BF16_STORE_PLAIN16(row)                                                               \
  if (MR > row) {                                                                                     \
    uint16_t* c16i = t.c16 + row * e.ldc16;                                                           \
    VITFAST_BF16_SCALE_BIAS(row)                                                                      \
    if (kGelu) {                                                                                      \
      v0 = gelu16_for_bf16(v0);                                                                       \
      if (NP > 1) v1 = gelu16_for_bf16(v1);                                                           \
    }                                                                                                 \
    VITFAST_BF16_ADDEND(row)                                                                          \
    store_bf16_fast(c16i, e.mask[0], v0);                                                             \
    if (NP > 1) store_bf16_fast(c16i + 16, e.mask[1], v1);                                            \
  }
  if (c == nullptr && t.c16 != nullptr && !e.load_c) {
    const float* rs = t.row_scale;
    if (e.gelu) {
      constexpr bool kGelu = true;
      VITFAST_BF16_EACH_ROW(VITFAST_BF16_STORE_PLAIN16)
    } else {
      constexpr bool kGelu = false;
      VITFAST_BF16_EACH_ROW(VITFAST_BF16_STORE_PLAIN16)
    }
    return;
  }
#undef VITFAST_BF16_STORE_PLAIN16
  if (c != nullptr && !e.load_c && !e.gelu && t.c16 == nullptr) {
    const float* rs = t.row_scale;
    VITFAST_BF16_EACH_ROW(VITFAST_BF16_STORE_PLAIN)
    return;
  }
#undef VITFAST_BF16_STORE_PLAIN
#undef VITFAST_BF16_SCALE_BIAS
#undef VITFAST_BF16_ADDEND
  VITFAST_BF16_EACH_ROW(VITFAST_BF16_STORE)
#undef VITFAST_BF16_EACH_ROW
#undef VITFAST_BF16_STORE
}

// next / next_lines: the next panel pair's B (contiguous, next_lines 64-byte lines; nullptr: none), prefetched a
// share per row tile: it is read from memory once per GEMM (the weights of a model's blocks do not stay in cache from
// one forward to the next), and without this its first row tile waited on it — measured on 16 rotating weight sets
// of DeiT shapes, one core: 5-6% slower than with a hot B.
template <int NP>
void row_tiles(const Bf16BlockArgs& g, const uint16_t* bp, int64_t col, const TileEpilogue& base, const char* next,
               int64_t next_lines) {
  // Local copies (not the caller's struct): the tile's masked stores may alias anything, so options read through a
  // reference were reloaded after every store (Q·Kᵀ 84% -> 69% of peak); locals whose address never escapes stay
  // in registers.
  const TileEpilogue e = base;
  TileRows rt;
  // Balanced row tiles, as the fp32 path: 197 rows = 2 × 14 + 13 × 13.
  const int64_t tiles = (g.m + kMr512 - 1) / kMr512;
  const int64_t rows_small = tiles > 0 ? g.m / tiles : 0, n_big = tiles > 0 ? g.m % tiles : 0;
  const int64_t steps = g.k2 / 2, bs = g.b_panel_stride;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    // This tile's share of the next pair, spread over the tile's k-pair steps (to L2: with K = 768 a pair is 96 KiB,
    // and into L1 it evicted the B being read); a share longer than the tile's steps is cut short.
    const int64_t l0 = t * next_lines / tiles, l1 = (t + 1) * next_lines / tiles;
    rt.pf = next != nullptr ? next + 64 * l0 : nullptr;
    rt.pf_lines = next != nullptr ? (l1 - l0 < steps ? l1 - l0 : steps) : 0;
    const int64_t rows = rows_small + (t < n_big ? 1 : 0);
    const uint16_t* a = g.a + i * g.lda;
    float* c = g.c != nullptr ? g.c + i * g.ldc + col : nullptr;
    rt.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
    rt.row_scale = g.row_scale != nullptr ? g.row_scale + i : nullptr;
    rt.c16 = g.c16 != nullptr ? g.c16 + i * g.ldc16 + col : nullptr;
    i += rows;
    switch (rows) {
      case 14: tile<14, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 13: tile<13, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 12: tile<12, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 11: tile<11, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 10: tile<10, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 9: tile<9, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 8: tile<8, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 7: tile<7, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 6: tile<6, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 5: tile<5, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 4: tile<4, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 3: tile<3, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      case 2: tile<2, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
      default: tile<1, NP>(steps, a, g.lda, bp, bs, c, g.ldc, e, rt); break;
    }
  }
}

}  // namespace

// For each pair of panels (a last odd panel alone), for each 14-row tile, the whole K: no K blocks (gemm_bf16.h).
void gemm_bf16_block_avx512(const Bf16BlockArgs& g) {
  for (int64_t p = g.panel_begin; p < g.panel_end; p += 2) {
    const int np = g.panel_end - p >= 2 ? 2 : 1;
    const uint16_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const TileEpilogue e = pair_epilogue(g, p, np);
    const int64_t next_np = g.panel_end - (p + np) < 2 ? g.panel_end - (p + np) : 2;
    const char* next = next_np > 0 ? reinterpret_cast<const char*>(g.b + (p + np) * g.b_panel_stride) : nullptr;
    const int64_t next_lines = next_np * g.b_panel_stride * 2 / 64;
    if (np == 2)
      row_tiles<2>(g, bp, col, e, next, next_lines);
    else
      row_tiles<1>(g, bp, col, e, next, next_lines);
  }
}



namespace {
// fp32 -> bf16 with vcvtneps2bf16 / vcvtne2ps2bf16 where they give round_bf16_16's bits (convert_rows' contract):
// both round to nearest even and keep a NaN quiet as the portable rounding does, but flush a denormal input to zero.
// One test per vector (an exponent field of 0 and a nonzero mantissa) sends the rare vector that holds a denormal
// to the integer rounding.  2-3 instructions for 16 values instead of ~10: the packing of DeiT-B's K and V for its 12
// heads 27 -> 24 µs (bf16_kernel_parts.py, quiet runs); the rounding of the Q rows, bound by reading them, unchanged,
// and so was the LayerNorm to bf16 rows with it (-2%, bound by its passes: it keeps the integer rounding).
static inline __attribute__((always_inline)) __mmask16 denormals(__m512 v) {
  const __m512i mag = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmp_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7ffffe),
                               _MM_CMPINT_LE);
}
// 16 values in order.
static inline __attribute__((always_inline)) __m256i to_bf16x16(__m512 v) {
  if (__builtin_expect(denormals(v) != 0, 0)) return _mm512_cvtepi32_epi16(round_bf16_16(_mm512_castps_si512(v)));
  return (__m256i)_mm512_cvtneps_pbh(v);
}
// 32 values in order: lo's 16 then hi's.
static inline __attribute__((always_inline)) __m512i to_bf16x32(__m512 lo, __m512 hi) {
  if (__builtin_expect((denormals(lo) | denormals(hi)) != 0, 0))
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(round_bf16_16(_mm512_castps_si512(lo)))),
                              _mm512_cvtepi32_epi16(round_bf16_16(_mm512_castps_si512(hi))), 1);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// 32 values of a row from k0 on as bf16 (the pad past k zero): fp32 ones rounded (to_bf16x32), bf16 ones loaded.
static inline __attribute__((always_inline)) __m512i row32(const float* row, int64_t valid) {
  const int64_t lo_n = valid >= 16 ? 16 : valid, hi_n = valid >= 32 ? 16 : (valid > 16 ? valid - 16 : 0);
  const __mmask16 lo_m = __mmask16((1u << lo_n) - 1u), hi_m = __mmask16((1u << hi_n) - 1u);
  return to_bf16x32(_mm512_maskz_loadu_ps(lo_m, row), _mm512_maskz_loadu_ps(hi_m, row + 16));
}
static inline __attribute__((always_inline)) __m512i row32(const uint16_t* row, int64_t valid) {
  return _mm512_maskz_loadu_epi16(valid >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << valid) - 1u), row);
}
// Rows 2q and 2q + 1 of a panel's 16 columns as bf16, row 2q in the low 256 bits.
static inline __attribute__((always_inline)) __m512i row_pair(const float* r0, const float* r1, __mmask16 m) {
  return to_bf16x32(_mm512_maskz_loadu_ps(m, r0), r1 != nullptr ? _mm512_maskz_loadu_ps(m, r1) : _mm512_setzero_ps());
}
static inline __attribute__((always_inline)) __m512i row_pair(const uint16_t* r0, const uint16_t* r1, __mmask16 m) {
  const __m256i hi = r1 != nullptr ? _mm256_maskz_loadu_epi16(m, r1) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi16(m, r0)), hi, 1);
}

template <class T>
void pack_transposed(const T* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst) {
  // Panel p (16 rows of w = 16 columns of B), block of 16 k-pairs: each row's 32 values as bf16 in order (rounded
  // from fp32, or loaded), so its 32-bit element c is the block's (even, odd) pair c, then the 16 × 16 pairs
  // transposed so each pair's 16 columns make one 64-byte line.  Plain row loads instead of two 16-lane gathers
  // per line: the K pack of a DeiT head took ~2.5 µs with gathers.
  const int64_t pairs = (k + 1) / 2, panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = n - p * kNr < kNr ? n - p * kNr : kNr;
    uint16_t* panel = dst + p * pairs * 2 * kNr;
    for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
      const int64_t k0 = 2 * q0;
      __m512i r[16];
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t)
        r[t] = t < cols ? row32(w + (p * kNr + t) * ldw + k0, k - k0) : _mm512_setzero_si512();
      x86::transpose16_epi32(r);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (q0 + c < pairs) _mm512_store_si512(panel + (q0 + c) * 2 * kNr, r[c]);
    }
  }
}

template <class T>
void pack_rows(const T* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst) {
  // Panel p, pair q: rows 2q and 2q + 1 of the panel's 16 columns as bf16, row 2q + 1 in the high halves: the
  // [16][2] line with plain loads (no transpose: B is already k-major), the two rows' 16 values interleaved by one
  // word permute.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int64_t k2 = (k + 1) / 2 * 2, panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = n - p * kNr < kNr ? n - p * kNr : kNr;
    const __mmask16 m = cols == kNr ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1u);
    uint16_t* panel = dst + p * k2 * kNr;
    for (int64_t q = 0; q < k2 / 2; ++q) {
      const T* r0 = b + 2 * q * ldb + p * kNr;
      _mm512_store_si512(panel + q * 2 * kNr,
                         _mm512_permutexvar_epi16(interleave, row_pair(r0, 2 * q + 1 < k ? r0 + ldb : nullptr, m)));
    }
  }
}
}  // namespace

void pack_b_transposed_bf16_avx512(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst) {
  pack_transposed(w, n, k, ldw, dst);
}
void pack_b_transposed_bf16_avx512(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst) {
  pack_transposed(w, n, k, ldw, dst);
}
void pack_b_bf16_avx512(const float* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst) {
  pack_rows(b, k, n, ldb, dst);
}
void pack_b_bf16_avx512(const uint16_t* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst) {
  pack_rows(b, k, n, ldb, dst);
}

void convert_rows_avx512(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * ldx;
    uint16_t* out = dst + r * ld;
    for (int64_t j = 0; j < k; j += 16) {
      const __mmask16 m = k - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - j)) - 1u);
      _mm256_mask_storeu_epi16(out + j, m, to_bf16x16(_mm512_maskz_loadu_ps(m, src + j)));
    }
    if (k % 2 != 0) out[k] = 0;
  }
}


namespace {
// Pass 2's exps (exp16_for_bf16) rounded to bf16 into P with vcvtneps2bf16: the bits of the portable rounding
// (round_bf16_16) for every value it can see, as exp16_for_bf16 returns 0 or a normal number >= 2^-125.6 (never a
// denormal, which the instruction would flush) and a NaN is kept quiet by both; ~20% less time than that integer
// rounding in this pass.
struct ToBf16 {
  uint16_t* p;
  int64_t ld;
  inline __attribute__((always_inline)) void store(int r, int64_t j, __m512 e) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + r * ld + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  inline __attribute__((always_inline)) void store_tail(int r, int64_t j, __mmask16 m, __m512 e) const {
    _mm256_mask_storeu_epi16(p + r * ld + j, m, (__m256i)_mm512_cvtneps_pbh(e));
  }
  // The pad element of an odd row (convert_rows' contract: P·V reads whole pairs).
  inline __attribute__((always_inline)) void finish(int r, int64_t n) const {
    if (n % 2 != 0) p[r * ld + n] = 0;
  }
  static inline __attribute__((always_inline)) __m512 exp(__m512 x) { return x86::exp16_for_bf16(x); }
};
}  // namespace

void softmax_exp_rows_bf16_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                  float* row_sum, uint16_t* p, int64_t ldp) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t r = 0;
  if (scale == 1.0f) {  // pre-scaled scores (attention_head_bf16): pass 1 reads only
    for (; r + 2 <= rows; r += 2)
      x86::softmax_exp_row_group<2, ToBf16, false>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r,
                                                   ToBf16{p + r * ldp, ldp});
    if (r < rows)
      x86::softmax_exp_row_group<1, ToBf16, false>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r,
                                                   ToBf16{p + r * ldp, ldp});
    return;
  }
  for (; r + 2 <= rows; r += 2)
    x86::softmax_exp_row_group<2>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, ToBf16{p + r * ldp, ldp});
  if (r < rows)
    x86::softmax_exp_row_group<1>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, ToBf16{p + r * ldp, ldp});
}

}  // namespace gemm16
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

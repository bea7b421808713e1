// AVX-512 VNNI int8 kernel (Int8Kernel::kAvx512Vnni): 14 × 32 register tiles of `vpdpbusd`, and the AVX-512
// quantize_rows.
//
// `vpdpbusd acc, u8, s8` adds four u8 × s8 products into each s32 lane, exactly (no saturation: that is the
// vpdpbusds variant).  The s8 operand is the one that may be a 32-bit broadcast: that is A (four s8 activations of
// one row, the same for all 16 columns), so B is stored as u8 = qw + 128 (gemm_int8.cpp) and the epilogue removes
// 128·rowsum[r].  One step of 4 k is then 2 B loads + 14 broadcasts + 28 vpdpbusd, the same shape as the fp32
// 14 × 32 tile (gemm_avx512.cpp) but 4× the MACs per instruction.  Measured on one core: 83% of the register-only
// vpdpbusd peak at K = 256, 86-91% at K = 384-768, 94% at K = 1536-3072 (benchmarks/int8_gemm_peak.py): the shortfall
// shrinks as K grows, as a per-tile cost (epilogue, accumulator reset) amortised over K would.  The s32
// sum wraps modulo 2³² when Σ qa·(qw + 128) exceeds 2³¹ (k > 66 000); after subtracting 128·rowsum the result is
// the exact Σ qa·qw whenever that fits in s32 (k < 133 000), since the arithmetic is modular.
//
// The ISA is enabled for this file only, as in gemm_avx512.cpp; run-time choice by int8_kernel() (cpu_has
// kAvx512Vnni).  The quantizer needs only AVX-512 F/BW (kAvx512 path).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma")
#endif

#include "kernels/gemm_int8_isa.h"
#include "kernels/x86/avx512_prelude.h"
#include "kernels/next_pair_prefetch.h"

namespace vitfast {
namespace gemm8 {
namespace {

using x86::add_row_and_store;
using x86::gelu16;

constexpr int kNr = 16;
constexpr int kMr512 = 14;
// B prefetch distance in 4-k groups (64-byte lines), as the fp32 kernel's kPrefetchLines.
constexpr int64_t kPrefetchLines = 64;
// Groups before the end of the K loop at which the tile's C and addend lines are prefetched (as kCPrefetchSteps
// in gemm_avx512.cpp: one group step is 28 instructions here, as one k step there).
constexpr int64_t kCPrefetchSteps = 128;

#include "kernels/x86/int8_epilogue_avx512.inc"

// Four A bytes to all 16 lanes.  GCC emits one vpbroadcastd per row, shared by the row's two vpdpbusd; forcing the
// {1to16} memory form into both instead (inline asm) measured slower at every DeiT shape: 71-86% of the vpdpbusd
// peak against 82-94% (one core, medians of 5 rounds).
static inline __attribute__((always_inline)) __m512i bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int MR, int NP>
static inline __attribute__((always_inline)) void prefetch_tile_rows(const float* c, int64_t ldc, const Epi& e) {
  for (int r = 0; r < MR; ++r) {
    for (int q = 0; q < NP; ++q) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16 * q), _MM_HINT_T0);
      if (e.addend != nullptr)
        _mm_prefetch(reinterpret_cast<const char*>(e.addend + r * e.ld_addend + 16 * q), _MM_HINT_T0);
    }
  }
}

// C[MR × 16·NP] (=|+=) epilogue over `groups` groups of 4 k; NP = 1 or 2 panels (the second b_stride bytes on).
template <int MR, int NP>
static inline __attribute__((always_inline)) void tile(int64_t groups, const int8_t* a, int64_t lda, const int8_t* b,
                                                       int64_t b_stride, const float* sa, const int32_t* rowsum,
                                                       float* c, int64_t ldc, const Epi& e,
                                                       const NextPairShare& nx) {
  __m512i c0_0 = _mm512_setzero_si512(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0, c2_1 = c0_0;
  __m512i c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
  __m512i c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0, c8_1 = c0_0;
  __m512i c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0, c11_1 = c0_0;
  __m512i c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
  const int8_t* a0 = a;
  const int8_t* a3 = MR > 3 ? a + 3 * lda : a;
  const int8_t* a6 = MR > 6 ? a + 6 * lda : a;
  const int8_t* a9 = MR > 9 ? a + 9 * lda : a;
  const int8_t* a12 = MR > 12 ? a + 12 * lda : a;
  const int8_t* b1p = b + (NP > 1 ? b_stride : 0);
#define VITFAST_VNNI_ROW(row, ptr, off)                                \
  if (MR > row) {                                                      \
    const __m512i t = bcast4(ptr + (off));                             \
    c##row##_0 = _mm512_dpbusd_epi32(c##row##_0, b0, t);               \
    if (NP > 1) c##row##_1 = _mm512_dpbusd_epi32(c##row##_1, b1, t);   \
  }
  // One group of 4 k: two B lines, the prefetch of this pair's lines ahead, 14 broadcasts of A.
#define VITFAST_VNNI_STEP()                                                                         \
  {                                                                                                 \
    const __m512i b0 = _mm512_load_si512(b);                                                        \
    const __m512i b1 = NP > 1 ? _mm512_load_si512(b1p) : b0;                                        \
    _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * 64), _MM_HINT_T0);              \
    if (NP > 1) _mm_prefetch(reinterpret_cast<const char*>(b1p + kPrefetchLines * 64), _MM_HINT_T0); \
    b += 64;                                                                                        \
    b1p += 64;                                                                                      \
    VITFAST_VNNI_ROW(0, a0, 0)                                                                      \
    VITFAST_VNNI_ROW(1, a0, lda)                                                                    \
    VITFAST_VNNI_ROW(2, a0, 2 * lda)                                                                \
    VITFAST_VNNI_ROW(3, a3, 0)                                                                      \
    VITFAST_VNNI_ROW(4, a3, lda)                                                                    \
    VITFAST_VNNI_ROW(5, a3, 2 * lda)                                                                \
    VITFAST_VNNI_ROW(6, a6, 0)                                                                      \
    VITFAST_VNNI_ROW(7, a6, lda)                                                                    \
    VITFAST_VNNI_ROW(8, a6, 2 * lda)                                                                \
    VITFAST_VNNI_ROW(9, a9, 0)                                                                      \
    VITFAST_VNNI_ROW(10, a9, lda)                                                                   \
    VITFAST_VNNI_ROW(11, a9, 2 * lda)                                                               \
    VITFAST_VNNI_ROW(12, a12, 0)                                                                    \
    VITFAST_VNNI_ROW(13, a12, lda)                                                                  \
    a0 += 4;                                                                                        \
    a3 += 4;                                                                                        \
    a6 += 4;                                                                                        \
    a9 += 4;                                                                                        \
    a12 += 4;                                                                                       \
  }
  // The next pair's lines to L2, one per kNextPairStride groups (next_pair_prefetch.h).
  static_assert(kNextPairStride == 4, "the loop below issues one next-pair prefetch per four written-out steps");
  const bool has_next = nx.next != nx.next_end;
  const char* next = nx.next;
  const char* const next_last = has_next ? nx.next_end - 64 : nullptr;
  const int64_t g_tail = groups > kCPrefetchSteps ? groups - kCPrefetchSteps : 0;
  for (int64_t p_begin = 0, p_end = g_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = groups) {
    if (pass == 1 && g_tail > 0) prefetch_tile_rows<MR, NP>(c, ldc, e);
    int64_t p = p_begin;
    if (has_next) {
      for (; p + kNextPairStride <= p_end; p += kNextPairStride) {
        _mm_prefetch(next, _MM_HINT_T1);
        next += next < next_last ? 64 : 0;
        VITFAST_VNNI_STEP()
        VITFAST_VNNI_STEP()
        VITFAST_VNNI_STEP()
        VITFAST_VNNI_STEP()
      }
    }
#pragma GCC unroll 2
    for (; p < p_end; ++p) VITFAST_VNNI_STEP()
  }
#undef VITFAST_VNNI_STEP
#undef VITFAST_VNNI_ROW
// Without accumulation (every GEMM of a block), bias, GELU and addend are tested once per row instead of for every
// register, as in the bf16 kernel's plain store (gemm_bf16_avx512.cpp): the same operations in the same order, so
// the same bits.  Measured (one core): 90-97% of the vpdpbusd peak at DeiT shapes against 79-95% (table
// int8_gemm_shapes of benchmarks/results/2026-12-01-amd-epyc-avx512.json and docs/quantization.md, Kernels), and GELU
// too: channel_idle_ffn_int8 at DeiT-S 202-207 -> 196-199 µs.
#define VITFAST_VNNI_STORE_PLAIN(row)                                                                             \
  if (MR > row) {                                                                                                 \
    float* ci = c + row * ldc;                                                                                    \
    const __m512i off = _mm512_set1_epi32(rowsum[row] * 128);                                                     \
    const __m512 s = _mm512_set1_ps(sa[row]);                                                                     \
    __m512 v0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c##row##_0, off)), s), ws0,     \
                                _mm512_setzero_ps());                                                             \
    __m512 v1 = NP > 1 ? _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c##row##_1, off)), s), \
                                         ws1, _mm512_setzero_ps())                                                \
                       : v0;                                                                                      \
    if (e.bias != nullptr) {                                                                                      \
      v0 = _mm512_add_ps(v0, bias0);                                                                              \
      if (NP > 1) v1 = _mm512_add_ps(v1, bias1);                                                                  \
    }                                                                                                             \
    if (e.gelu) {                                                                                                 \
      v0 = gelu16(v0);                                                                                            \
      if (NP > 1) v1 = gelu16(v1);                                                                                \
    }                                                                                                             \
    add_row_and_store<NP>(v0, v1, e.addend != nullptr ? e.addend + row * e.ld_addend : nullptr, e.mask, ci);     \
  }
  if (!e.load_c) {
    const __m512 ws0 = _mm512_loadu_ps(e.w_scale), ws1 = NP > 1 ? _mm512_loadu_ps(e.w_scale + 16) : ws0;
    const __m512 bias0 = e.bias != nullptr ? _mm512_loadu_ps(e.bias) : _mm512_setzero_ps();
    const __m512 bias1 = e.bias != nullptr && NP > 1 ? _mm512_loadu_ps(e.bias + 16) : bias0;
    VITFAST_VNNI_STORE_PLAIN(0)
    VITFAST_VNNI_STORE_PLAIN(1)
    VITFAST_VNNI_STORE_PLAIN(2)
    VITFAST_VNNI_STORE_PLAIN(3)
    VITFAST_VNNI_STORE_PLAIN(4)
    VITFAST_VNNI_STORE_PLAIN(5)
    VITFAST_VNNI_STORE_PLAIN(6)
    VITFAST_VNNI_STORE_PLAIN(7)
    VITFAST_VNNI_STORE_PLAIN(8)
    VITFAST_VNNI_STORE_PLAIN(9)
    VITFAST_VNNI_STORE_PLAIN(10)
    VITFAST_VNNI_STORE_PLAIN(11)
    VITFAST_VNNI_STORE_PLAIN(12)
    VITFAST_VNNI_STORE_PLAIN(13)
    return;
  }
#undef VITFAST_VNNI_STORE_PLAIN
#define VITFAST_VNNI_STORE(row)                                                                                   \
  if (MR > row) {                                                                                                 \
    float* ci = c + row * ldc;                                                                                    \
    const int32_t rs = rowsum[row];                                                                               \
    const float s = sa[row];                                                                                      \
    _mm512_mask_storeu_ps(ci, e.mask[0], epilogue16(c##row##_0, rs, s, e, ci, 0, row));                           \
    if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], epilogue16(c##row##_1, rs, s, e, ci, 1, row));          \
  }
  VITFAST_VNNI_STORE(0)
  VITFAST_VNNI_STORE(1)
  VITFAST_VNNI_STORE(2)
  VITFAST_VNNI_STORE(3)
  VITFAST_VNNI_STORE(4)
  VITFAST_VNNI_STORE(5)
  VITFAST_VNNI_STORE(6)
  VITFAST_VNNI_STORE(7)
  VITFAST_VNNI_STORE(8)
  VITFAST_VNNI_STORE(9)
  VITFAST_VNNI_STORE(10)
  VITFAST_VNNI_STORE(11)
  VITFAST_VNNI_STORE(12)
  VITFAST_VNNI_STORE(13)
#undef VITFAST_VNNI_STORE
}

template <int NP>
void row_tiles(const Int8BlockArgs& g, const int8_t* bp, int64_t col, const Epi& base, const int8_t* next_b,
               int64_t np_next) {
  Epi e = base;
  // Balanced row tiles, as the fp32 kernel: 197 rows = 2 × 14 + 13 × 13 (a 1-row tile would run at the
  // vpdpbusd latency with only two accumulator chains).
  const int64_t tiles = (g.m + kMr512 - 1) / kMr512;
  const int64_t rows_small = tiles > 0 ? g.m / tiles : 0, n_big = tiles > 0 ? g.m % tiles : 0;
  const int64_t groups = g.k4 / 4, bs = g.b_panel_stride;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int64_t rows = rows_small + (t < n_big ? 1 : 0);
    const NextPairShare nx =
        next_pair_share(reinterpret_cast<const char*>(next_b), bs, np_next, groups, groups, t);
    const int8_t* a = g.a + i * g.lda;
    float* c = g.c + i * g.ldc + col;
    const float* sa = g.sa + i;
    const int32_t* rs = g.rowsum + i;
    e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
    i += rows;
    switch (rows) {
      case 14: tile<14, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 13: tile<13, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 12: tile<12, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 11: tile<11, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 10: tile<10, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 9: tile<9, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 8: tile<8, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 7: tile<7, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 6: tile<6, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 5: tile<5, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 4: tile<4, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 3: tile<3, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      case 2: tile<2, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
      default: tile<1, NP>(groups, a, g.lda, bp, bs, sa, rs, c, g.ldc, e, nx); break;
    }
  }
}

}  // namespace

// For each pair of panels (a last odd panel alone), for each row tile; no K blocking (s32 accumulators live
// across all of K; a DeiT-B fc2 pair of panels is 3072 × 32 B = 96 KiB, streamed from L2 with the prefetch).
void gemm_int8_block_avx512_vnni(const Int8BlockArgs& g) {
  const bool prefetch = next_panel_prefetch_enabled();
  for (int64_t p = g.panel_begin; p < g.panel_end; p += 2) {
    const int np = g.panel_end - p >= 2 ? 2 : 1;
    const int8_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const Epi e = pair_epilogue(g, p, np);
    const int64_t np_next = next_panels(p + 2, g.panel_end, 2, prefetch);
    const int8_t* next_b = np_next > 0 ? bp + 2 * g.b_panel_stride : nullptr;
    if (np == 2)
      row_tiles<2>(g, bp, col, e, next_b, np_next);
    else
      row_tiles<1>(g, bp, col, e, next_b, np_next);
  }
}

void pack_words_transposed_avx512(const int8_t* src, int64_t ld, int64_t rows, int64_t words, uint32_t flip,
                                  int8_t* dst, int64_t panel_stride) {
  const __m512i vflip = _mm512_set1_epi32(int32_t(flip));
  for (int64_t t0 = 0; t0 < rows; t0 += 16) {
    int8_t* panel = dst + (t0 / 16) * panel_stride;
    for (int64_t w0 = 0; w0 < words; w0 += 16) {
      const int64_t nw = words - w0 < 16 ? words - w0 : 16;
      const __mmask16 m = nw == 16 ? __mmask16(0xFFFF) : __mmask16((1u << nw) - 1u);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_xor_si512(t0 + i < rows ? _mm512_maskz_loadu_epi32(m, src + (t0 + i) * ld + 4 * w0)
                                              : _mm512_setzero_si512(),
                                vflip);
      x86::transpose16_epi32(r);
      for (int64_t c = 0; c < nw; ++c) _mm512_storeu_si512(panel + (w0 + c) * 64, r[c]);
    }
  }
}

// attention_int8.cpp's v_columns 64 channels per pass: 4 maxima and 4 checks in registers over all the tokens.
// max(|v|, amax) keeps amax for a NaN |v| (vmaxps returns its second operand when one is NaN), as `av > amax ? av
// : amax` does; v · 0 + chk is exact whether or not it is contracted into one FMA.
void attention_v_columns_avx512(const float* v, int64_t ld, int64_t tokens, int64_t d, float* amax, float* chk) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < d; j0 += 64) {
    __mmask16 m[4];
    __m512 a[4], c[4];
    for (int u = 0; u < 4; ++u) {
      const int64_t n = d - j0 - 16 * u;
      m[u] = n >= 16 ? __mmask16(0xFFFF) : n > 0 ? __mmask16((1u << n) - 1u) : __mmask16(0);
      a[u] = _mm512_maskz_loadu_ps(m[u], amax + j0 + 16 * u);
      c[u] = _mm512_maskz_loadu_ps(m[u], chk + j0 + 16 * u);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = v + t * ld + j0;
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const __m512 x = _mm512_maskz_loadu_ps(m[u], row + 16 * u);
        a[u] = _mm512_max_ps(_mm512_abs_ps(x), a[u]);
        c[u] = _mm512_add_ps(c[u], _mm512_mul_ps(x, zero));
      }
    }
    for (int u = 0; u < 4; ++u) {
      _mm512_mask_storeu_ps(amax + j0 + 16 * u, m[u], a[u]);
      _mm512_mask_storeu_ps(chk + j0 + 16 * u, m[u], c[u]);
    }
  }
}

// attention_int8.cpp's v_pack one panel (16 channels) per register: a group's 16 words are built in a register
// and stored as one line.  Rounding by vrndscaleps (round to nearest even), the same value as the portable loop's
// (x + 1.5 · 2^23) − 1.5 · 2^23 for |x| < 2^22 (here |x| <= 127 · (1 + 2^-23) or NaN), with nothing after the
// product for a compiler to contract it with.  max(q, −127) turns a NaN into −127 as the portable clamp does (its
// codes are then masked by keep = 0).  Measured in an int8 DeiT-S forward (perf, one thread): the portable loops
// compiled for AVX2 were 4.4% of it.
void attention_v_pack_avx512(const float* v, int64_t ld, int64_t tokens, int64_t d, int64_t k4, int64_t panels,
                             int64_t panel_stride, int64_t group_bytes, int32_t offset, const float* inv,
                             const int32_t* keep, int8_t* dst) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i voff = _mm512_set1_epi32(offset), low_byte = _mm512_set1_epi32(255);
  const __m512i pad = _mm512_and_si512(voff, low_byte);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t j0 = p * kNr, n = d - j0;
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : n > 0 ? __mmask16((1u << n) - 1u) : __mmask16(0);
    const __m512 vinv = _mm512_loadu_ps(inv + j0);
    const __m512i vkeep = _mm512_loadu_si512(keep + j0);
    int8_t* out = dst + p * panel_stride;
    for (int64_t t0 = 0; t0 < k4; t0 += 4) {
      __m512i w = _mm512_setzero_si512();
      for (int tt = 0; tt < 4; ++tt) {
        const int64_t t = t0 + tt;
        __m512i c = pad;
        if (t < tokens) {
          const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + t * ld + j0), vinv);
          const __m512 q = _mm512_min_ps(
              _mm512_max_ps(_mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
          c = _mm512_and_si512(_mm512_add_epi32(_mm512_and_si512(_mm512_cvtps_epi32(q), vkeep), voff), low_byte);
        }
        w = _mm512_or_si512(w, _mm512_sll_epi32(c, _mm_cvtsi32_si128(8 * tt)));
      }
      _mm512_storeu_si512(out + t0 / 4 * group_bytes, w);
    }
  }
}

// The scalar definition (gemm_int8_scalar.cpp) 16 lanes at a time: the row maximum is exact whatever the order,
// and x · inv is one fp32 multiply in both, converted with round-half-to-even (vcvtps2dq under the default MXCSR).
//
// Only ports 0 and 5 run 512-bit arithmetic, so the instruction count per vector is the speed:
// - The maximum of |x| as the unsigned maximum of its bit patterns (sign bit cleared): for non-negative floats
//   integer order is float order, and every NaN or ±Inf pattern (>= 0x7F800000) is above FLT_MAX's, so one compare
//   after the loop finds a row holding one (two instructions per vector instead of abs, compare-into-mask, mask-or
//   and max).
// - No clamp to ±127 before the conversion: with amax = max |x| and inv = fl(127 / amax),
//   |x · inv| <= fl(amax · fl(127 / amax)) <= 127 · (1 + 2^-24)^2 < 127.5, so the conversion gives at most 127 in
//   magnitude, which is what the clamp would leave (the scalar code keeps it; the codes are the same).
// Measured (one core, 197 rows in L2, thread CPU time) at K = 384 / 768 / 1536: 10.0 / 18.0 / 35.1 µs with the
// compare and the clamps, 7.1 / 14.4 / 29.5 µs without.
void quantize_rows_avx512(const QuantizeArgs& q) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const uint32_t fmax_bits = 0x7F7FFFFFu;  // FLT_MAX
  const int64_t k = q.k, k4 = (k + 3) / 4 * 4, k64 = q.col_scale == nullptr ? k / 64 * 64 : 0;
  // 64 values at a time where they are whole (and no col_scale): four row maxima in flight (one max chain waited
  // on its latency), and the codes narrowed in registers (two vpackssdw, one vpacksswb, one vpermd: values are
  // already in [−127, 127], so the saturating packs are exact) and stored as one 64-byte line, instead of four
  // masked vpmovsdb stores.  The same values and codes as the 16-lane loop, which does the rest.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  auto abs_bits = [&](const float* p) { return _mm512_and_si512(_mm512_loadu_si512(p), abs_mask); };
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* x = q.x + r * q.ldx;
    int8_t* out = q.qa + r * q.lda;
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t c = 0; c < k64; c += 64) {
      m0 = _mm512_max_epu32(m0, abs_bits(x + c));
      m1 = _mm512_max_epu32(m1, abs_bits(x + c + 16));
      m2 = _mm512_max_epu32(m2, abs_bits(x + c + 32));
      m3 = _mm512_max_epu32(m3, abs_bits(x + c + 48));
    }
    __m512i vmax = _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3));
    for (int64_t c = k64; c < k; c += 16) {
      const __mmask16 m = k - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - c)) - 1u);
      __m512 v = _mm512_maskz_loadu_ps(m, x + c);
      if (q.col_scale != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, q.col_scale + c));
      vmax = _mm512_max_epu32(vmax, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    }
    const uint32_t bits = _mm512_reduce_max_epu32(vmax);
    const bool finite = bits <= fmax_bits;  // no NaN or ±Inf in the row
    float amax;
    __builtin_memcpy(&amax, &bits, sizeof amax);
    const float inv = 127.0f / amax;
    const bool zero = finite && !(inv <= 3.402823466e+38f);
    __m512i vsum = _mm512_setzero_si512();
    if (finite && !zero) {
      const __m512 vinv = _mm512_set1_ps(inv);
      auto codes = [&](const float* p) { return _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p), vinv)); };
      for (int64_t c = 0; c < k64; c += 64) {
        const __m512i i0 = codes(x + c), i1 = codes(x + c + 16), i2 = codes(x + c + 32), i3 = codes(x + c + 48);
        vsum = _mm512_add_epi32(vsum, _mm512_add_epi32(_mm512_add_epi32(i0, i1), _mm512_add_epi32(i2, i3)));
        // packs work within 128-bit lanes: lane L of the result holds elements 4L..4L+3 of i0, i1, i2, i3 in turn;
        // vpermd with `order` puts them back in column order.
        const __m512i w = _mm512_packs_epi16(_mm512_packs_epi32(i0, i1), _mm512_packs_epi32(i2, i3));
        _mm512_storeu_si512(out + c, _mm512_permutexvar_epi32(order, w));
      }
      for (int64_t c = k64; c < k; c += 16) {
        const __mmask16 m = k - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - c)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, x + c);
        if (q.col_scale != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, q.col_scale + c));
        const __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));
        vsum = _mm512_add_epi32(vsum, i);  // masked-off lanes are 0 · inv = 0
        _mm512_mask_cvtsepi32_storeu_epi8(out + c, m, i);
      }
    } else {
      for (int64_t c = 0; c < k; ++c) out[c] = 0;
    }
    for (int64_t c = k; c < k4; ++c) out[c] = 0;
    q.sa[r] = !finite ? __builtin_nanf("") : (zero ? 0.0f : amax / 127.0f);
    q.rowsum[r] = _mm512_reduce_add_epi32(vsum);
  }
}

}  // namespace gemm8
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

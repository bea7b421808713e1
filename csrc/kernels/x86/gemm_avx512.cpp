// AVX-512 GEMM micro-kernels (14 × 32: two packed 16-column panels, 28 zmm accumulators) and their driver.
//
// Why a second x86 path even on cores that run a 512-bit FMA as two 256-bit halves (no more FLOPs per cycle
// than AVX2): the AVX2 6 × 16 tile spends 8 loads (2 B lines + 6 broadcasts) and ~23 instructions per 12 FMAs,
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

#include "kernels/gemm_isa.h"
#include "kernels/x86/avx512_math.h"
#include "kernels/next_pair_prefetch.h"

namespace vitfast {
namespace gemm {
namespace {

using x86::add_row_and_store;
using x86::gelu16;

// Rows of the register tile: 14 rows × 2 panels = 28 accumulators + 2 B vectors + 1 broadcast = 31 of the
// 32 zmm registers.
constexpr int kMr512 = 14;
// Distance of the software prefetch of each packed B panel, in k steps (= 64-byte lines), as in the AVX2 path.
constexpr int64_t kPrefetchLines = 64;
// k steps before the end of a tile's K loop at which its C rows (and addend rows) are prefetched.  While the
// tile ran, ~K × 128 B of B panels streamed through the 32 KiB L1, so the lines the epilogue reads and
// writes are gone; fetched ~128 × 28 cycles ahead they are back in time.  Measured on channel_idle_ffn at DeiT-B
// (three 197 × 768 × 768 GEMMs, one thread, alternating builds): ~2% faster; 16 steps ahead was too late
// (docs/performance.md).
constexpr int64_t kCPrefetchSteps = 128;

struct Tile512Epilogue {
  bool load_c;           // acc += C (a later K block, or accumulate mode)
  const float* bias;     // 32 values (zero padded), or nullptr (only in the last K block)
  bool gelu;             // only in the last K block
  const float* addend;   // at this tile's (row 0, col 0), or nullptr (only in the last K block)
  int64_t ld_addend;
  const float* row_scale;  // at this tile's row 0, or nullptr (only in the last K block): after load_c, before bias
  __mmask16 mask[2];     // columns of each panel that may be loaded/stored (all 16 except on a tail panel)
  NextPairShare next;  // this tile's share of the next pair's lines, to L2 (next_pair_prefetch.h)
};

static inline __m512 epilogue16(__m512 v, const Tile512Epilogue& e, const float* ci, int q, int64_t row) {
  const __mmask16 m = e.mask[q];
  if (e.load_c) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, ci + 16 * q));
  if (e.row_scale != nullptr) v = _mm512_mul_ps(v, _mm512_set1_ps(e.row_scale[row]));
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

// What a tile does with its accumulators, fixed at compile time so the common cases carry no epilogue branches:
// a plain store (the attention scores, a first K block's partial sums), the same scaled by row (attention's P·V and
// its 1/Σ), or everything Tile512Epilogue allows.  Split out because the general epilogue (and its GELU call, which
// GCC keeps out of line) cost the short-K tiles most: attention's Q·Kᵀ at K = 64 ran 13% faster with the plain
// store (one head at DeiT shapes, alternating builds), while the K = 768 GEMMs were unchanged.  kEpiBiasAdd: bias
// and/or addend with neither accumulation, row scale nor GELU (a block's qkv, proj and FFN linear path), each option
// tested once per row instead of for every register, the same operations in the same order (the int8 VNNI kernel's
// per-row store measured 6-12% on its GEMMs).
enum TileEpi : int { kEpiStore = 0, kEpiRowScaled = 1, kEpiGeneral = 2, kEpiBiasAdd = 3 };

// One tile: C[MR × 16·NP] (=|+=) epilogue(A[MR × k] · B[k × 16·NP]), NP = 1 or 2 panels (the second one
// `b_stride` floats after the first).
template <int MR, int NP, int EPI>
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
  // One k step: two B lines, the prefetch of this pair's lines ahead (the first row tile of a pair reads B from L3;
  // see gemm_avx2.cpp), 14 broadcasts of A.
#define VITFAST_AVX512_STEP()                                                                    \
  {                                                                                              \
    const __m512 b0 = _mm512_load_ps(b);                                                         \
    const __m512 b1 = NP > 1 ? _mm512_load_ps(b1p) : b0;                                         \
    _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * kNr), _MM_HINT_T0);          \
    if (NP > 1) _mm_prefetch(reinterpret_cast<const char*>(b1p + kPrefetchLines * kNr), _MM_HINT_T0); \
    b += kNr;                                                                                    \
    b1p += kNr;                                                                                  \
    VITFAST_AVX512_ROW(0, a0, 0)                                                                 \
    VITFAST_AVX512_ROW(1, a0, lda)                                                               \
    VITFAST_AVX512_ROW(2, a0, 2 * lda)                                                           \
    VITFAST_AVX512_ROW(3, a3, 0)                                                                 \
    VITFAST_AVX512_ROW(4, a3, lda)                                                               \
    VITFAST_AVX512_ROW(5, a3, 2 * lda)                                                           \
    VITFAST_AVX512_ROW(6, a6, 0)                                                                 \
    VITFAST_AVX512_ROW(7, a6, lda)                                                               \
    VITFAST_AVX512_ROW(8, a6, 2 * lda)                                                           \
    VITFAST_AVX512_ROW(9, a9, 0)                                                                 \
    VITFAST_AVX512_ROW(10, a9, lda)                                                              \
    VITFAST_AVX512_ROW(11, a9, 2 * lda)                                                          \
    VITFAST_AVX512_ROW(12, a12, 0)                                                               \
    VITFAST_AVX512_ROW(13, a12, lda)                                                             \
    ++a0;                                                                                        \
    ++a3;                                                                                        \
    ++a6;                                                                                        \
    ++a9;                                                                                        \
    ++a12;                                                                                       \
  }
  // The next pair's lines: one per kNextPairStride steps; the pointer stays on the last one when the share is done
  // (a repeated prefetch of a line on its way is nearly free; a branch in the loop is not).
  static_assert(kNextPairStride == 4, "the loop below issues one next-pair prefetch per four written-out steps");
  const bool has_next = e.next.next != e.next.next_end;
  const char* next = e.next.next;
  const char* const next_last = has_next ? e.next.next_end - 64 : nullptr;
  // Two ranges of k: [0, k_tail) and [k_tail, k), with the C tile's lines prefetched in between.  A short K
  // (attention's K = 64 score GEMM) has not evicted them and skips it: at 197 × 64 × 197 the prefetches cost
  // 3% (100.0 vs 102.9 GFLOP/s).
  const int64_t k_tail = k > kCPrefetchSteps ? k - kCPrefetchSteps : 0;
  for (int64_t p_begin = 0, p_end = k_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = k) {
    if (pass == 1 && k_tail > 0) prefetch_tile_rows<MR, NP>(c, ldc, e);
    int64_t p = p_begin;
    if (has_next) {
      for (; p + kNextPairStride <= p_end; p += kNextPairStride) {
        _mm_prefetch(next, _MM_HINT_T1);
        next += next < next_last ? 64 : 0;
        VITFAST_AVX512_STEP()
        VITFAST_AVX512_STEP()
        VITFAST_AVX512_STEP()
        VITFAST_AVX512_STEP()
      }
    }
#pragma GCC unroll 2
    for (; p < p_end; ++p) VITFAST_AVX512_STEP()
  }
#undef VITFAST_AVX512_STEP
#undef VITFAST_AVX512_ROW
  // Epilogue row by row (C is written once per tile; masked loads/stores never touch a column past n).
#define VITFAST_AVX512_STORE(row)                                                                   \
  if (MR > row) {                                                                                   \
    float* ci = c + row * ldc;                                                                      \
    if (EPI == kEpiStore) {                                                                         \
      _mm512_mask_storeu_ps(ci, e.mask[0], c##row##_0);                                             \
      if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], c##row##_1);                            \
    } else if (EPI == kEpiRowScaled) {                                                              \
      const __m512 rs = _mm512_set1_ps(e.row_scale[row]);                                           \
      _mm512_mask_storeu_ps(ci, e.mask[0], _mm512_mul_ps(c##row##_0, rs));                          \
      if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], _mm512_mul_ps(c##row##_1, rs));         \
    } else if (EPI == kEpiBiasAdd) {                                                                \
      __m512 v0 = c##row##_0, v1 = c##row##_1;                                                      \
      if (e.bias != nullptr) {                                                                      \
        v0 = _mm512_add_ps(v0, bias0);                                                              \
        if (NP > 1) v1 = _mm512_add_ps(v1, bias1);                                                  \
      }                                                                                             \
      add_row_and_store<NP>(v0, v1, e.addend != nullptr ? e.addend + row * e.ld_addend : nullptr, e.mask, ci); \
    } else {                                                                                        \
      _mm512_mask_storeu_ps(ci, e.mask[0], epilogue16(c##row##_0, e, ci, 0, row));                  \
      if (NP > 1) _mm512_mask_storeu_ps(ci + 16, e.mask[1], epilogue16(c##row##_1, e, ci, 1, row)); \
    }                                                                                               \
  }
  const __m512 bias0 = EPI == kEpiBiasAdd && e.bias != nullptr ? _mm512_loadu_ps(e.bias) : _mm512_setzero_ps();
  const __m512 bias1 = EPI == kEpiBiasAdd && e.bias != nullptr && NP > 1 ? _mm512_loadu_ps(e.bias + 16) : bias0;
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

template <int NP, int EPI>
void row_tiles(const GemmBlockArgs& g, int64_t k0, int64_t k1, const float* bp, int64_t col,
               const Tile512Epilogue& base, bool last, const float* next_b, int64_t np_next) {
  Tile512Epilogue e = base;
  // Balanced row tiles: 197 rows become 2 × 14 + 13 × 13, not 14 × 14 + 1 (a 1-row tile has only two
  // accumulator chains, so it runs at the FMA latency, not its throughput).
  const int64_t tiles = (g.m + kMr512 - 1) / kMr512;
  const int64_t rows_small = tiles > 0 ? g.m / tiles : 0, n_big = tiles > 0 ? g.m % tiles : 0;
  for (int64_t t = 0, i = 0; t < tiles; ++t) {
    const int64_t rows = rows_small + (t < n_big ? 1 : 0);
    e.next = next_pair_share(reinterpret_cast<const char*>(next_b), g.b_panel_stride * int64_t(sizeof(float)), np_next,
                             k1 - k0, k1 - k0, t);
    const float* a = g.a + i * g.lda + k0;
    float* c = g.c + i * g.ldc + col;
    e.addend = (last && g.addend != nullptr) ? g.addend + i * g.ld_addend + col : nullptr;
    e.row_scale = (last && g.row_scale != nullptr) ? g.row_scale + i : nullptr;
    const int64_t kk = k1 - k0, bs = g.b_panel_stride;
    i += rows;
    switch (rows) {
      case 14: tile<14, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 13: tile<13, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 12: tile<12, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 11: tile<11, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 10: tile<10, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 9: tile<9, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 8: tile<8, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 7: tile<7, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 6: tile<6, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 5: tile<5, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 4: tile<4, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 3: tile<3, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      case 2: tile<2, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
      default: tile<1, NP, EPI>(kk, a, g.lda, bp, bs, c, g.ldc, e); break;
    }
  }
}

// row_tiles with the epilogue kind chosen at run time.
template <int NP>
void row_tiles_of(TileEpi epi, const GemmBlockArgs& g, int64_t k0, int64_t k1, const float* bp, int64_t col,
                  const Tile512Epilogue& e, bool last, const float* next_b, int64_t np_next) {
  switch (epi) {
    case kEpiStore: row_tiles<NP, kEpiStore>(g, k0, k1, bp, col, e, last, next_b, np_next); return;
    case kEpiRowScaled: row_tiles<NP, kEpiRowScaled>(g, k0, k1, bp, col, e, last, next_b, np_next); return;
    case kEpiBiasAdd: row_tiles<NP, kEpiBiasAdd>(g, k0, k1, bp, col, e, last, next_b, np_next); return;
    default: row_tiles<NP, kEpiGeneral>(g, k0, k1, bp, col, e, last, next_b, np_next); return;
  }
}

}  // namespace

// Same contract and loop order as run_gemm_block (gemm_driver.h), over pairs of panels: for each K block,
// for each pair of panels (a last odd panel alone), for each 14-row tile.
void gemm_block_avx512(const GemmBlockArgs& g) {
  const bool prefetch = next_panel_prefetch_enabled();
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
      e.row_scale = nullptr;
      e.next = NextPairShare();
      // The next pair of this K block; none after the last one (what runs next, another K block or another op,
      // is not known to be cold).
      const int64_t np_next = next_panels(p + 2, g.panel_end, 2, prefetch);
      const float* next_b = np_next > 0 ? bp + 2 * g.b_panel_stride : nullptr;
      for (int q = 0; q < 2; ++q) {
        // A partial tail panel is stored whole only into a padded C with no addend (as in gemm_driver.h).
        const int64_t valid = g.n - (col + q * kNr);
        const bool whole = valid >= kNr || (g.c_padded && g.addend == nullptr);
        e.mask[q] = q < np ? (whole ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1u)) : __mmask16(0);
      }
      const bool bare = !e.load_c && e.bias == nullptr && !e.gelu && (!last || g.addend == nullptr);
      const bool scaled = last && g.row_scale != nullptr;
      const bool bias_add = !e.load_c && !e.gelu && !scaled;
      const TileEpi epi = !bare ? (bias_add ? kEpiBiasAdd : kEpiGeneral) : scaled ? kEpiRowScaled : kEpiStore;
      if (np == 2)
        row_tiles_of<2>(epi, g, k0, k1, bp, col, e, last, next_b, np_next);
      else
        row_tiles_of<1>(epi, g, k0, k1, bp, col, e, last, next_b, np_next);
    }
  }
}

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

// AVX2/FMA GEMM micro-kernels (6 × 16, twelve ymm accumulators) with the fused epilogue (bias, erf-GELU,
// addend), driven by run_gemm_block (gemm_driver.h).
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

#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"
#include "kernels/x86/avx2_math.h"

namespace vitfast {
namespace gemm {
namespace {

using x86::gelu8;
using x86::lane_mask;

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

struct Avx2Tile {
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
#define VITFAST_AVX2_ROW(row, ptr, off)                    \
  if (MR > row) {                                          \
    const __m256 t = _mm256_broadcast_ss(ptr + off);       \
    c##row##0 = _mm256_fmadd_ps(t, b0, c##row##0);         \
    c##row##1 = _mm256_fmadd_ps(t, b1, c##row##1);         \
  }
    // One k step: one 64-byte line of the packed panel, MR broadcasts, 2·MR FMAs.  B arrives from L3 on the first
    // row tile of each panel; the hardware prefetcher alone left ~5% on the table at DeiT-B shapes
    // (docs/performance.md), so ask for the line kPrefetchLines k-steps ahead.  For later row tiles the line is
    // already in L1/L2 and the prefetch is a spare load-port slot.  (Prefetches past the buffer never fault.)
#define VITFAST_AVX2_STEP()                                                              \
  {                                                                                      \
    const __m256 b0 = _mm256_load_ps(b);                                                 \
    const __m256 b1 = _mm256_load_ps(b + 8);                                             \
    _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * kNr), _MM_HINT_T0);  \
    b += kNr;                                                                            \
    VITFAST_AVX2_ROW(0, a0, 0)                                                           \
    VITFAST_AVX2_ROW(1, a0, lda)                                                         \
    VITFAST_AVX2_ROW(2, a0, 2 * lda)                                                     \
    VITFAST_AVX2_ROW(3, a3, 0)                                                           \
    VITFAST_AVX2_ROW(4, a3, lda)                                                         \
    VITFAST_AVX2_ROW(5, a3, 2 * lda)                                                     \
    ++a0;                                                                                \
    ++a3;                                                                                \
  }
    // The next panel's lines to L2, one per kNextPairStride steps, for the tiles that have a share
    // (next_pair_prefetch.h): the first tile of each panel otherwise waits on L3.
    static_assert(kNextPairStride == 4, "the loop below issues one next-panel prefetch per four written-out steps");
    const bool has_next = e.next.next != e.next.next_end;
    const char* next = e.next.next;
    const char* const next_last = has_next ? e.next.next_end - 64 : nullptr;
    // Two ranges of k, with the epilogue's C and addend lines prefetched in between.  A row tile reads one
    // 64-byte line from each of 6 rows of the residual (3 KiB apart at DeiT-B), which neither stays in L2 between
    // panels nor is caught by the hardware prefetcher: without this, the residual GEMM of channel_idle_ffn ran
    // ~5% slower than the same GEMM without a residual; with it, same bits, and attention's P·V (K = N = 197 or
    // 577) unchanged (docs/performance.md).  A short K (the K = 64 score GEMM) has nothing to hide it behind and
    // skips it.  Whether C is read (accumulate) or only written made no difference: always prefetched.
    const int64_t k_tail = k > kCPrefetchSteps ? k - kCPrefetchSteps : 0;
    for (int64_t p_begin = 0, p_end = k_tail, pass = 0; pass < 2; ++pass, p_begin = p_end, p_end = k) {
      if (pass == 1 && k_tail > 0) prefetch_tile_rows<MR>(c, ldc, e);
      int64_t p = p_begin;
      if (has_next) {
        for (; p + kNextPairStride <= p_end; p += kNextPairStride) {
          _mm_prefetch(next, _MM_HINT_T1);
          next += next < next_last ? 64 : 0;
          VITFAST_AVX2_STEP()
          VITFAST_AVX2_STEP()
          VITFAST_AVX2_STEP()
          VITFAST_AVX2_STEP()
        }
      }
#pragma GCC unroll 4
      for (; p < p_end; ++p) VITFAST_AVX2_STEP()
    }
#undef VITFAST_AVX2_STEP
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
        if (e.row_scale != nullptr) {
          const __m256 rs = _mm256_set1_ps(e.row_scale[i]);
          acc0[i] = _mm256_mul_ps(acc0[i], rs);
          acc1[i] = _mm256_mul_ps(acc1[i], rs);
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
        if (e.row_scale != nullptr) {
          const __m256 rs = _mm256_set1_ps(e.row_scale[i]);
          acc0[i] = _mm256_mul_ps(acc0[i], rs);
          acc1[i] = _mm256_mul_ps(acc1[i], rs);
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

void gemm_block_avx2(const GemmBlockArgs& args) { run_gemm_block<Avx2Tile>(args); }

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

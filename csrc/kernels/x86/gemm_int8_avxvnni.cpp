// AVX-VNNI int8 kernel (Int8Kernel::kAvxVnni): 6 × 16 register tiles of the VEX-encoded 256-bit `vpdpbusd`, for
// CPUs with AVX2 and AVX-VNNI but no AVX-512 (Intel's client cores since Alder Lake, the laptop CPUs among them;
// cpuid 7.1 eax bit 4).  The AVX2 path's other int8 code (quantize_rows, attention's packing, softmax_quantize_rows)
// stays the AVX2 one: only the GEMM has an instruction to gain.
//
// `vpdpbusd` multiplies u8 × s8 and sums each four products into an s32 lane with no intermediate saturation, so it
// takes the AVX-512 VNNI kernel's operands as they are: B in the u8 form (qw + 128, gemm_int8.h's 64-byte groups:
// one 16-column panel group = two ymm, columns 0-7 then 8-15) and the s8 activations broadcast four bytes at a
// time; the epilogue subtracts 128·rowsum[r] (exact in int32 for k < 66 000, as in gemm_int8_avx512.cpp).
// Per row and 4-k group: 1 broadcast + 2 `vpdpbusd` for 64 multiply-adds, against the AVX2 kernel's 9 instructions
// (x86/gemm_int8_avx2.cpp: no int8 dot product there).  Six rows: 12 accumulators + 2 B vectors + the broadcast =
// 15 of the 16 ymm registers, the fp32 AVX2 GEMM's tile shape (x86/gemm_avx2.cpp).
// The epilogue is the AVX2 kernel's (x86/int8_epilogue_avx2.inc), in gemm_int8_isa.h's order after the offset: the
// same fp32 bits as every other kernel (GELU: the AVX2 polynomial, gelu8).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,avxvnni")
#endif

#include <immintrin.h>
#include <stdint.h>

#include "kernels/gemm_int8_isa.h"
#include "kernels/x86/avx2_math.h"

namespace vitfast {
namespace gemm8 {
namespace {

constexpr int kNr = 16;
constexpr int kMr = 6;
constexpr int64_t kPrefetchLines = 64;

#include "kernels/x86/int8_epilogue_avx2.inc"

template <int MR>
static inline __attribute__((always_inline)) void tile(int64_t groups, const int8_t* a, int64_t lda, const int8_t* b,
                                                       const float* sa, const int32_t* rowsum, float* c, int64_t ldc,
                                                       const Epi& e) {
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define VITFAST_AVXVNNI_ROW(row)                                \
  if (MR > row) {                                               \
    const __m256i t = bcast4(a + row * lda);                    \
    c##row##0 = _mm256_dpbusd_avx_epi32(c##row##0, b0, t);      \
    c##row##1 = _mm256_dpbusd_avx_epi32(c##row##1, b1, t);      \
  }
  for (int64_t p = 0; p < groups; ++p) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 32));
    _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * 64), _MM_HINT_T0);
    b += 64;
    VITFAST_AVXVNNI_ROW(0)
    VITFAST_AVXVNNI_ROW(1)
    VITFAST_AVXVNNI_ROW(2)
    VITFAST_AVXVNNI_ROW(3)
    VITFAST_AVXVNNI_ROW(4)
    VITFAST_AVXVNNI_ROW(5)
    a += 4;
  }
#undef VITFAST_AVXVNNI_ROW
  store_row(c00, c01, 128 * rowsum[0], sa[0], e, c, 0);
  if (MR > 1) store_row(c10, c11, 128 * rowsum[1], sa[1], e, c + ldc, 1);
  if (MR > 2) store_row(c20, c21, 128 * rowsum[2], sa[2], e, c + 2 * ldc, 2);
  if (MR > 3) store_row(c30, c31, 128 * rowsum[3], sa[3], e, c + 3 * ldc, 3);
  if (MR > 4) store_row(c40, c41, 128 * rowsum[4], sa[4], e, c + 4 * ldc, 4);
  if (MR > 5) store_row(c50, c51, 128 * rowsum[5], sa[5], e, c + 5 * ldc, 5);
}

}  // namespace

void gemm_int8_block_avxvnni(const Int8BlockArgs& g) {
  const int64_t groups = g.k4 / 4;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const int8_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    Epi e = panel_epilogue(g, col);
    for (int64_t i = 0; i < g.m; i += kMr) {
      const int8_t* a = g.a + i * g.lda;
      float* c = g.c + i * g.ldc + col;
      const float* sa = g.sa + i;
      const int32_t* rs = g.rowsum + i;
      e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
      switch (g.m - i >= kMr ? kMr : g.m - i) {
        case 6: tile<6>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
        case 5: tile<5>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
        case 4: tile<4>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
        case 3: tile<3>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
        case 2: tile<2>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
        default: tile<1>(groups, a, g.lda, bp, sa, rs, c, g.ldc, e); break;
      }
    }
  }
}

}  // namespace gemm8
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

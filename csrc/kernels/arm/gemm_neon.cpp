// NEON GEMM micro-kernels (6 × 16: 24 q-register accumulators, vfmaq_f32) with the fused epilogue (bias,
// erf-GELU, addend), driven by run_gemm_block (gemm_driver.h).  NEON is baseline on aarch64, so no target
// pragma is needed; the same plain-header rule as the x86 files keeps the file free of STL templates.
#include <arm_neon.h>
#include <stdint.h>

#include "kernels/arm/neon_math.h"
#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {
namespace {

using arm::gelu4;

struct NeonTile {
  template <int MR>
  static inline __attribute__((always_inline)) void tile(int64_t k, const float* a, int64_t lda, const float* b,
                                                         float* c, int64_t ldc, const TileEpilogue& e) {
    float32x4_t acc[MR][4];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = vdupq_n_f32(0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float* bp = b + p * kNr;
      // Same B prefetch as the AVX2 path (see kPrefetchLines in x86/gemm_avx2.cpp); harmless past the end of the buffer.
      __builtin_prefetch(bp + 64 * kNr);
      const float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4), b2 = vld1q_f32(bp + 8),
                        b3 = vld1q_f32(bp + 12);
      for (int i = 0; i < MR; ++i) {
        const float32x4_t ai = vld1q_dup_f32(a + i * lda + p);
        acc[i][0] = vfmaq_f32(acc[i][0], ai, b0);
        acc[i][1] = vfmaq_f32(acc[i][1], ai, b1);
        acc[i][2] = vfmaq_f32(acc[i][2], ai, b2);
        acc[i][3] = vfmaq_f32(acc[i][3], ai, b3);
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc;
      if (e.n_store == kNr) {
        for (int j = 0; j < 4; ++j) {
          float32x4_t v = acc[i][j];
          if (e.load_c) v = vaddq_f32(v, vld1q_f32(ci + 4 * j));
          if (e.row_scale != nullptr) v = vmulq_n_f32(v, e.row_scale[i]);
          if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
          if (e.gelu) v = gelu4(v);
          if (e.addend != nullptr) v = vaddq_f32(v, vld1q_f32(e.addend + i * e.ld_addend + 4 * j));
          vst1q_f32(ci + 4 * j, v);
        }
      } else {
        // Tail panel: go through a stack tile so no byte past column n is read or written.
        float t[kNr] = {0};
        for (int j = 0; j < 4; ++j) vst1q_f32(t + 4 * j, acc[i][j]);
        if (e.load_c)
          for (int j = 0; j < e.n_store; ++j) t[j] += ci[j];
        if (e.row_scale != nullptr)
          for (int j = 0; j < kNr; ++j) t[j] *= e.row_scale[i];
        for (int j = 0; j < 4; ++j) {
          float32x4_t v = vld1q_f32(t + 4 * j);
          if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
          if (e.gelu) v = gelu4(v);
          vst1q_f32(t + 4 * j, v);
        }
        if (e.addend != nullptr)
          for (int j = 0; j < e.n_store; ++j) t[j] += e.addend[i * e.ld_addend + j];
        for (int j = 0; j < e.n_store; ++j) ci[j] = t[j];
      }
    }
  }
};

}  // namespace

void gemm_block_neon(const GemmBlockArgs& args) { run_gemm_block<NeonTile>(args); }

}  // namespace gemm
}  // namespace vitfast

// Portable GEMM micro-kernel: the "scalar" path, always compiled, the fallback on any CPU.  No ISA-specific
// intrinsics: plain C++ plus the compiler's generic 4-wide vector type, which lowers to the *baseline* ISA
// only (SSE2 on x86-64, NEON on aarch64, scalar code elsewhere).  Same 6 × 16 block and driver as the SIMD
// paths.  GELU uses std::erf (scalar_math.h).
#include "kernels/gemm_driver.h"
#include "kernels/gemm_isa.h"
#include "kernels/scalar_math.h"

namespace vitfast {
namespace gemm {
namespace {

struct ScalarTile {
  template <int MR>
  static void tile(int64_t k, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                   const TileEpilogue& e) {
    // Portable 4-wide vectors (GCC/Clang vector extension: SSE2 on x86-64, NEON on ARM, plain scalar code
    // elsewhere), two passes of 8 columns so MR × 2 accumulators fit 16 registers.  Plain nested loops
    // over a float[6][16] block were vectorised across rows by GCC and ran at ~3.5 GFLOP/s.
    typedef float v4 __attribute__((vector_size(16)));
    float acc[MR][kNr];
    for (int half = 0; half < kNr; half += 8) {
      v4 h0[MR], h1[MR];
      for (int i = 0; i < MR; ++i) h0[i] = h1[i] = v4{0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t p = 0; p < k; ++p) {
        v4 b0, b1;
        __builtin_memcpy(&b0, b + p * kNr + half, sizeof(v4));
        __builtin_memcpy(&b1, b + p * kNr + half + 4, sizeof(v4));
        for (int i = 0; i < MR; ++i) {
          const float ai = a[i * lda + p];
          h0[i] += ai * b0;
          h1[i] += ai * b1;
        }
      }
      for (int i = 0; i < MR; ++i) {
        __builtin_memcpy(&acc[i][half], &h0[i], sizeof(v4));
        __builtin_memcpy(&acc[i][half + 4], &h1[i], sizeof(v4));
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc;
      for (int j = 0; j < e.n_store; ++j) {
        float v = acc[i][j];
        if (e.load_c) v += ci[j];
        if (e.row_scale != nullptr) v *= e.row_scale[i];
        if (e.bias != nullptr) v += e.bias[j];
        if (e.gelu) v = gelu1(v);
        if (e.addend != nullptr) v += e.addend[i * e.ld_addend + j];
        ci[j] = v;
      }
    }
  }
};

}  // namespace

void gemm_block_scalar(const GemmBlockArgs& args) { run_gemm_block<ScalarTile>(args); }

}  // namespace gemm
}  // namespace vitfast

// The portable bf16 GEMM (see gemm_bf16.h): each product of two bf16 values computed exactly in fp32 (8 + 8
// significant bits), summed in fp32 in k order, the fp32 epilogue.  The reference of the C++ tests and the fallback
// when a hardware kernel is asked for on a CPU without it.
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_isa.h"
#include "kernels/scalar_math.h"

namespace vitfast {
namespace gemm16 {
namespace {

inline float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void gemm_bf16_block_scalar(const Bf16BlockArgs& g) {
  using gemm::kNr;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const uint16_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const int64_t valid = g.n - col;
    const int n_store = (valid >= kNr || (g.c_padded && g.addend == nullptr)) ? int(kNr) : int(valid);
    for (int64_t i = 0; i < g.m; ++i) {
      const uint16_t* a = g.a + i * g.lda;
      float acc[kNr] = {0};
      for (int64_t q = 0; q < g.k2 / 2; ++q) {
        const float a0 = widen(a[2 * q]), a1 = widen(a[2 * q + 1]);
        const uint16_t* bq = bp + q * 2 * kNr;
        for (int j = 0; j < kNr; ++j) {
          // Both products are exact; the pair is summed first, as vdpbf16ps / bfdot do.
          acc[j] += a0 * widen(bq[2 * j]) + a1 * widen(bq[2 * j + 1]);
        }
      }
      float* ci = g.c != nullptr ? g.c + i * g.ldc + col : nullptr;
      uint16_t* c16 = g.c16 != nullptr ? g.c16 + i * g.ldc16 + col : nullptr;
      for (int j = 0; j < n_store; ++j) {
        float v = acc[j];
        if (g.row_scale != nullptr) v *= g.row_scale[i];
        if (g.accumulate) v += ci[j];
        if (g.bias != nullptr) v += g.bias[col + j];
        if (g.gelu) v = gemm::gelu_for_bf16(v);
        if (g.addend != nullptr) v += g.addend[i * g.ld_addend + col + j];
        if (ci != nullptr) ci[j] = v;
        if (c16 != nullptr) c16[j] = to_bf16(v);
      }
    }
  }
}

}  // namespace gemm16
}  // namespace vitfast

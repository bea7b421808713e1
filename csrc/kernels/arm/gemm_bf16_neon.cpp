// ARM BF16 GEMM micro-kernels: `bfdot` (vbfdotq_f32: per 32-bit lane, two bf16 products summed into fp32), 6 × 16
// tiles with 24 q-register accumulators as the fp32 NEON path (gemm_neon.cpp), over pairs of k.  One k-pair step:
// the panel's 64 bytes (16 columns × 2 k) are 4 q registers, each row's 32-bit pair is duplicated into a q register,
// 24 bfdot = 192 products, twice the fp32 tile's products per instruction (layout and numerics: gemm_bf16.h).
//
// BF16 (ARMv8.6, optional from v8.2) is enabled for this file only (arch=armv8.2-a+bf16: the target arm_neon.h
// declares its bf16 intrinsics under; a bare "+bf16" fails to inline them); cpu_features checks HWCAP2_BF16.  Only
// arm_neon.h and plain headers (gemm_bf16_isa.h explains why).
#pragma GCC target("arch=armv8.2-a+bf16")

#include <arm_neon.h>
#include <stdint.h>

#include "kernels/arm/neon_math.h"
#include "kernels/gemm_bf16_isa.h"

namespace vitfast {
namespace gemm16 {
namespace {

// gemm16::to_bf16 (round to nearest even, NaN kept quiet), with internal linkage for this file's target.
inline uint16_t round_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

using arm::gelu4_for_bf16;
using gemm::kNr;

constexpr int kMrNeon = 6;

struct TileEpilogue {
  bool load_c;
  const float* bias;    // kNr values (zero padded) or nullptr
  bool gelu;
  const float* addend;  // at this tile's (row 0, col 0), or nullptr
  int64_t ld_addend;
  int n_store;          // 1..kNr
  const float* row_scale;  // at this tile's row 0, or nullptr
  uint16_t* c16;           // the bf16 copy at this tile's (row 0, col 0), or nullptr; c is then nullptr or not
  int64_t ldc16;
};

template <int MR>
static inline __attribute__((always_inline)) void tile(int64_t steps, const uint16_t* a, int64_t lda,
                                                       const uint16_t* b, float* c, int64_t ldc,
                                                       const TileEpilogue& e) {
  float32x4_t acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = vdupq_n_f32(0.0f);
  for (int64_t p = 0; p < steps; ++p) {
    const uint16_t* bp = b + p * 2 * kNr;
    __builtin_prefetch(bp + 64 * 2 * kNr);
    const bfloat16x8_t b0 = vreinterpretq_bf16_u16(vld1q_u16(bp)), b1 = vreinterpretq_bf16_u16(vld1q_u16(bp + 8)),
                       b2 = vreinterpretq_bf16_u16(vld1q_u16(bp + 16)),
                       b3 = vreinterpretq_bf16_u16(vld1q_u16(bp + 24));
    for (int i = 0; i < MR; ++i) {
      uint32_t pair;
      __builtin_memcpy(&pair, a + i * lda + 2 * p, 4);
      const bfloat16x8_t ai = vreinterpretq_bf16_u32(vdupq_n_u32(pair));
      acc[i][0] = vbfdotq_f32(acc[i][0], ai, b0);
      acc[i][1] = vbfdotq_f32(acc[i][1], ai, b1);
      acc[i][2] = vbfdotq_f32(acc[i][2], ai, b2);
      acc[i][3] = vbfdotq_f32(acc[i][3], ai, b3);
    }
  }
  // The fp32 NEON path's epilogue: in registers for a whole panel, through a stack tile for a partial one; a bf16
  // copy (c16) from the finished values.
  for (int i = 0; i < MR; ++i) {
    float* ci = c != nullptr ? c + i * ldc : nullptr;
    if (e.row_scale != nullptr)
      for (int j = 0; j < 4; ++j) acc[i][j] = vmulq_n_f32(acc[i][j], e.row_scale[i]);
    float t[kNr] = {0};
    if (e.n_store == kNr) {
      for (int j = 0; j < 4; ++j) {
        float32x4_t v = acc[i][j];
        if (e.load_c) v = vaddq_f32(v, vld1q_f32(ci + 4 * j));
        if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
        if (e.gelu) v = gelu4_for_bf16(v);
        if (e.addend != nullptr) v = vaddq_f32(v, vld1q_f32(e.addend + i * e.ld_addend + 4 * j));
        if (ci != nullptr) vst1q_f32(ci + 4 * j, v);
        if (e.c16 != nullptr) vst1q_f32(t + 4 * j, v);
      }
    } else {
      for (int j = 0; j < 4; ++j) vst1q_f32(t + 4 * j, acc[i][j]);
      if (e.load_c)
        for (int j = 0; j < e.n_store; ++j) t[j] += ci[j];
      for (int j = 0; j < 4; ++j) {
        float32x4_t v = vld1q_f32(t + 4 * j);
        if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * j));
        if (e.gelu) v = gelu4_for_bf16(v);
        vst1q_f32(t + 4 * j, v);
      }
      if (e.addend != nullptr)
        for (int j = 0; j < e.n_store; ++j) t[j] += e.addend[i * e.ld_addend + j];
      if (ci != nullptr)
        for (int j = 0; j < e.n_store; ++j) ci[j] = t[j];
    }
    if (e.c16 != nullptr)
      for (int j = 0; j < e.n_store; ++j) e.c16[i * e.ldc16 + j] = round_bf16(t[j]);
  }
}

}  // namespace

void gemm_bf16_block_neon(const Bf16BlockArgs& g) {
  const int64_t steps = g.k2 / 2;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const uint16_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const int64_t valid = g.n - col;
    TileEpilogue e;
    e.load_c = g.accumulate;
    e.bias = g.bias != nullptr ? g.bias + col : nullptr;
    e.gelu = g.gelu;
    e.ld_addend = g.ld_addend;
    e.n_store = (valid >= kNr || (g.c_padded && g.addend == nullptr)) ? int(kNr) : int(valid);
    for (int64_t i = 0; i < g.m; i += kMrNeon) {
      const uint16_t* a = g.a + i * g.lda;
      float* c = g.c != nullptr ? g.c + i * g.ldc + col : nullptr;
      e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
      e.row_scale = g.row_scale != nullptr ? g.row_scale + i : nullptr;
      e.c16 = g.c16 != nullptr ? g.c16 + i * g.ldc16 + col : nullptr;
      e.ldc16 = g.ldc16;
      switch (g.m - i >= kMrNeon ? kMrNeon : g.m - i) {
        case 6: tile<6>(steps, a, g.lda, bp, c, g.ldc, e); break;
        case 5: tile<5>(steps, a, g.lda, bp, c, g.ldc, e); break;
        case 4: tile<4>(steps, a, g.lda, bp, c, g.ldc, e); break;
        case 3: tile<3>(steps, a, g.lda, bp, c, g.ldc, e); break;
        case 2: tile<2>(steps, a, g.lda, bp, c, g.ldc, e); break;
        default: tile<1>(steps, a, g.lda, bp, c, g.ldc, e); break;
      }
    }
  }
}

}  // namespace gemm16
}  // namespace vitfast

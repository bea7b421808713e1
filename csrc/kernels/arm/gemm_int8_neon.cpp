// NEON int8 code: the dot-product kernel (Int8Kernel::kNeonDot: 4 × 16 register tiles of `sdot`) and the NEON
// quantize_rows (plain NEON, the kNeon path).
//
// `sdot vd.4s, vn.16b, vm.4b[l]` adds, to each s32 lane i, the four s8 × s8 products of bytes 4i..4i+3 of vn with
// bytes 4l..4l+3 of vm, exactly.  vn is a quarter of a packed B group (4 columns × 4 k), vm 16 bytes of one A row
// (4 groups of 4 k), so one A load serves four groups (lanes 0-3) and no offset form of B is needed (both
// operands are signed).  4 rows: 16 accumulators + 4 A + 4 B registers of the 32.
//
// The dot-product instructions are an extension (FEAT_DotProd, optional from Armv8.2): the kernel is compiled
// for it under push_options/pop_options only, and int8_kernel() picks it when cpu_has(kNeonDotProd) (HWCAP_ASIMDDP).
// GCC 12's arm_neon.h defines vdotq_laneq_s32 under target("arch=armv8.2-a+dotprod"), so the caller needs that
// arch string too ("+dotprod" alone on the default armv8-a is a target mismatch for the always_inline
// intrinsic).  The quantizer above the region is baseline NEON.
#include <arm_neon.h>
#include <stdint.h>

#include "kernels/arm/neon_math.h"
#include "kernels/gemm_int8_isa.h"

namespace vitfast {
namespace gemm8 {

// The scalar definition (gemm_int8_scalar.cpp) 8 lanes at a time, with quantize_rows_avx512's two shortcuts (see
// there for why the codes agree): the row maximum as the unsigned maximum of |x|'s bit patterns (a NaN or ±Inf
// pattern is above FLT_MAX's, so one compare after the loop finds it), two chains in flight, and no clamp before
// FCVTNS (round to nearest, ties to even): |x · 127/amax| < 127.5 by construction.  Per 8 values the first pass is
// 2 ANDs and 2 unsigned maxima where it was 2 FABS, 2 FCMLE, 3 ANDs and 2 FMAX, the second pass 2 FMULs and 2
// FCVTNS where it was 6 more (instruction counts: the codes are checked under qemu, the speed is unmeasured on Arm
// hardware).  A tail of fewer than 8 values goes through the same vector code from a zero-filled copy.
void quantize_rows_neon(const QuantizeArgs& q) {
  const int64_t k = q.k, k4 = (k + 3) / 4 * 4;
  const uint32x4_t abs_mask = vdupq_n_u32(0x7FFFFFFFu);
  const uint32_t fmax_bits = 0x7F7FFFFFu;  // FLT_MAX
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* x = q.x + r * q.ldx;
    int8_t* out = q.qa + r * q.lda;
    uint32x4_t m0 = vdupq_n_u32(0), m1 = m0;
    auto load8 = [&](int64_t c, float32x4_t& v0, float32x4_t& v1) {
      float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ctmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float* px = x + c;
      const float* pc = q.col_scale != nullptr ? q.col_scale + c : nullptr;
      if (k - c < 8) {
        for (int64_t j = 0; j < k - c; ++j) {
          tmp[j] = px[j];
          if (pc != nullptr) ctmp[j] = pc[j];
        }
        px = tmp;
        pc = pc != nullptr ? ctmp : nullptr;
      }
      v0 = vld1q_f32(px);
      v1 = vld1q_f32(px + 4);
      if (pc != nullptr) {
        v0 = vmulq_f32(v0, vld1q_f32(pc));
        v1 = vmulq_f32(v1, vld1q_f32(pc + 4));
      }
    };
    for (int64_t c = 0; c < k; c += 8) {
      float32x4_t v0, v1;
      load8(c, v0, v1);
      m0 = vmaxq_u32(m0, vandq_u32(vreinterpretq_u32_f32(v0), abs_mask));
      m1 = vmaxq_u32(m1, vandq_u32(vreinterpretq_u32_f32(v1), abs_mask));
    }
    const uint32_t bits = vmaxvq_u32(vmaxq_u32(m0, m1));
    const bool finite = bits <= fmax_bits;  // no NaN or ±Inf in the row
    float amax;
    __builtin_memcpy(&amax, &bits, sizeof amax);
    const float inv = 127.0f / amax;
    const bool zero = finite && !(inv <= 3.402823466e+38f);
    int32x4_t vsum = vdupq_n_s32(0);
    if (finite && !zero) {
      for (int64_t c = 0; c < k; c += 8) {
        float32x4_t v0, v1;
        load8(c, v0, v1);
        const int32x4_t i0 = vcvtnq_s32_f32(vmulq_n_f32(v0, inv));
        const int32x4_t i1 = vcvtnq_s32_f32(vmulq_n_f32(v1, inv));
        vsum = vaddq_s32(vsum, vaddq_s32(i0, i1));
        const int8x8_t b = vmovn_s16(vcombine_s16(vmovn_s32(i0), vmovn_s32(i1)));
        if (k - c >= 8) {
          vst1_s8(out + c, b);
        } else {
          int8_t tmp[8];
          vst1_s8(tmp, b);
          for (int64_t j = 0; j < k - c; ++j) out[c + j] = tmp[j];
        }
      }
    } else {
      for (int64_t c = 0; c < k; ++c) out[c] = 0;
    }
    for (int64_t c = k; c < k4; ++c) out[c] = 0;
    q.sa[r] = !finite ? __builtin_nanf("") : (zero ? 0.0f : amax / 127.0f);
    q.rowsum[r] = vaddvq_s32(vsum);
  }
}

}  // namespace gemm8
}  // namespace vitfast

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")

namespace vitfast {
namespace gemm8 {
namespace {

using arm::gelu4;

constexpr int kNr = 16;
constexpr int kMrNeon = 4;

struct Epi {
  bool load_c;
  const float* bias;     // 16 values at this panel's column, or nullptr
  const float* w_scale;  // 16 values at this panel's column
  bool gelu;
  const float* addend;   // at this tile's (row 0, col 0), or nullptr
  int64_t ld_addend;
  int n_store;           // 1..16
};

static inline __attribute__((always_inline)) void store_row(const int32x4_t* acc, float sa, const Epi& e, float* ci,
                                                            int64_t row) {
  // A partial panel goes through zero-filled copies of C and the addend, so the vector code is the same.
  float cbuf[16], abuf[16];
  const bool whole = e.n_store == kNr;
  const float* addend = e.addend != nullptr ? e.addend + row * e.ld_addend : nullptr;
  const float* cin = ci;
  if (!whole) {
    for (int j = 0; j < kNr; ++j) {
      cbuf[j] = (e.load_c && j < e.n_store) ? ci[j] : 0.0f;
      abuf[j] = (addend != nullptr && j < e.n_store) ? addend[j] : 0.0f;
    }
    cin = cbuf;
    if (addend != nullptr) addend = abuf;
  }
  float res[16];
  float* dst = whole ? ci : res;
  for (int h = 0; h < 4; ++h) {
    float32x4_t v = vcvtq_f32_s32(acc[h]);
    v = vmulq_n_f32(v, sa);
    v = vfmaq_f32(e.load_c ? vld1q_f32(cin + 4 * h) : vdupq_n_f32(0.0f), v, vld1q_f32(e.w_scale + 4 * h));
    if (e.bias != nullptr) v = vaddq_f32(v, vld1q_f32(e.bias + 4 * h));
    if (e.gelu) v = gelu4(v);
    if (addend != nullptr) v = vaddq_f32(v, vld1q_f32(addend + 4 * h));
    vst1q_f32(dst + 4 * h, v);
  }
  if (!whole)
    for (int j = 0; j < e.n_store; ++j) ci[j] = res[j];
}

template <int MR>
static inline __attribute__((always_inline)) void tile(int64_t groups, const int8_t* a, int64_t lda, const int8_t* b,
                                                       const float* sa, float* c, int64_t ldc, const Epi& e) {
  int32x4_t acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = vdupq_n_s32(0);
  int64_t p = 0;
  // Four groups (16 k) per A load; lanes 0-3 of the A vector are groups p..p+3.
  for (; p + 4 <= groups; p += 4) {
    int8x16_t av[MR];
    for (int i = 0; i < MR; ++i) av[i] = vld1q_s8(a + i * lda + 4 * p);
    const int8_t* bp = b + p * 64;
    __builtin_prefetch(bp + 64 * 64);
#define VITFAST_SDOT_GROUP(l)                                                    \
  {                                                                              \
    const int8x16_t b0 = vld1q_s8(bp + 64 * l), b1 = vld1q_s8(bp + 64 * l + 16), \
                    b2 = vld1q_s8(bp + 64 * l + 32), b3 = vld1q_s8(bp + 64 * l + 48); \
    for (int i = 0; i < MR; ++i) {                                               \
      acc[i][0] = vdotq_laneq_s32(acc[i][0], b0, av[i], l);                      \
      acc[i][1] = vdotq_laneq_s32(acc[i][1], b1, av[i], l);                      \
      acc[i][2] = vdotq_laneq_s32(acc[i][2], b2, av[i], l);                      \
      acc[i][3] = vdotq_laneq_s32(acc[i][3], b3, av[i], l);                      \
    }                                                                            \
  }
    VITFAST_SDOT_GROUP(0)
    VITFAST_SDOT_GROUP(1)
    VITFAST_SDOT_GROUP(2)
    VITFAST_SDOT_GROUP(3)
#undef VITFAST_SDOT_GROUP
  }
  // Remaining groups one at a time (4-byte A loads: never read past the row's padded_k bytes).
  for (; p < groups; ++p) {
    const int8_t* bp = b + p * 64;
    const int8x16_t b0 = vld1q_s8(bp), b1 = vld1q_s8(bp + 16), b2 = vld1q_s8(bp + 32), b3 = vld1q_s8(bp + 48);
    for (int i = 0; i < MR; ++i) {
      int32_t v;
      __builtin_memcpy(&v, a + i * lda + 4 * p, 4);
      const int8x16_t ai = vreinterpretq_s8_s32(vdupq_n_s32(v));
      acc[i][0] = vdotq_laneq_s32(acc[i][0], b0, ai, 0);
      acc[i][1] = vdotq_laneq_s32(acc[i][1], b1, ai, 0);
      acc[i][2] = vdotq_laneq_s32(acc[i][2], b2, ai, 0);
      acc[i][3] = vdotq_laneq_s32(acc[i][3], b3, ai, 0);
    }
  }
  for (int i = 0; i < MR; ++i) store_row(acc[i], sa[i], e, c + i * ldc, i);
}

}  // namespace

void gemm_int8_block_neon_dot(const Int8BlockArgs& g) {
  const int64_t groups = g.k4 / 4;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const int8_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const int64_t valid = g.n - col;
    Epi e;
    e.load_c = g.accumulate;
    e.bias = g.bias != nullptr ? g.bias + col : nullptr;
    e.w_scale = g.w_scale + col;
    e.gelu = g.gelu;
    e.ld_addend = g.ld_addend;
    e.n_store = (valid >= kNr || (g.c_padded && g.addend == nullptr)) ? kNr : int(valid);
    for (int64_t i = 0; i < g.m; i += kMrNeon) {
      const int8_t* a = g.a + i * g.lda;
      float* c = g.c + i * g.ldc + col;
      e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
      switch (g.m - i >= kMrNeon ? kMrNeon : g.m - i) {
        case 4: tile<4>(groups, a, g.lda, bp, g.sa + i, c, g.ldc, e); break;
        case 3: tile<3>(groups, a, g.lda, bp, g.sa + i, c, g.ldc, e); break;
        case 2: tile<2>(groups, a, g.lda, bp, g.sa + i, c, g.ldc, e); break;
        default: tile<1>(groups, a, g.lda, bp, g.sa + i, c, g.ldc, e); break;
      }
    }
  }
}

}  // namespace gemm8
}  // namespace vitfast

#pragma GCC pop_options

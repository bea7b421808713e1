// AVX2 int8 kernel (Int8Kernel::kAvx2): 4 × 16 register tiles of `vpmaddubsw` + `vpmaddwd`, and the AVX2
// quantize_rows.
//
// vpmaddubsw multiplies u8 × s8 and adds pairs into s16 with saturation, so both operands are made safe first
// (the sign trick): u = |qw| ∈ [0, 127] and s = sign(qw)·qa ∈ [−127, 127] (vpsignb; qw = −128 is refused by the
// pack and quantize_rows clamps qa to ±127, as −(−128) does not exist in int8), whence u·s = qa·qw and a pair sum
// is at most 2·127² = 32258 < 2¹⁵ − 1: never saturated.  vpmaddwd by ones then adds the pairs into s32 lanes (the
// four products of one column).
// Per row and 4-k group: 1 broadcast, 2 vpsignb, 2 vpmaddubsw, 2 vpmaddwd, 2 vpaddd for 64 MACs.  The four
// multiplies are the instruction peak (`int8_gemm_peaks`); every other vector op competes with them for the same
// four pipes, so each one taken out of the loop counts.  |qw| comes with the pack (the AVX2 form of gemm_int8.h's
// layout: 128-byte groups, qw then |qw|; PackedInt8B and attention_int8's per-head K panels write it).  The former
// arrangement, |qa| per row (vpabsb) and sign(qa) on both B vectors, took one op more per row: 193 against 224
// GOPS at 197 × 256 × 256 on one Zen 4 core (int8_gemm_shapes has the current figures).
// Four rows: 8 accumulators, the four B vectors, ones and the per-row temporaries (GCC 12: no spill in this
// form's loop, 47 instructions a group; three rows measured no faster).
//
// The narrow form (every weight of the layer in [−64, 64]: vitfast.quantize(weight_bits=7)) needs no sign trick:
// the weights are the unsigned operand, u = qw + 64 ∈ [0, 128] (stored so by the pack), times s = qa ∈ [−127, 127]
// (the broadcast as it is), a pair sum at most 2·128·127 = 32512 < 2¹⁵ − 1, and Σ (qw + 64)·qa − 64·rowsum = Σ qa·qw
// exactly (rowsum from quantize_rows, removed in the epilogue as the VNNI kernels' 128·rowsum).  Per row and 4-k
// group: 1 broadcast (a load), 2 vpmaddubsw, 2 vpmaddwd, 2 vpaddd, and half the B bytes (no |qw|): the multiplies
// and their adds alone, as ONNX Runtime's AVX2 kernel (its u8 activations).  The form before made the activations
// the unsigned operand (B = qw, u = qa + 128 by a vpxor of each broadcast): one vector op more per row and group,
// and on an Intel core, where the multiplies take two of the three vector ports, 7 ops in 3 ports per 4 multiplies
// caps the loop at 86% of the multiplies' rate; that form measured 76–91% of the peak at DeiT shapes (three rows:
// four spilled two accumulators with the flip constant live), this one four rows (8 accumulators, 2 B vectors,
// ones, the broadcast and two products: 14 of the 16 ymm registers).
//
// The unsigned-A form (Int8BlockArgs::a_unsigned: attention's P, whose codes are in [0, 127]) needs neither: the
// broadcast codes are the unsigned operand against B's plain qw, a pair sum at most 2·127·127 = 32258, no offset.
// The same loop as the narrow form's, the operands swapped.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#include <immintrin.h>
#include <stdint.h>

#include "kernels/gemm_int8_isa.h"
#include "kernels/x86/avx2_math.h"

namespace vitfast {
namespace gemm8 {
namespace {

using x86::hmax8;
using x86::lane_mask;

constexpr int kNr = 16;
constexpr int kMrAvx2 = 4;
constexpr int64_t kPrefetchLines = 64;

#include "kernels/x86/int8_epilogue_avx2.inc"

// acc += v, in acc's own register.  Written as `acc = _mm256_add_epi32(acc, v)`, GCC 12 gave the narrow form's
// loop (not the wide one's) the sum in a fresh register and a vmovdqa back, per accumulator and k group, and at
// four rows two accumulators on the stack (48 instructions a group, 7 copies, 4 stack accesses; 36 and none with
// the sum pinned to the accumulator).
static inline __attribute__((always_inline)) void add_in_place(__m256i& acc, __m256i v) {
  asm("vpaddd %1, %0, %0" : "+x"(acc) : "x"(v));
}

// The three forms of the header comment.  Wide: B groups of 128 bytes, qw then |qw|, the sign trick per row; narrow:
// B groups of 64 bytes, u8 qw + 64 only, against the row's bytes as they are; unsigned A: B groups of 64 bytes, qw
// only, against the row's bytes as unsigned ones.
enum class Form { kWide, kNarrow, kUnsignedA };

// One tile: MR rows × 16 columns in form F.
template <Form F, int MR>
static inline __attribute__((always_inline)) void tile(int64_t groups, const int8_t* a, int64_t lda, const int8_t* b,
                                                       const float* sa, const int32_t* rowsum, float* c, int64_t ldc,
                                                       const Epi& e) {
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
          c31 = c00;
  const __m256i ones = _mm256_set1_epi16(1);
#define VITFAST_AVX2_I8_ROW(row)                                                      \
  if (MR > row) {                                                                     \
    const __m256i t = bcast4(a + row * lda);                                          \
    __m256i p0, p1;                                                                   \
    if constexpr (F == Form::kNarrow) {                                               \
      p0 = _mm256_maddubs_epi16(b0, t);                                               \
      p1 = _mm256_maddubs_epi16(b1, t);                                               \
    } else if constexpr (F == Form::kUnsignedA) {                                     \
      p0 = _mm256_maddubs_epi16(t, b0);                                               \
      p1 = _mm256_maddubs_epi16(t, b1);                                               \
    } else {                                                                          \
      p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(t, b0));                         \
      p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(t, b1));                         \
    }                                                                                 \
    add_in_place(c##row##0, _mm256_madd_epi16(p0, ones));                             \
    add_in_place(c##row##1, _mm256_madd_epi16(p1, ones));                             \
  }
  constexpr bool wide = F == Form::kWide;
  constexpr int64_t group_bytes = wide ? 128 : 64;
  for (int64_t p = 0; p < groups; ++p) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 32));
    // |qw|, the wide form's second half (unused, and not loaded, in the other forms)
    const __m256i u0 = wide ? _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 64)) : b0;
    const __m256i u1 = wide ? _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 96)) : b1;
    for (int64_t line = 0; line < group_bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchLines * 64 + line), _MM_HINT_T0);
    b += group_bytes;
    VITFAST_AVX2_I8_ROW(0)
    VITFAST_AVX2_I8_ROW(1)
    VITFAST_AVX2_I8_ROW(2)
    VITFAST_AVX2_I8_ROW(3)
    a += 4;
  }
#undef VITFAST_AVX2_I8_ROW
  // Columns 0-7 of the panel are bytes 0-31 of a group (acc *0), columns 8-15 bytes 32-63 (acc *1).
  auto offset = [&](int r) { return F == Form::kNarrow ? 64 * rowsum[r] : 0; };
  store_row(c00, c01, offset(0), sa[0], e, c, 0);
  if (MR > 1) store_row(c10, c11, offset(1), sa[1], e, c + ldc, 1);
  if (MR > 2) store_row(c20, c21, offset(2), sa[2], e, c + 2 * ldc, 2);
  if (MR > 3) store_row(c30, c31, offset(3), sa[3], e, c + 3 * ldc, 3);
}

template <Form F>
static void block(const Int8BlockArgs& g) {
  const int64_t groups = g.k4 / 4;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const int8_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    Epi e = panel_epilogue(g, col);
    constexpr int mr = kMrAvx2;
    for (int64_t i = 0; i < g.m; i += mr) {
      const int8_t* a = g.a + i * g.lda;
      float* c = g.c + i * g.ldc + col;
      const int32_t* rs = F == Form::kNarrow ? g.rowsum + i : nullptr;
      e.addend = g.addend != nullptr ? g.addend + i * g.ld_addend + col : nullptr;
      switch (g.m - i >= mr ? mr : g.m - i) {
        case 4: tile<F, 4>(groups, a, g.lda, bp, g.sa + i, rs, c, g.ldc, e); break;
        case 3: tile<F, 3>(groups, a, g.lda, bp, g.sa + i, rs, c, g.ldc, e); break;
        case 2: tile<F, 2>(groups, a, g.lda, bp, g.sa + i, rs, c, g.ldc, e); break;
        default: tile<F, 1>(groups, a, g.lda, bp, g.sa + i, rs, c, g.ldc, e); break;
      }
    }
  }
}

}  // namespace

void gemm_int8_block_avx2(const Int8BlockArgs& g) {
  if (g.narrow)
    block<Form::kNarrow>(g);
  else if (g.a_unsigned)
    block<Form::kUnsignedA>(g);
  else
    block<Form::kWide>(g);
}

namespace {

// 8 × 8 32-bit words transposed in registers: r[i] lane j <-> r[j] lane i.
static inline __attribute__((always_inline)) void transpose8_epi32(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

}  // namespace

// Row t's word w to dst + (t / 16) · panel_stride + w · 64 + (t % 16) · 4, XORed with flip, rows past `rows` of
// the last panel = flip (gemm_int8_isa.h); 8 rows (half a panel group) × 8 words per transpose.  Against the word
// loop: attention_int8 at DeiT-S (6 heads, batch 1, one thread, AVX-VNNI kernel) 317 -> 307 µs.
void pack_words_transposed_avx2(const int8_t* src, int64_t ld, int64_t rows, int64_t words, uint32_t flip,
                                int8_t* dst, int64_t panel_stride) {
  const __m256i vflip = _mm256_set1_epi32(int32_t(flip));
  const int64_t padded = (rows + 15) / 16 * 16;
  for (int64_t t0 = 0; t0 < padded; t0 += 8) {
    int8_t* half = dst + (t0 / 16) * panel_stride + (t0 % 16) * 4;
    for (int64_t w0 = 0; w0 < words; w0 += 8) {
      const int nw = words - w0 < 8 ? int(words - w0) : 8;
      const __m256i m = lane_mask(nw);
      __m256i r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_xor_si256(
            t0 + i < rows ? _mm256_maskload_epi32(reinterpret_cast<const int*>(src + (t0 + i) * ld + 4 * w0), m)
                          : _mm256_setzero_si256(),
            vflip);
      transpose8_epi32(r);
      for (int c = 0; c < nw; ++c) _mm256_storeu_si256(reinterpret_cast<__m256i*>(half + (w0 + c) * 64), r[c]);
    }
  }
}

// The scalar definition 8 lanes at a time, with quantize_rows_avx512's two shortcuts (see there for why the codes
// agree): the row maximum as the unsigned maximum of |x|'s bit patterns, four chains in flight (NaN / ±Inf found by
// one compare after the loop), and no clamp before the conversion.  Whole vectors are plain loads, the tail a masked
// one.  The codes are stored 32 at a time where a row has 32 left (x86::low_bytes32), else 8.  Measured (one core,
// 197 rows in L2, thread CPU time, on an AVX-512 host's AVX2 path) at K = 384 / 768 / 1536: 18.6 / 35.6 / 69.4 µs
// with masked loads, one max chain and the clamps, 9.1 / 17.1 / 35.4 µs now.
void quantize_rows_avx2(const QuantizeArgs& q) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const uint32_t fmax_bits = 0x7F7FFFFFu;  // FLT_MAX
  const int64_t k = q.k, k4 = (k + 3) / 4 * 4, k8 = k / 8 * 8, k32 = q.col_scale == nullptr ? k / 32 * 32 : 0;
  const float* cs = q.col_scale;
  // Columns [c, c + 8) (lanes = 8) or the tail [c, k) (masked: lanes past k load 0), times col_scale if any.
  auto load = [&](const float* x, int64_t c, int lanes) {
    __m256 v;
    if (lanes == 8) {
      v = _mm256_loadu_ps(x + c);
      if (cs != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(cs + c));
    } else {
      const __m256i m = lane_mask(lanes);
      v = _mm256_maskload_ps(x + c, m);
      if (cs != nullptr) v = _mm256_mul_ps(v, _mm256_maskload_ps(cs + c, m));
    }
    return v;
  };
  auto abs_bits = [&](__m256 v) { return _mm256_and_si256(_mm256_castps_si256(v), abs_mask); };
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* x = q.x + r * q.ldx;
    int8_t* out = q.qa + r * q.lda;
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    int64_t c = 0;
    for (; c < k32; c += 32) {
      m0 = _mm256_max_epu32(m0, abs_bits(_mm256_loadu_ps(x + c)));
      m1 = _mm256_max_epu32(m1, abs_bits(_mm256_loadu_ps(x + c + 8)));
      m2 = _mm256_max_epu32(m2, abs_bits(_mm256_loadu_ps(x + c + 16)));
      m3 = _mm256_max_epu32(m3, abs_bits(_mm256_loadu_ps(x + c + 24)));
    }
    for (; c < k; c += 8) m0 = _mm256_max_epu32(m0, abs_bits(load(x, c, c < k8 ? 8 : int(k - c))));
    __m256i vmax = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(vmax), _mm256_extracti128_si256(vmax, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    const uint32_t bits = uint32_t(_mm_cvtsi128_si32(h));
    const bool finite = bits <= fmax_bits;  // no NaN or ±Inf in the row
    float amax;
    __builtin_memcpy(&amax, &bits, sizeof amax);
    const float inv = 127.0f / amax;
    const bool zero = finite && !(inv <= 3.402823466e+38f);
    __m256i vsum = _mm256_setzero_si256();
    if (finite && !zero) {
      const __m256 vinv = _mm256_set1_ps(inv);
      // The codes of columns [c, c + lanes), summed (masked-off lanes load 0: code 0).
      auto code = [&](int64_t c, int lanes) {
        const __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(load(x, c, lanes), vinv));
        vsum = _mm256_add_epi32(vsum, i);
        return i;
      };
      c = 0;
      for (; c + 32 <= k; c += 32) {
        const __m256i i0 = code(c, 8), i1 = code(c + 8, 8), i2 = code(c + 16, 8), i3 = code(c + 24, 8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), x86::low_bytes32(i0, i1, i2, i3));
      }
      for (; c < k; c += 8) {
        const int lanes = k - c >= 8 ? 8 : int(k - c);
        const __m128i packed = x86::low_bytes8(code(c, lanes));
        if (lanes == 8) {
          _mm_storel_epi64(reinterpret_cast<__m128i*>(out + c), packed);
        } else {
          int8_t tmp[16];
          _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), packed);
          for (int j = 0; j < lanes; ++j) out[c + j] = tmp[j];
        }
      }
    } else {
      for (int64_t j = 0; j < k; ++j) out[j] = 0;
    }
    for (int64_t j = k; j < k4; ++j) out[j] = 0;
    q.sa[r] = !finite ? __builtin_nanf("") : (zero ? 0.0f : amax / 127.0f);
    q.rowsum[r] = x86::hsum8_epi32(vsum);
  }
}

}  // namespace gemm8
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

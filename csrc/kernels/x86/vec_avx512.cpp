// AVX-512 vector kernels over rows (contract: kernels/gemm_isa.h): the two row softmaxes of attention and the
// row LayerNorm, 16 lanes with opmask tails.  The standalone GELU of the AVX-512 path is gelu_avx2 (every AVX-512
// CPU has AVX2; the GEMM epilogue's GELU is gelu16, avx512_math.h).
//
// The ISA is enabled for this file only (no -mavx512f anywhere; never -march=native); cpu_features picks this
// path at run time.  Same include discipline as gemm_avx512.cpp (see gemm_isa.h).
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

#include "kernels/gemm_bf16.h"
#include "kernels/gemm_int8_isa.h"
#include "kernels/gemm_isa.h"
#include "kernels/x86/avx512_math.h"
#include "kernels/x86/vec_body.inc"

namespace vitfast {
#include "kernels/x86/softmax_exp_avx512.inc"

namespace x86 {
namespace {
// softmax_exp_row_group's output for attention_int8's P (gemm8::softmax_quantize_rows_avx512 below): each exp e
// becomes the code rne(e · 127), stored as a byte, with the row's codes summed and the unsigned maximum of the exps'
// bit patterns kept: an exp is >= 0 (or NaN), so that maximum is 1.0f's pattern exactly when the row's largest exp
// is 1 and it holds no NaN (every NaN pattern is above it) — one vpmaxud per vector where a float max, a NaN
// compare and a mask-or were three (no measurable change at 197 × 197, one core: the exp sets the pace).
struct ToInt8 {
  int8_t* q;
  int64_t lda;
  __m512i* emax;    // per row: max of the exps' bits
  __m512i* sum;     // per row
  inline __attribute__((always_inline)) __m512i code(int r, __m512 e) const {
    emax[r] = _mm512_max_epu32(_mm512_castps_si512(e), emax[r]);
    const __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(e, _mm512_set1_ps(127.0f)));
    sum[r] = _mm512_add_epi32(sum[r], i);
    return i;
  }
  inline __attribute__((always_inline)) void store(int r, int64_t j, __m512 e) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + r * lda + j), _mm512_cvtsepi32_epi8(code(r, e)));
  }
  inline __attribute__((always_inline)) void store_tail(int r, int64_t j, __mmask16 m, __m512 e) const {
    _mm512_mask_cvtsepi32_storeu_epi8(q + r * lda + j, m, code(r, _mm512_maskz_mov_ps(m, e)));
  }
  // The exp made for bf16 results (exp_poly.h: kExp2Bf16P; 10 vector operations against the fp32 exp's 16): the
  // codes keep 7 bits, and its relative error (<= 4.2e-6) moves one code at ~1e-4 of the exps.
  static inline __attribute__((always_inline)) __m512 exp(__m512 x) { return x86::exp16_for_bf16(x); }
  inline __attribute__((always_inline)) void finish(int r, int64_t n) const {
    for (int64_t c = n; c < (n + 3) / 4 * 4; ++c) q[r * lda + c] = 0;
  }
};

// The fallback's exps in place with ToInt8's exp (gemm8::softmax_quantize_rows' definition).
struct InPlaceForBf16 : InPlace {
  static inline __attribute__((always_inline)) __m512 exp(__m512 x) { return x86::exp16_for_bf16(x); }
};

// R rows of gemm8::softmax_quantize_rows_avx512 (see there).
template <int R>
inline __attribute__((always_inline)) void softmax_quantize_group(const gemm8::SoftmaxQuantizeArgs& a, int64_t r0) {
  __m512i emax[R];
  __m512i sum[R];
  float row_max[R], row_sum[R];
  for (int r = 0; r < R; ++r) {
    emax[r] = _mm512_setzero_si512();
    sum[r] = _mm512_setzero_si512();
    row_max[r] = -__builtin_inff();
  }
  softmax_exp_row_group<R, ToInt8>(a.s + r0 * a.ld, a.n, a.ld, _mm512_set1_ps(a.scale), row_max, row_sum,
                                   ToInt8{a.q + r0 * a.lda, a.lda, emax, sum});
  for (int r = 0; r < R; ++r) {
    if (_mm512_reduce_max_epu32(emax[r]) == 0x3F800000u) {  // max exp exactly 1.0f, no NaN
      a.sa[r0 + r] = 1.0f / 127.0f;  // amax / 127 with amax = 1
      a.rowsum[r0 + r] = _mm512_reduce_add_epi32(sum[r]);
    } else {  // the two steps on the stored t: pass 1 reads only (t · 1 = t), the same maximum, exps in place
      float* row = a.s + (r0 + r) * a.ld;
      float m1 = -__builtin_inff(), s1;
      softmax_exp_row_group<1, InPlaceForBf16, false>(row, a.n, a.ld, _mm512_set1_ps(1.0f), &m1, &s1,
                                                      InPlaceForBf16{{row, a.ld}});
      gemm8::quantize_rows_avx512(gemm8::QuantizeArgs{row, a.ld, 1, a.n, nullptr, a.q + (r0 + r) * a.lda, a.lda,
                                                      a.sa + r0 + r, a.rowsum + r0 + r});
    }
  }
}
}  // namespace
}  // namespace x86

namespace gemm8 {
// gemm_int8.h: softmax_quantize_rows.  softmax_exp_rows_avx512's row pairs with the exps turned into int8 codes as
// they are made (ToInt8); a row whose max exp is not exactly 1, or that holds a NaN, takes the two steps.
void softmax_quantize_rows_avx512(const SoftmaxQuantizeArgs& a) {
  int64_t r = 0;
  for (; r + 2 <= a.rows; r += 2) x86::softmax_quantize_group<2>(a, r);
  if (r < a.rows) x86::softmax_quantize_group<1>(a, r);
}
}  // namespace gemm8
}  // namespace vitfast

namespace vitfast {
namespace gemm {

using x86::exp16_nonpositive;

// The three passes of vec_body.inc (scale + max, exp + sum, normalise) at 16 lanes.
void softmax_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale) {
  softmax_rows<x86::Avx512>(s, rows, n, ld, scale);
}


// Two passes (gemm_isa.h): the scaled scores and their maximum, then exp(t − m) stored with its sum;
// 16 lanes and masked tails, rows in interleaved pairs.  Each row's arithmetic is the same whichever group it
// falls in, so a row's result does not depend on how many rows one call covers.
void softmax_exp_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2)
    x86::softmax_exp_row_group<2>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, x86::InPlace{s + r * ld, ld});
  if (r < rows)
    x86::softmax_exp_row_group<1>(s + r * ld, n, ld, vscale, row_max + r, row_sum + r, x86::InPlace{s + r * ld, ld});
}


namespace {

// Where layer_norm_group puts a normalised vector: fp32 rows (c apart), or bf16 rows (ld apart) rounded as
// gemm16::convert_rows rounds (round_bf16_16, the portable bits) with an odd c's pad element zero.
struct StoreF32 {
  float* y;
  int64_t c;
  inline __attribute__((always_inline)) void store(int r, int64_t j, __mmask16 m, __m512 v) const {
    _mm512_mask_storeu_ps(y + r * c + j, m, v);
  }
  void finish(int) const {}
};
struct StoreBf16 {
  uint16_t* y;
  int64_t ld, c;
  inline __attribute__((always_inline)) void store(int r, int64_t j, __mmask16 m, __m512 v) const {
    _mm256_mask_storeu_epi16(y + r * ld + j, m, _mm512_cvtepi32_epi16(x86::round_bf16_16(_mm512_castps_si512(v))));
  }
  void finish(int r) const {
    if (c % 2 != 0) y[r * ld + c] = 0;
  }
};

// R rows of layer_norm_rows at once (two passes and the normalisation), their reductions interleaved: one row
// alone waits on its sum's cross-lane reduction before the variance pass, and on the variance's before the
// normalisation; at ViT widths (12-48 vectors a row) those latencies, not the loads, set the pace.
template <int R, class Out>
static inline __attribute__((always_inline)) void layer_norm_group(const float* x, const Out& y, int64_t c,
                                                                   const float* gamma, const float* beta, float eps) {
  const __mmask16 tail = __mmask16((1u << (c % 16)) - 1u);
  const int64_t body = c - c % 16;
  // Pass 1 sums deviations from the row's first value (see layer_norm_rows_scalar): mean = x0 + Σ(x − x0)/c.
  __m512 s0[R], s1[R], e0[R], e1[R], mean[R], rstd[R], x0[R];
  float mean1[R];
  for (int r = 0; r < R; ++r) {
    s0[r] = s1[r] = _mm512_setzero_ps();
    x0[r] = _mm512_set1_ps(x[r * c]);
  }
  int64_t j = 0;
  for (; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
      s1[r] = _mm512_add_ps(s1[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), x0[r]));
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) s0[r] = _mm512_add_ps(s0[r], _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), x0[r]));
  if (j < c)
    for (int r = 0; r < R; ++r)
      s1[r] = _mm512_add_ps(s1[r], _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), x0[r]));
  for (int r = 0; r < R; ++r) {
    mean1[r] = x[r * c] + _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c);
    mean[r] = _mm512_set1_ps(mean1[r]);
    s0[r] = s1[r] = e0[r] = e1[r] = _mm512_setzero_ps();
  }
  // Pass 2: Σd² and Σd (the corrected two-pass of layer_norm_rows_scalar).
  for (j = 0; j + 32 <= body; j += 32)
    for (int r = 0; r < R; ++r) {
      const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j + 16), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d0);
      e1[r] = _mm512_add_ps(e1[r], d1);
      s0[r] = _mm512_fmadd_ps(d0, d0, s0[r]);
      s1[r] = _mm512_fmadd_ps(d1, d1, s1[r]);
    }
  for (; j < body; j += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + r * c + j), mean[r]);
      e0[r] = _mm512_add_ps(e0[r], d);
      s0[r] = _mm512_fmadd_ps(d, d, s0[r]);
    }
  if (j < c)
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + r * c + j), mean[r]);
      e1[r] = _mm512_add_ps(e1[r], d);
      s1[r] = _mm512_fmadd_ps(d, d, s1[r]);
    }
  for (int r = 0; r < R; ++r) {
    const float corr = _mm512_reduce_add_ps(_mm512_add_ps(e0[r], e1[r])) / float(c);
    // Spelled as one fused step: GCC contracts a product followed by a sum (-ffp-contract=fast) in some
    // instantiations of this template and not in others, so left to it a row's bits depended on its group size.
    const float var = __builtin_fmaf(-corr, corr, _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])) / float(c));
    rstd[r] = _mm512_set1_ps(1.0f / __builtin_sqrtf((var < 0.0f ? 0.0f : var) + eps));
    mean[r] = _mm512_set1_ps(mean1[r] + corr);
  }
  for (j = 0; j < c; j += 16) {
    const __mmask16 m = j + 16 <= c ? __mmask16(0xFFFF) : tail;
    const __m512 g = gamma != nullptr ? _mm512_maskz_loadu_ps(m, gamma + j) : _mm512_setzero_ps();
    const __m512 b = beta != nullptr ? _mm512_maskz_loadu_ps(m, beta + j) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      // (x − μ)·rstd, then ·γ + β: each product followed by a sum written as an FMA (see var above).
      const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + r * c + j), mean[r]);
      __m512 v;
      if (gamma != nullptr) {
        v = _mm512_mul_ps(d, rstd[r]);
        v = beta != nullptr ? _mm512_fmadd_ps(v, g, b) : _mm512_mul_ps(v, g);
      } else {
        v = beta != nullptr ? _mm512_fmadd_ps(d, rstd[r], b) : _mm512_mul_ps(d, rstd[r]);
      }
      y.store(r, j, m, v);
    }
  }
  for (int r = 0; r < R; ++r) y.finish(r);
}

// Rows in groups of four, then a pair, then one: each row's arithmetic is the same whichever group it falls in.  Four
// rows side by side hide more of each row's reduction latencies than two: the bf16 LayerNorm at 197 × 768 23.2-24.1 ->
// 20.2 µs from fp32 rows and 29.3-30.0 -> 25.5-26.5 µs from bf16 ones, the three-step form over the fp32 LayerNorm
// 33.4-34.2 -> 30.1-31.0 µs (benchmarks/bf16_kernel_parts.py, 16-row calls as the blocks make them, two runs of each
// build).  The group's body is forced inline: as an out-of-line call the gain was gone.
template <int R>
struct RowGroup {
  static constexpr int value = R;
};
template <class F>
static inline __attribute__((always_inline)) void in_row_groups(int64_t rows, const F& f) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) f(r, RowGroup<4>());
  if (r + 2 <= rows) {
    f(r, RowGroup<2>());
    r += 2;
  }
  if (r < rows) f(r, RowGroup<1>());
}

}  // namespace

// At [197, C] and one thread this runs in about a quarter to a half of the time of torch's F.layer_norm
// (docs/performance.md).
void layer_norm_rows_avx512(const float* x, float* y, int64_t rows, int64_t c, const float* gamma,
                            const float* beta, float eps) {
  in_row_groups(rows, [&](int64_t r, auto group) __attribute__((always_inline)) {
    layer_norm_group<decltype(group)::value>(x + r * c, StoreF32{y + r * c, c}, c, gamma, beta, eps);
  });
}

// The bf16 GEMMs' LayerNorm (kernels/layer_norm.h layer_norm_rows_bf16): each row group widened (if bf16), normalised
// and rounded while it sits in L1, where widen_bf16 + layer_norm_rows + convert_rows made three passes over the
// rows with an fp32 copy of the output between them.  Same operations per value, so the same bits.
void layer_norm_rows_bf16_avx512(const float* x, const uint16_t* x16, float* widened, uint16_t* y16, int64_t ld16,
                                 int64_t rows, int64_t c, const float* gamma, const float* beta, float eps) {
  if (x16 != nullptr) x = widened;
  in_row_groups(rows, [&](int64_t r, auto group) __attribute__((always_inline)) {
    constexpr int R = decltype(group)::value;
    if (x16 != nullptr) gemm16::widen_bf16(x16 + r * c, R * c, widened + r * c);  // exact: the bits shifted up
    layer_norm_group<R>(x + r * c, StoreBf16{y16 + r * ld16, ld16, c}, c, gamma, beta, eps);
  });
}

}  // namespace gemm
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif

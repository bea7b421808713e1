#include "kernels/attention_int8.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/gemm_int8_isa.h"

namespace vitfast {

namespace {
int64_t padded16(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }

struct Layout {
  // floats
  int64_t vt, scores, sk, sv, sq, sp, total_floats;
  // bytes
  int64_t qk, kpan, vpan, qq, qp, total_bytes;
  int64_t ld_s, lda_d, lda_n, chunk, k_panels, v_panels;
  // dk: the width of Q and K rows (the score product's reduction), dv: of V rows (the output's width)
  Layout(int64_t tokens, int64_t dk, int64_t dv, int64_t q_rows) {
    chunk = std::max<int64_t>(1, std::min(q_rows, kAttentionInt8Chunk));
    ld_s = padded16(tokens);
    lda_d = gemm8::padded_k(dk);
    lda_n = gemm8::padded_k(tokens);
    int64_t f = 0;
    auto take = [&](int64_t n) { const int64_t at = f; f += padded16(n); return at; };
    k_panels = (tokens + gemm::kNr - 1) / gemm::kNr;
    v_panels = (dv + gemm::kNr - 1) / gemm::kNr;
    vt = take(dv + gemm::kNr);  // the V channels' 127 / amax
    scores = take(chunk * ld_s);
    sk = take(tokens);
    sv = take(dv + gemm::kNr);
    sq = take(std::max(chunk, dv + gemm::kNr));
    sp = take(chunk);
    total_floats = f;
    int64_t b = 0;
    auto takeb = [&](int64_t n) { const int64_t at = b; b += (n + 63) / 64 * 64; return at; };
    qk = takeb(tokens * lda_d);
    // room for the AVX2 kernel's wide form of K: 128-byte groups (qw then |qw|, gemm_int8.h), twice the others' 64
    kpan = takeb(2 * k_panels * gemm::kNr * lda_d);
    vpan = takeb(v_panels * gemm::kNr * lda_n);
    qq = takeb(chunk * lda_d);
    qp = takeb(chunk * lda_n);
    total_bytes = b;
  }
};

// Thread-local row sums (int32) of the quantizer: K, Vᵀ, Q, P.
int32_t* rowsums(int64_t n) {
  thread_local std::vector<int32_t> buf;
  if (int64_t(buf.size()) < n) buf.resize(size_t(n));
  return buf.data();
}
// A software prefetch the compiler must emit (GCC drops __builtin_prefetch loops as dead code: see attention.cpp).
inline void prefetch_line(const char* p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 %0" : : "m"(*p));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm volatile("prfm pldl1keep, %0" : : "Q"(*p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// The next task's rows (K and V head slices, Q rows, output columns), walked a few rows at a time.
class NextRows {
 public:
  NextRows() = default;  // nothing to prefetch
  NextRows(const AttentionInt8Next& next, const float* cur_qkv, int64_t cur_h, int64_t ld_qkv, int64_t tokens,
           int64_t heads, int64_t d, int64_t ld_out) {
    if (next.qkv == nullptr || next.q1 <= next.q0) return;
    const int64_t ld = ld_qkv * int64_t(sizeof(float));
    if (next.qkv != cur_qkv || next.h != cur_h) {
      add(next.qkv + (heads + next.h) * d, ld, tokens, d);
      add(next.qkv + (2 * heads + next.h) * d, ld, tokens, d);
    }
    add(next.qkv + next.q0 * ld_qkv + next.h * d, ld, next.q1 - next.q0, d);
    add(next.out + next.q0 * ld_out + next.h * d, ld_out * int64_t(sizeof(float)), next.q1 - next.q0, d);
  }
  int64_t total_rows() const { return total_; }
  void rows(int64_t r0, int64_t r1) const {
    for (int s = 0; s < count_ && r0 < r1; ++s) {
      const Stream& st = streams_[s];
      const int64_t a = std::max<int64_t>(r0, 0), b = std::min(r1, st.rows);
      for (int64_t r = a; r < b; ++r) {
        const char* p = st.base + r * st.ld_bytes;
        for (int64_t i = 0; i < st.lines; ++i) prefetch_line(p + 64 * i);
      }
      r0 -= st.rows;
      r1 -= st.rows;
    }
  }

 private:
  struct Stream {
    const char* base;
    int64_t ld_bytes, rows, lines;
  };
  void add(const float* base, int64_t ld_bytes, int64_t rows, int64_t width) {
    // From the line of the first float; one more line than the width needs covers any offset of later rows.
    const uintptr_t first = reinterpret_cast<uintptr_t>(base) & ~uintptr_t(63);
    streams_[count_++] = {reinterpret_cast<const char*>(first), ld_bytes, rows,
                          (width * int64_t(sizeof(float)) + 63) / 64 + 1};
    total_ += rows;
  }
  Stream streams_[4] = {};
  int count_ = 0;
  int64_t total_ = 0;
};

// V's per-channel quantization, over the channels j (contiguous in a qkv row) with no branches: the compiler
// vectorises these loops.  Written once (always inlined) and instantiated for the baseline target and, on x86,
// under target("avx2") for the AVX2 path (twice the lanes of the baseline's SSE2); the AVX-512 path has them
// written with intrinsics (gemm8::attention_v_columns_avx512 / attention_v_pack_avx512, gemm_int8_isa.h).  No "fma" in that
// target: the rounding below must stay a separate product and sum (GCC contracts a · b + c where FMA exists).
// Column amax and Σ v · 0 (NaN iff the column holds a NaN or ±Inf).
__attribute__((always_inline)) inline void v_columns(const float* v, int64_t ld_qkv, int64_t tokens, int64_t d,
                                                     float* amax, float* chk) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* vr = v + t * ld_qkv;
    for (int64_t j = 0; j < d; ++j) {
      const float av = std::fabs(vr[j]);
      amax[j] = av > amax[j] ? av : amax[j];
      chk[j] += vr[j] * 0.0f;
    }
  }
}

// Four tokens at a time: channel j's four codes make one 32-bit word (token t in byte t % 4), and a panel's group
// is its 16 channels' words side by side (gemm_int8.h's [k4][16][4] layout): 64 contiguous bytes.  Tokens past
// the last and channels past d are weight 0 (byte `offset`).
__attribute__((always_inline)) inline void v_pack(const float* v, int64_t ld_qkv, int64_t tokens, int64_t d,
                                                  int64_t d16, int64_t k4, int64_t panels, int64_t panel_stride,
                                                  int64_t group_bytes, int32_t offset, const float* inv,
                                                  const int32_t* keep, uint32_t* words, int8_t* dst) {
  for (int64_t t0 = 0; t0 < k4; t0 += 4) {
    for (int64_t j = 0; j < d16; ++j) words[j] = 0;
    for (int64_t tt = 0; tt < 4; ++tt) {
      const int64_t t = t0 + tt;
      if (t >= tokens) {
        for (int64_t j = 0; j < d16; ++j) words[j] |= uint32_t(offset) << (8 * tt);
        continue;
      }
      const float* vr = v + t * ld_qkv;
      for (int64_t j = 0; j < d; ++j) {
        const float x = vr[j] * inv[j];
#if defined(__x86_64__) || defined(__i386__)
        // rne for |x| < 2^22 in the default rounding mode (vectorisable without SSE4.1's roundps; no FMA here)
        float q = (x + 12582912.0f) - 12582912.0f;
#else
        float q = std::nearbyint(x);  // one instruction (frintx / frinti), and no a · b + c to contract
#endif
        // the clamp written so that a NaN (0 · Inf in a bad column, whose codes are masked to 0) becomes −127
        q = -127.0f < q ? q : -127.0f;
        q = q < 127.0f ? q : 127.0f;
        const int32_t c = (int32_t(q) & keep[j]) + offset;
        words[j] |= uint32_t(c & 255) << (8 * tt);
      }
      for (int64_t j = d; j < d16; ++j) words[j] |= uint32_t(offset) << (8 * tt);
    }
    for (int64_t p = 0; p < panels; ++p)
      std::memcpy(dst + p * panel_stride + t0 / 4 * group_bytes, words + p * gemm::kNr, 4 * gemm::kNr);
  }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void v_columns_avx2(const float* v, int64_t ld_qkv, int64_t tokens, int64_t d,
                                                    float* amax, float* chk) {
  v_columns(v, ld_qkv, tokens, d, amax, chk);
}
__attribute__((target("avx2"))) void v_pack_avx2(const float* v, int64_t ld_qkv, int64_t tokens, int64_t d,
                                                 int64_t d16, int64_t k4, int64_t panels, int64_t panel_stride,
                                                 int64_t group_bytes, int32_t offset, const float* inv,
                                                 const int32_t* keep, uint32_t* words, int8_t* dst) {
  v_pack(v, ld_qkv, tokens, d, d16, k4, panels, panel_stride, group_bytes, offset, inv, keep, words, dst);
}
#endif

// C[m × n] = (dequantised) qa · B on the block kernel of `kernel` (what gemm8::gemm_int8 does for a PackedInt8B,
// here on panels packed into the workspace per head: no allocation per head).
void run_gemm(gemm8::Int8Kernel kernel, int64_t m, int64_t n, const int8_t* qa, int64_t lda, const float* sa,
              const int32_t* rowsum, const int8_t* panels, int64_t panel_stride, int64_t n_panels,
              const float* w_scale, float* c, int64_t ldc, bool c_padded, bool a_unsigned) {
  gemm8::Int8BlockArgs g{};
  g.a_unsigned = a_unsigned;
  g.m = m;
  g.n = n;
  g.k4 = lda;
  g.a = qa;
  g.lda = lda;
  g.sa = sa;
  g.rowsum = rowsum;
  g.b = panels;
  g.b_panel_stride = panel_stride;
  g.panel_begin = 0;
  g.panel_end = n_panels;
  g.w_scale = w_scale;
  g.c = c;
  g.ldc = ldc;
  g.c_padded = c_padded;
  g.accumulate = false;
  g.bias = nullptr;
  g.gelu = false;
  g.addend = nullptr;
  g.ld_addend = 0;
  switch (kernel) {
#if defined(__x86_64__) || defined(__i386__)
    case gemm8::Int8Kernel::kAvx512Vnni: gemm8::gemm_int8_block_avx512_vnni(g); return;
    case gemm8::Int8Kernel::kAmxInt8: gemm8::gemm_int8_block_amx(g); return;
    case gemm8::Int8Kernel::kAvx2: gemm8::gemm_int8_block_avx2(g); return;
    case gemm8::Int8Kernel::kAvxVnni: gemm8::gemm_int8_block_avxvnni(g); return;
#endif
#if defined(__aarch64__)
    case gemm8::Int8Kernel::kNeonDot: gemm8::gemm_int8_block_neon_dot(g); return;
#endif
    default: gemm8::gemm_int8_block_scalar(g); return;
  }
}
}  // namespace

void AttentionInt8Workspace::reserve(int64_t tokens, int64_t dk, int64_t dv, int64_t q_rows) {
  const Layout l(tokens, dk, dv, q_rows);
  if (floats.size() < l.total_floats) floats = gemm::AlignedFloats(l.total_floats);
  if (bytes.size() < l.total_bytes) bytes = gemm8::AlignedBytes(l.total_bytes);
}

namespace {
// One head on given operands (HeadOperands), the prefetch of the caller's next task walked alongside.
void int8_head(const HeadOperands& o, int64_t tokens, int64_t q0, int64_t q1, float scale, float* out,
               int64_t ld_out, AttentionInt8Workspace& ws, CpuIsa isa, const NextRows& prefetch) {
  if (q1 <= q0 || tokens <= 0) return;
  const int64_t dk = o.dk, d = o.dv, m = q1 - q0;
  ws.reserve(tokens, dk, d, m);
  const Layout l(tokens, dk, d, m);
  float* fb = ws.floats.data();
  int8_t* bb = ws.bytes.data();
  float *vt = fb + l.vt, *scores = fb + l.scores, *sk = fb + l.sk, *sv = fb + l.sv, *sq = fb + l.sq,
        *sp = fb + l.sp;
  int8_t *qk = bb + l.qk, *kpan = bb + l.kpan, *vpan = bb + l.vpan, *qq = bb + l.qq, *qp = bb + l.qp;
  int32_t* rs = rowsums(tokens + 2 * (d + gemm::kNr) + 2 * l.chunk);
  int32_t *rs_k = rs, *rs_v = rs + tokens, *rs_q = rs_v + d + gemm::kNr, *rs_p = rs_q + std::max(l.chunk, d + gemm::kNr);
  const gemm8::Int8Kernel kernel = gemm8::int8_kernel(isa);

  const float *q = o.q, *k = o.k, *v = o.v;
  const int64_t ldq = o.ldq, ldk = o.ldk, ldv = o.ldv;
  // K: per key token (quantize_rows), packed as B = K_hᵀ [dk × N]: a key is an output column, its scale the
  // column's.  Each key row's groups of 4 bytes go to its slot of the 16-column panel (gemm_int8.h's layout).
  gemm8::quantize_rows(k, ldk, tokens, dk, nullptr, qk, l.lda_d, sk, rs_k, isa);
  bool keys_nan = false;
  for (int64_t t = 0; t < tokens; ++t) keys_nan = keys_nan || std::isnan(sk[t]);
  for (int64_t t = tokens; t < l.k_panels * gemm::kNr; ++t) sk[t] = 0.0f;
  // The VNNI kernels' B is u8 = q + 128 (= q ^ 0x80): padding (weight 0) is byte 0x80.
  const bool u8 = gemm8::vnni_u8_form(kernel);
  const uint32_t flip = u8 ? 0x80808080u : 0u;
  // The AVX2 kernel reads |qw| beside K's codes (gemm_int8.h's wide AVX2 form: 128-byte groups, |qw| filled in after
  // the codes), against Q's signed codes; P·V needs no |qw|: P's codes are never negative, so that product runs in
  // the kernel's unsigned-A form (Int8BlockArgs::a_unsigned) on V's plain 64-byte groups.
  const bool avx2 = kernel == gemm8::Int8Kernel::kAvx2;
  const int64_t group_bytes = avx2 ? 8 * gemm::kNr : 4 * gemm::kNr, v_group_bytes = 4 * gemm::kNr;
  const int64_t k_stride = l.lda_d / 4 * group_bytes, v_stride = l.lda_n / 4 * v_group_bytes;
  // (One key row's words are one column of the panel: a register transpose on AVX-512, ~6% of an int8 DeiT-S
  // forward word by word.)
#if defined(__x86_64__) || defined(__i386__)
  if (isa == CpuIsa::kAvx512 && !avx2) {
    gemm8::pack_words_transposed_avx512(qk, l.lda_d, tokens, l.lda_d / 4, flip, kpan, k_stride);
  } else if (isa == CpuIsa::kAvx2 && !avx2) {  // the AVX-VNNI kernel's u8 panels
    gemm8::pack_words_transposed_avx2(qk, l.lda_d, tokens, l.lda_d / 4, flip, kpan, k_stride);
  } else
#endif
  {
    if (tokens % gemm::kNr != 0) std::memset(kpan, u8 ? 0x80 : 0, size_t(l.k_panels * k_stride));
    for (int64_t t = 0; t < tokens; ++t) {
      const int8_t* src = qk + t * l.lda_d;
      int8_t* dst = kpan + (t / gemm::kNr) * k_stride + (t % gemm::kNr) * 4;
      for (int64_t g = 0; g < l.lda_d; g += 4) {
        uint32_t w;
        std::memcpy(&w, src + g, 4);
        w ^= flip;
        std::memcpy(dst + g / 4 * group_bytes, &w, 4);
      }
    }
  }
  // V: per channel d over the tokens (quantize_rows' rule on V_hᵀ, written out: amax, inv = 127 / amax,
  // q = clamp(rne(v · inv), ±127), s = amax / 127; a column with NaN/±Inf: s = NaN, q = 0; one whose 127 / amax
  // overflows: s = 0, q = 0), packed as B = V_h [N × D] straight from the qkv rows.
  // (v_columns / v_pack above: loops over the channels, vectorised)
  float* inv = vt;   // amax, then 127 / amax (0 for a column that quantizes to 0)
  float* chk = sq;   // Σ v · 0 per column: NaN iff the column holds a NaN or ±Inf (sq is free until the chunks)
  const int64_t d16 = l.v_panels * gemm::kNr;
  for (int64_t j = 0; j < d16; ++j) inv[j] = chk[j] = 0.0f;
#if defined(__x86_64__) || defined(__i386__)
  if (isa == CpuIsa::kAvx512)
    gemm8::attention_v_columns_avx512(v, ldv, tokens, d, inv, chk);
  else if (isa != CpuIsa::kScalar)
    v_columns_avx2(v, ldv, tokens, d, inv, chk);
  else
#endif
    v_columns(v, ldv, tokens, d, inv, chk);
  int32_t* keep = rs_v;  // -1: the column's codes are kept, 0: forced to 0 (NaN/Inf, zero, or padding column)
  for (int64_t j = 0; j < d16; ++j) {
    const bool bad = std::isnan(chk[j]);
    const float amax = inv[j], r = 127.0f / amax;
    const bool zero = j >= d || (!bad && !(r <= FLT_MAX));
    sv[j] = j >= d ? 0.0f : bad ? std::numeric_limits<float>::quiet_NaN() : (zero ? 0.0f : amax / 127.0f);
    inv[j] = (bad || zero) ? 0.0f : r;
    keep[j] = (bad || zero) ? 0 : -1;
  }
  uint32_t* words = reinterpret_cast<uint32_t*>(rs_q);  // d16 words (rs_q has >= d16 int32s, free until the chunks)
  const int32_t offset = u8 ? 128 : 0;
#if defined(__x86_64__) || defined(__i386__)
  if (isa == CpuIsa::kAvx512)
    gemm8::attention_v_pack_avx512(v, ldv, tokens, d, l.lda_n, l.v_panels, v_stride, v_group_bytes, offset, inv,
                                   keep, vpan);
  else if (isa != CpuIsa::kScalar)
    v_pack_avx2(v, ldv, tokens, d, d16, l.lda_n, l.v_panels, v_stride, v_group_bytes, offset, inv, keep, words,
                vpan);
  else
#endif
    v_pack(v, ldv, tokens, d, d16, l.lda_n, l.v_panels, v_stride, v_group_bytes, offset, inv, keep, words, vpan);
  if (avx2) gemm8::fill_abs_halves(kpan, l.k_panels * l.lda_d / 4);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t pf_total = prefetch.total_rows();
  for (int64_t r0 = q0; r0 < q1; r0 += kAttentionInt8Chunk) {
    const int64_t rows = std::min(q1, r0 + kAttentionInt8Chunk) - r0;
    gemm8::quantize_rows(q + r0 * ldq, ldq, rows, dk, nullptr, qq, l.lda_d, sq, rs_q, isa);
    run_gemm(kernel, rows, tokens, qq, l.lda_d, sq, rs_q, kpan, k_stride, l.k_panels, sk, scores, l.ld_s, true,
             false);
    // E = exp(S·scale − max) and its quantization, a pair of rows at a time (one pass on x86: gemm_int8.h)
    for (int64_t i = 0; i < rows; i += 2) {
      const int64_t pair = std::min<int64_t>(2, rows - i);
      gemm8::softmax_quantize_rows(scores + i * l.ld_s, pair, tokens, l.ld_s, scale, qp + i * l.lda_n, l.lda_n,
                                   sp + i, rs_p + i, isa);
      prefetch.rows((r0 - q0 + i) * pf_total / m, (r0 - q0 + i + pair) * pf_total / m);
    }
    // The softmax's normalisation: 1 / Σ codes of the quantized row (>= 127: its maximum is code 127).
    for (int64_t i = 0; i < rows; ++i)
      sp[i] = (keys_nan || std::isnan(sq[i]) || std::isnan(sp[i]) || rs_p[i] <= 0) ? nan : 1.0f / float(rs_p[i]);
    run_gemm(kernel, rows, d, qp, l.lda_n, sp, rs_p, vpan, v_stride, l.v_panels, sv, out + r0 * ld_out, ld_out,
             false, avx2);
  }
}

}  // namespace

void attention_int8_head(const HeadOperands& operands, int64_t tokens, int64_t q0, int64_t q1, float scale,
                         float* out, int64_t ld_out, AttentionInt8Workspace& ws, CpuIsa isa) {
  int8_head(operands, tokens, q0, q1, scale, out, ld_out, ws, isa, NextRows());
}

void attention_int8_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t h, int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out,
                         AttentionInt8Workspace& ws, CpuIsa isa, const AttentionInt8Next& next) {
  const int64_t d = head_dim, attn_dim = heads * head_dim;
  HeadOperands o;
  o.q = qkv + h * d, o.k = qkv + attn_dim + h * d, o.v = qkv + 2 * attn_dim + h * d;
  o.ldq = o.ldk = o.ldv = ld_qkv;
  o.dk = o.dv = d;
  int8_head(o, tokens, q0, q1, scale, out + h * d, ld_out, ws, isa,
            NextRows(next, qkv, h, ld_qkv, tokens, heads, d, ld_out));
}

}  // namespace vitfast

#include "kernels/attention_int8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace vitfast {

namespace {
int64_t padded16(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }

struct Layout {
  // floats
  int64_t vt, scores, sk, sv, sq, sp, row_max, row_sum, total_floats;
  // bytes
  int64_t qk, qvt, qq, qp, total_bytes;
  int64_t ld_vt, ld_s, lda_d, lda_n, chunk;
  Layout(int64_t tokens, int64_t d, int64_t q_rows) {
    chunk = std::max<int64_t>(1, std::min(q_rows, kAttentionInt8Chunk));
    ld_vt = padded16(tokens);
    ld_s = padded16(tokens);
    lda_d = gemm8::padded_k(d);
    lda_n = gemm8::padded_k(tokens);
    int64_t f = 0;
    auto take = [&](int64_t n) { const int64_t at = f; f += padded16(n); return at; };
    vt = take(d * ld_vt);
    scores = take(chunk * ld_s);
    sk = take(tokens);
    sv = take(d);
    sq = take(chunk);
    sp = take(chunk);
    row_max = take(chunk);
    row_sum = take(chunk);
    total_floats = f;
    int64_t b = 0;
    auto takeb = [&](int64_t n) { const int64_t at = b; b += (n + 63) / 64 * 64; return at; };
    qk = takeb(tokens * lda_d);
    qvt = takeb(d * lda_n);
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
}  // namespace

void AttentionInt8Workspace::reserve(int64_t tokens, int64_t head_dim, int64_t q_rows) {
  const Layout l(tokens, head_dim, q_rows);
  if (floats.size() < l.total_floats) floats = gemm::AlignedFloats(l.total_floats);
  if (bytes.size() < l.total_bytes) bytes = gemm8::AlignedBytes(l.total_bytes);
}

void attention_int8_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t h, int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out,
                         AttentionInt8Workspace& ws, CpuIsa isa) {
  if (q1 <= q0 || tokens <= 0) return;
  const int64_t d = head_dim, attn_dim = heads * head_dim, m = q1 - q0;
  ws.reserve(tokens, d, m);
  const Layout l(tokens, d, m);
  float* fb = ws.floats.data();
  int8_t* bb = ws.bytes.data();
  float *vt = fb + l.vt, *scores = fb + l.scores, *sk = fb + l.sk, *sv = fb + l.sv, *sq = fb + l.sq,
        *sp = fb + l.sp, *row_max = fb + l.row_max, *row_sum = fb + l.row_sum;
  int8_t *qk = bb + l.qk, *qvt = bb + l.qvt, *qq = bb + l.qq, *qp = bb + l.qp;
  int32_t* rs = rowsums(tokens + d + 2 * l.chunk);
  int32_t *rs_k = rs, *rs_v = rs + tokens, *rs_q = rs_v + d, *rs_p = rs_q + l.chunk;
  const gemm8::Int8Kernel kernel = gemm8::int8_kernel(isa);

  const float* q = qkv + h * d;
  const float* k = qkv + attn_dim + h * d;
  const float* v = qkv + 2 * attn_dim + h * d;
  // K: per key token, packed as B = K_hᵀ [D × N] (a key is an output column, its scale the column's).
  gemm8::quantize_rows(k, ld_qkv, tokens, d, nullptr, qk, l.lda_d, sk, rs_k, isa);
  bool keys_nan = false;
  for (int64_t t = 0; t < tokens; ++t) keys_nan = keys_nan || std::isnan(sk[t]);
  const gemm8::PackedInt8B kp = gemm8::PackedInt8B::pack(qk, tokens, d, l.lda_d, sk, nullptr, kernel);
  // V: transposed to [D × N] fp32, quantized per channel over the tokens, packed as B = V_h [N × D].
  for (int64_t t = 0; t < tokens; ++t) {
    const float* vr = v + t * ld_qkv;
    for (int64_t j = 0; j < d; ++j) vt[j * l.ld_vt + t] = vr[j];
  }
  gemm8::quantize_rows(vt, l.ld_vt, d, tokens, nullptr, qvt, l.lda_n, sv, rs_v, isa);
  const gemm8::PackedInt8B vp = gemm8::PackedInt8B::pack(qvt, d, tokens, l.lda_n, sv, nullptr, kernel);

  gemm::Epilogue padded_c;
  padded_c.c_padded = true;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r0 = q0; r0 < q1; r0 += kAttentionInt8Chunk) {
    const int64_t rows = std::min(q1, r0 + kAttentionInt8Chunk) - r0;
    gemm8::quantize_rows(q + r0 * ld_qkv, ld_qkv, rows, d, nullptr, qq, l.lda_d, sq, rs_q, isa);
    gemm8::gemm_int8(rows, qq, l.lda_d, sq, rs_q, kp, scores, l.ld_s, padded_c, kernel);
    for (int64_t i = 0; i < rows; i += 2) {
      const int64_t pair = std::min<int64_t>(2, rows - i);
      for (int64_t r = i; r < i + pair; ++r) row_max[r] = -std::numeric_limits<float>::infinity();
      gemm::softmax_exp_rows(scores + i * l.ld_s, pair, tokens, l.ld_s, scale, row_max + i, row_sum + i, isa);
    }
    gemm8::quantize_rows(scores, l.ld_s, rows, tokens, nullptr, qp, l.lda_n, sp, rs_p, isa);
    // The softmax's normalisation: 1 / Σ codes of the quantized row (>= 127: its maximum is code 127).
    for (int64_t i = 0; i < rows; ++i)
      sp[i] = (keys_nan || std::isnan(sq[i]) || std::isnan(sp[i]) || rs_p[i] <= 0) ? nan : 1.0f / float(rs_p[i]);
    gemm8::gemm_int8(rows, qp, l.lda_n, sp, rs_p, vp, out + r0 * ld_out + h * d, ld_out, gemm::Epilogue(), kernel);
  }
}

}  // namespace vitfast

#include "kernels/xwx_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/linear.h"

namespace vitfast {

namespace {

int64_t key_tiles(int64_t tokens) { return (tokens + kXwxKeyTile - 1) / kXwxKeyTile; }
int64_t padded16(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }
// Score tile row stride: a whole key tile (a multiple of the 16-column panels).
constexpr int64_t kScoreLd = kXwxKeyTile;

void scale_rows(float* a, int64_t rows, int64_t cols, int64_t ld, const float* factor) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = a + i * ld;
    const float f = factor[i];
    for (int64_t j = 0; j < cols; ++j) row[j] *= f;
  }
}

}  // namespace

size_t XwxPacked::bytes() const { return proj.bytes() + w_o.bytes(); }

XwxLayout xwx_layout(const XwxShape& s) {
  XwxLayout l;
  l.shape = s;
  const int64_t kb = s.key_bias ? 1 : 0;
  l.left_width = s.rank + kb;
  l.right_width = s.full ? kb : s.rank + kb;
  l.head_cols = l.left_width + l.right_width + s.value_dim;
  return l;
}

namespace {

// The two GEMMs' weights in nn.Linear layout (one row per output column), transposed from the [H, C, ·] weights:
// the projection [H·head_cols × C] with the bias that makes the ones column, and the w_o blocks stacked as one
// [C_out × H·D] matrix (row co holds w_o[h][d][co] at column h·D + d) with b_o.
struct XwxLinearWeights {
  std::vector<float> proj, proj_bias, w_o;
};
XwxLinearWeights xwx_linear_weights(const XwxLayout& p, const float* w_q, const float* w_k, const float* key_bias,
                                    const float* w_v, const float* w_o) {
  const XwxShape& s = p.shape;
  const int64_t C = s.channels, R = s.rank, D = s.value_dim, H = s.heads, kb = s.key_bias ? 1 : 0;
  const int64_t cols = p.proj_cols();
  XwxLinearWeights l;
  l.proj.assign(size_t(cols * C), 0.0f);
  l.proj_bias.assign(size_t(cols), 0.0f);
  std::vector<float>& wt = l.proj;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t left = p.left_col(h), right = p.right_col(h), value = p.value_col(h);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t r = 0; r < R; ++r) wt[size_t((left + r) * C + c)] = w_q[(h * C + c) * R + r];
      if (!s.full)
        for (int64_t r = 0; r < R; ++r) wt[size_t((right + r) * C + c)] = w_k[(h * C + c) * R + r];
      if (kb) wt[size_t((right + (s.full ? 0 : R)) * C + c)] = key_bias[h * C + c];
      for (int64_t d = 0; d < D; ++d) wt[size_t((value + d) * C + c)] = w_v[(h * C + c) * D + d];
    }
    if (kb) l.proj_bias[size_t(left + R)] = 1.0f;  // the ones column that carries kb_h through the score GEMM
  }
  const int64_t HD = H * D;
  l.w_o.resize(size_t(s.out_channels * HD));
  for (int64_t hd = 0; hd < HD; ++hd)
    for (int64_t co = 0; co < s.out_channels; ++co) l.w_o[size_t(co * HD + hd)] = w_o[hd * s.out_channels + co];
  return l;
}

}  // namespace

size_t XwxPackedBf16::bytes() const { return proj.bytes() + w_o.bytes(); }

XwxPacked xwx_pack(const XwxShape& s, const float* w_q, const float* w_k, const float* key_bias, const float* w_v,
                   const float* w_o, const float* b_o) {
  XwxPacked p;
  static_cast<XwxLayout&>(p) = xwx_layout(s);
  const XwxLinearWeights l = xwx_linear_weights(p, w_q, w_k, key_bias, w_v, w_o);
  const int64_t C = s.channels, HD = s.heads * s.value_dim;
  p.proj = gemm::PackedB::pack_linear(l.proj.data(), p.proj_cols(), C, C, s.key_bias ? l.proj_bias.data() : nullptr);
  p.w_o = gemm::PackedB::pack_linear(l.w_o.data(), s.out_channels, HD, HD, b_o);
  return p;
}

XwxPackedBf16 xwx_pack_bf16(const XwxShape& s, const float* w_q, const float* w_k, const float* key_bias,
                            const float* w_v, const float* w_o, const float* b_o) {
  XwxPackedBf16 p;
  static_cast<XwxLayout&>(p) = xwx_layout(s);
  const XwxLinearWeights l = xwx_linear_weights(p, w_q, w_k, key_bias, w_v, w_o);
  const int64_t C = s.channels, HD = s.heads * s.value_dim;
  p.proj = gemm16::PackedBf16B::pack_linear(l.proj.data(), p.proj_cols(), C, C,
                                            s.key_bias ? l.proj_bias.data() : nullptr);
  p.w_o = gemm16::PackedBf16B::pack_linear(l.w_o.data(), s.out_channels, HD, HD, b_o);
  return p;
}

void xwx_project(const XwxPacked& w, int64_t rows, const float* x, int64_t ldx, float* proj, int64_t ldp, CpuIsa isa) {
  linear_rows(w.proj, rows, x, ldx, nullptr, 0, proj, ldp, isa);
}

int64_t xwx_keys_floats(const XwxLayout& w, int64_t tokens) {
  return gemm::packed_floats(tokens, w.left_width) +
         key_tiles(tokens) * gemm::packed_floats(w.shape.value_dim, kXwxKeyTile);
}

int64_t xwx_pack_scratch_floats(const XwxLayout& w, int64_t tokens) {
  return w.shape.full && w.shape.key_bias ? tokens * w.left_width : 0;
}

void xwx_pack_keys(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* x, int64_t ldx,
                   int64_t h, float* keys, float* scratch) {
  const int64_t lw = w.left_width, D = w.shape.value_dim;
  if (!w.shape.full) {
    gemm::pack_b_transposed(proj + w.right_col(h), tokens, lw, ldp, keys);  // [K_h | kb_h]ᵀ
  } else if (!w.shape.key_bias) {
    gemm::pack_b_transposed(x, tokens, lw, ldx, keys);  // xᵀ
  } else {
    const HeadOperands o = xwx_head_operands(w, tokens, proj, ldp, x, ldx, h, scratch);  // [x | kb_h] in scratch
    gemm::pack_b_transposed(o.k, tokens, lw, o.ldk, keys);
  }
  float* values = keys + gemm::packed_floats(tokens, lw);
  for (int64_t t = 0; t < key_tiles(tokens); ++t) {
    const int64_t k0 = t * kXwxKeyTile, kt = std::min(kXwxKeyTile, tokens - k0);
    gemm::pack_b(proj + k0 * ldp + w.value_col(h), kt, D, ldp,
                 values + t * gemm::packed_floats(D, kXwxKeyTile));
  }
}

HeadOperands xwx_head_operands(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* x,
                               int64_t ldx, int64_t h, float* scratch) {
  HeadOperands o;
  o.q = proj + w.left_col(h), o.ldq = ldp, o.dk = w.left_width;
  o.v = proj + w.value_col(h), o.ldv = ldp, o.dv = w.shape.value_dim;
  if (!w.shape.full) {
    o.k = proj + w.right_col(h), o.ldk = ldp;
  } else if (!w.shape.key_bias) {
    o.k = x, o.ldk = ldx;
  } else if (scratch != nullptr) {
    const int64_t C = w.shape.channels, lw = w.left_width;
    for (int64_t j = 0; j < tokens; ++j) {  // [x | kb_h]: the right operand of [x W_h | 1]
      std::copy(x + j * ldx, x + j * ldx + C, scratch + j * lw);
      scratch[j * lw + C] = proj[j * ldp + w.right_col(h)];
    }
    o.k = scratch, o.ldk = lw;
  }
  return o;
}

int64_t xwx_heads_workspace_floats(int64_t q_rows) { return q_rows * kScoreLd + 4 * padded16(q_rows); }

int64_t xwx_rows_workspace_floats(const XwxPacked& w, int64_t q_rows) {
  return xwx_heads_workspace_floats(q_rows) + q_rows * w.shape.heads * w.shape.value_dim;
}

void xwx_heads_rows(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* keys, int64_t q0,
                    int64_t q1, float* heads, int64_t ldh, float* workspace, CpuIsa isa) {
  const int64_t m = q1 - q0;
  if (m <= 0) return;
  const int64_t lw = w.left_width, D = w.shape.value_dim;
  const int64_t per_head = xwx_keys_floats(w, tokens), tiles = key_tiles(tokens);
  float* scores = workspace;
  float* run_max = scores + m * kScoreLd;
  float* run_sum = run_max + padded16(m);
  float* tile_sum = run_sum + padded16(m);
  float* factor = tile_sum + padded16(m);
  gemm::Epilogue padded_c;
  padded_c.c_padded = true;
  gemm::Epilogue onto;
  onto.accumulate = true;
  for (int64_t h = 0; h < w.shape.heads; ++h) {
    const float* left = proj + q0 * ldp + w.left_col(h);
    const float* k_panels = keys + h * per_head;
    const float* v_tiles = k_panels + gemm::packed_floats(tokens, lw);
    float* acc_h = heads + h * D;  // unnormalised until the end of the head
    std::fill(run_max, run_max + m, -std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t k0 = t * kXwxKeyTile, kt = std::min(kXwxKeyTile, tokens - k0);
      // S = [L_h | 1] · [K_h | kb_h]ᵀ for this key tile (its panels are contiguous: k0 is a panel boundary).
      gemm::gemm_raw(m, left, ldp, k_panels + (k0 / gemm::kNr) * lw * gemm::kNr, kt, lw, scores, kScoreLd,
                     padded_c, isa);
      if (t > 0) std::copy(run_max, run_max + m, factor);
      // Online softmax (flash attention): P = exp(S − running max), the max updated in place.
      gemm::softmax_exp_rows(scores, m, kt, kScoreLd, 1.0f, run_max, tile_sum, isa);
      const float* v_tile = v_tiles + t * gemm::packed_floats(D, kXwxKeyTile);
      if (t == 0) {
        std::copy(tile_sum, tile_sum + m, run_sum);
        gemm::gemm_raw(m, scores, kScoreLd, v_tile, D, kt, acc_h, ldh, gemm::Epilogue(), isa);
      } else {
        // What was accumulated against the old maximum is rescaled to the new one: e^(old − new) <= 1.
        for (int64_t i = 0; i < m; ++i) {
          // Still -inf (every key so far overflowed): nothing accumulated yet, and exp(-inf - -inf) would be NaN.
          factor[i] = run_max[i] == -std::numeric_limits<float>::infinity() ? 1.0f : std::exp(factor[i] - run_max[i]);
          run_sum[i] = run_sum[i] * factor[i] + tile_sum[i];
        }
        scale_rows(acc_h, m, D, ldh, factor);
        gemm::gemm_raw(m, scores, kScoreLd, v_tile, D, kt, acc_h, ldh, onto, isa);
      }
    }
    for (int64_t i = 0; i < m; ++i) factor[i] = 1.0f / run_sum[i];
    scale_rows(acc_h, m, D, ldh, factor);
  }
}

void xwx_attention_rows(const XwxPacked& w, int64_t tokens, const float* proj, int64_t ldp, const float* keys,
                        int64_t q0, int64_t q1, const float* residual, int64_t ld_res, float* out, int64_t ldo,
                        float* workspace, CpuIsa isa) {
  const int64_t m = q1 - q0;
  if (m <= 0) return;
  const int64_t lda = w.shape.heads * w.shape.value_dim;
  float* acc = workspace + xwx_heads_workspace_floats(m);  // [m × H·D]: head h in columns [h·D, (h+1)·D)
  xwx_heads_rows(w, tokens, proj, ldp, keys, q0, q1, acc, lda, workspace, isa);
  // All heads through the output projection in one GEMM over K = H·D (eq. 3: Σ_h H_h W_O,h is the product of
  // the heads side by side with the stacked W_O blocks), with b_o and the residual in its epilogue: one long
  // reduction instead of H accumulate passes over the output rows.
  gemm::Epilogue ep;
  ep.bias = true;
  ep.addend = residual != nullptr ? residual + q0 * ld_res : nullptr;
  ep.ld_addend = ld_res;
  gemm::gemm(m, acc, lda, w.w_o, out + q0 * ldo, ldo, ep, isa);
}

void xwx_attention_image(const XwxPacked& w, int64_t tokens, const float* x, int64_t ldx, const float* residual,
                         int64_t ld_res, float* out, int64_t ldo, CpuIsa isa) {
  if (tokens <= 0) return;
  const int64_t ldp = w.proj_cols(), per_head = xwx_keys_floats(w, tokens);
  gemm::AlignedFloats proj(tokens * ldp);
  gemm::AlignedFloats keys(w.shape.heads * per_head);
  gemm::AlignedFloats scratch(std::max<int64_t>(1, xwx_pack_scratch_floats(w, tokens)));
  gemm::AlignedFloats ws(xwx_rows_workspace_floats(w, tokens));
  xwx_project(w, tokens, x, ldx, proj.data(), ldp, isa);
  for (int64_t h = 0; h < w.shape.heads; ++h)
    xwx_pack_keys(w, tokens, proj.data(), ldp, x, ldx, h, keys.data() + h * per_head, scratch.data());
  xwx_attention_rows(w, tokens, proj.data(), ldp, keys.data(), 0, tokens, residual, ld_res, out, ldo, ws.data(), isa);
}

}  // namespace vitfast

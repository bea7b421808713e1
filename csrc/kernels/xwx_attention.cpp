#include "kernels/xwx_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/linear.h"

namespace vitfast {

namespace {

int64_t key_tiles(int64_t tokens) { return (tokens + kXwxKeyTile - 1) / kXwxKeyTile; }
int64_t padded16(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }
// Score tile row stride: a whole key tile plus the augmented column (see the header), padded to panels.
constexpr int64_t kScoreLd = kXwxKeyTile + gemm::kNr;

// max(init, row[0..n)), with eight independent running maxima: one compare chain would be bound by its latency
// (measured: this pass cost more than the score GEMM of the tile with a single chain).  NaN-propagation is not
// needed here: a NaN score reaches the output through the softmax anyway.
float row_max(const float* row, int64_t n, float init) {
  float m[8] = {init, init, init, init, init, init, init, init};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = row[j + l] > m[l] ? row[j + l] : m[l];
  for (; j < n; ++j) m[0] = row[j] > m[0] ? row[j] : m[0];
  for (int l = 1; l < 8; ++l) m[0] = m[l] > m[0] ? m[l] : m[0];
  return m[0];
}

void scale_rows(float* a, int64_t rows, int64_t cols, int64_t ld, const float* factor) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = a + i * ld;
    const float f = factor[i];
    for (int64_t j = 0; j < cols; ++j) row[j] *= f;
  }
}

}  // namespace

size_t XwxPacked::bytes() const {
  size_t total = proj.bytes();
  for (const gemm::PackedB& b : w_o) total += b.bytes();
  return total;
}

XwxPacked xwx_pack(const XwxShape& s, const float* w_q, const float* w_k, const float* key_bias, const float* w_v,
                   const float* w_o, const float* b_o) {
  XwxPacked p;
  p.shape = s;
  const int64_t C = s.channels, R = s.rank, D = s.value_dim, H = s.heads, kb = s.key_bias ? 1 : 0;
  p.left_width = R + kb;
  p.right_width = s.full ? kb : R + kb;
  p.head_cols = p.left_width + p.right_width + D;
  const int64_t cols = p.proj_cols();
  // nn.Linear layout (one row per output column), transposed from the [H, C, ·] weights once here.
  std::vector<float> wt(size_t(cols * C), 0.0f), bias(size_t(cols), 0.0f);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t left = p.left_col(h), right = p.right_col(h), value = p.value_col(h);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t r = 0; r < R; ++r) wt[size_t((left + r) * C + c)] = w_q[(h * C + c) * R + r];
      if (!s.full)
        for (int64_t r = 0; r < R; ++r) wt[size_t((right + r) * C + c)] = w_k[(h * C + c) * R + r];
      if (kb) wt[size_t((right + (s.full ? 0 : R)) * C + c)] = key_bias[h * C + c];
      for (int64_t d = 0; d < D; ++d) wt[size_t((value + d) * C + c)] = w_v[(h * C + c) * D + d];
    }
    if (kb) bias[size_t(left + R)] = 1.0f;  // the ones column that carries kb_h through the score GEMM
  }
  p.proj = gemm::PackedB::pack_linear(wt.data(), cols, C, C, kb ? bias.data() : nullptr);
  std::vector<float> wo_t(size_t(s.out_channels * D));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t d = 0; d < D; ++d)
      for (int64_t co = 0; co < s.out_channels; ++co)
        wo_t[size_t(co * D + d)] = w_o[(h * D + d) * s.out_channels + co];
    p.w_o.push_back(gemm::PackedB::pack_linear(wo_t.data(), s.out_channels, D, D, h == 0 ? b_o : nullptr));
  }
  return p;
}

void xwx_project(const XwxPacked& w, int64_t rows, const float* x, int64_t ldx, float* proj, int64_t ldp, CpuIsa isa) {
  linear_rows(w.proj, rows, x, ldx, nullptr, 0, proj, ldp, isa);
}

int64_t xwx_keys_floats(const XwxPacked& w, int64_t tokens) {
  return gemm::packed_floats(tokens, w.left_width) +
         key_tiles(tokens) * gemm::packed_floats(w.shape.value_dim, kXwxKeyTile);
}

int64_t xwx_pack_scratch_floats(const XwxPacked& w, int64_t tokens) {
  return w.shape.full && w.shape.key_bias ? tokens * w.left_width : 0;
}

void xwx_pack_keys(const XwxPacked& w, int64_t tokens, const float* proj, int64_t ldp, const float* x, int64_t ldx,
                   int64_t h, float* keys, float* scratch) {
  const int64_t lw = w.left_width, D = w.shape.value_dim;
  if (!w.shape.full) {
    gemm::pack_b_transposed(proj + w.right_col(h), tokens, lw, ldp, keys);  // [K_h | kb_h]ᵀ
  } else if (!w.shape.key_bias) {
    gemm::pack_b_transposed(x, tokens, lw, ldx, keys);  // xᵀ
  } else {
    const int64_t C = w.shape.channels;
    for (int64_t j = 0; j < tokens; ++j) {  // [x | kb_h]: the right operand of [x W_h | 1]
      std::copy(x + j * ldx, x + j * ldx + C, scratch + j * lw);
      scratch[j * lw + C] = proj[j * ldp + w.right_col(h)];
    }
    gemm::pack_b_transposed(scratch, tokens, lw, lw, keys);
  }
  float* values = keys + gemm::packed_floats(tokens, lw);
  for (int64_t t = 0; t < key_tiles(tokens); ++t) {
    const int64_t k0 = t * kXwxKeyTile, kt = std::min(kXwxKeyTile, tokens - k0);
    gemm::pack_b(proj + k0 * ldp + w.value_col(h), kt, D, ldp,
                 values + t * gemm::packed_floats(D, kXwxKeyTile));
  }
}

int64_t xwx_rows_workspace_floats(const XwxPacked& w, int64_t q_rows) {
  return q_rows * kScoreLd + q_rows * padded16(w.shape.value_dim) + 5 * padded16(q_rows);
}

void xwx_attention_rows(const XwxPacked& w, int64_t tokens, const float* proj, int64_t ldp, const float* keys,
                        int64_t q0, int64_t q1, const float* residual, int64_t ld_res, float* out, int64_t ldo,
                        float* workspace, CpuIsa isa) {
  const int64_t m = q1 - q0;
  if (m <= 0) return;
  const int64_t lw = w.left_width, D = w.shape.value_dim, lda = padded16(D);
  const int64_t per_head = xwx_keys_floats(w, tokens), tiles = key_tiles(tokens);
  float* scores = workspace;
  float* acc = scores + m * kScoreLd;
  float* run_max = acc + m * lda;
  float* run_sum = run_max + padded16(m);
  float* pre = run_sum + padded16(m);
  float* post = pre + padded16(m);
  float* pending = post + padded16(m);
  gemm::Epilogue padded_c;
  padded_c.c_padded = true;
  gemm::Epilogue onto;
  onto.accumulate = true;
  for (int64_t h = 0; h < w.shape.heads; ++h) {
    const float* left = proj + q0 * ldp + w.left_col(h);
    const float* k_panels = keys + h * per_head;
    const float* v_tiles = k_panels + gemm::packed_floats(tokens, lw);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t k0 = t * kXwxKeyTile, kt = std::min(kXwxKeyTile, tokens - k0);
      // S = [L_h | 1] · [K_h | kb_h]ᵀ for this key tile (its panels are contiguous: k0 is a panel boundary).
      gemm::gemm_raw(m, left, ldp, k_panels + (k0 / gemm::kNr) * lw * gemm::kNr, kt, lw, scores, kScoreLd,
                     padded_c, isa);
      for (int64_t i = 0; i < m; ++i) {
        float* row = scores + i * kScoreLd;
        const float mx = row_max(row, kt, t == 0 ? -std::numeric_limits<float>::infinity() : run_max[i]);
        row[kt] = mx;  // E, the augmented column (header); the softmax overwrites it with p_E ...
        post[i] = mx;  // ... so E is kept here until the update below
      }
      gemm::softmax_rows(scores, m, kt + 1, kScoreLd, 1.0f, isa);
      for (int64_t i = 0; i < m; ++i) {
        const float p_e = scores[i * kScoreLd + kt], new_max = post[i];
        const float tile_sum = (1.0f - p_e) / p_e;  // Σ_j e^(s_j − E)
        const float old = t == 0 ? 0.0f : run_sum[i] * std::exp(run_max[i] - new_max);
        const float total = old + tile_sum;
        pre[i] = old * p_e;  // normalised acc · pre = (Σ_old e^(s − E) v) · p_E, the scale P · V is in
        post[i] = 1.0f / (total * p_e);
        run_max[i] = new_max;
        run_sum[i] = total;
      }
      if (t == 0) {
        gemm::gemm_raw(m, scores, kScoreLd, v_tiles, D, kt, acc, lda, gemm::Epilogue(), isa);
      } else {
        // acc · pending is the softmax-weighted mean of the values seen so far; one pass applies both that
        // normalisation and this tile's rescale.
        for (int64_t i = 0; i < m; ++i) pre[i] *= pending[i];
        scale_rows(acc, m, D, lda, pre);
        gemm::gemm_raw(m, scores, kScoreLd, v_tiles + t * gemm::packed_floats(D, kXwxKeyTile), D, kt, acc, lda,
                       onto, isa);
      }
      std::copy(post, post + m, pending);
    }
    scale_rows(acc, m, D, lda, pending);
    // Head h through its own block of the output projection, straight into the output rows (eq. 3).
    gemm::Epilogue ep;
    if (h == 0) {
      ep.bias = true;  // b_o lives in w_o[0]
      ep.addend = residual != nullptr ? residual + q0 * ld_res : nullptr;
      ep.ld_addend = ld_res;
    } else {
      ep.accumulate = true;
    }
    gemm::gemm(m, acc, lda, w.w_o[size_t(h)], out + q0 * ldo, ldo, ep, isa);
  }
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

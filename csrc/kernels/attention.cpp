#include "kernels/attention.h"

#include "kernels/gemm.h"

namespace vitfast {

namespace {
int64_t padded(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }
}  // namespace

int64_t attention_workspace_floats(int64_t tokens, int64_t head_dim, int64_t q_rows) {
  return gemm::packed_floats(tokens, head_dim) + gemm::packed_floats(head_dim, tokens) + q_rows * padded(tokens);
}

void attention_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                    int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa) {
  if (q1 <= q0) return;
  const int64_t d = head_dim, attn_dim = heads * head_dim;
  float* k_panels = workspace;
  float* v_panels = k_panels + gemm::packed_floats(tokens, d);
  float* scores = v_panels + gemm::packed_floats(d, tokens);
  const int64_t ld_s = padded(tokens);
  const float* q = qkv + h * d;
  const float* k = qkv + attn_dim + h * d;
  const float* v = qkv + 2 * attn_dim + h * d;
  gemm::pack_b_transposed(k, tokens, d, ld_qkv, k_panels);  // B = K_hᵀ  [D × N]
  gemm::pack_b(v, tokens, d, ld_qkv, v_panels);             // B = V_h   [N × D]
  const int64_t m = q1 - q0;
  // S = Q_h · K_hᵀ, whole panels into the padded scratch (the padding columns are never read back).
  gemm::Epilogue padded_c;
  padded_c.c_padded = true;
  gemm::gemm_raw(m, q + q0 * ld_qkv, ld_qkv, k_panels, tokens, d, scores, ld_s, padded_c, isa);
  gemm::softmax_rows(scores, m, tokens, ld_s, scale, isa);
  // out_h = P · V_h, straight into the head's columns of the output rows.
  gemm::gemm_raw(m, scores, ld_s, v_panels, d, tokens, out + q0 * ld_out + h * d, ld_out, gemm::Epilogue(), isa);
}

}  // namespace vitfast

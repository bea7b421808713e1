// Collapsed non-deep attention at inference (non-deep ViT eq. 3, 6-7), on the GEMM core:
//
//   out = residual + b_o + Σ_h softmax_j(x W_h xᵀ + 1 (x key_bias_h)ᵀ) · (x w_v[h]) · w_o[h]
//
//   x [tokens × C] per image;  W_h = w_q[h] w_k[h]ᵀ (factored form, w_q/w_k [H, C, R]) or W_h = w_q[h] (full
//   form, R = C, the right operand is x itself);  key_bias [H, C];  w_v [H, C, D];  w_o [H, D, C_out];  b_o [C_out].
//   The softmax scale is already folded into W_h.
//
// Torch-free.  Three phases, each split between threads by the caller (the binding):
//   1. project:  one GEMM of all tokens against one packed weight whose columns are, per head h,
//                [L_h | 1] (L_h = x w_q[h], the 1 a zero weight column with bias 1), [K_h | kb_h] (factored:
//                K_h = x w_k[h], kb_h = x key_bias_h), and V_h = x w_v[h].  The key bias thus rides in the
//                score GEMM as one more reduction step ([L_h | 1] · [K_h | kb_h]ᵀ = L_h K_hᵀ + 1 kb_hᵀ) instead
//                of a pass over every score tile.  Full form: [L_h | 1] and kb_h only; the right operand
//                [x | kb_h] is assembled in phase 2.
//   2. pack_keys (per image and head): [K_h | kb_h] packed as B = (·)ᵀ in 16-key panels, and V_h packed as
//                one B per key tile.
//   3. rows (per image and block of query rows): for each head, stream key tiles of kXwxKeyTile keys with an
//                ONLINE softmax (flash attention; running max and sum per row, fp32): S = [L_h | 1] · keysᵀ into a
//                rows × kXwxKeyTile scratch tile, P = exp(S − running max) by gemm::softmax_exp_rows (two passes),
//                acc_h = e^(old max − new max) · acc_h + P · V_h(tile), and acc_h / running sum at the end.  The
//                heads' results lie side by side in a [rows × H·D] scratch, and ONE GEMM against the stacked
//                w_o blocks [H·D × C_out] writes the output rows with b_o and the residual in its epilogue
//                (eq. 3: Σ_h H_h W_O,h is that product; one K = H·D reduction instead of H accumulate passes
//                over the output rows).  No [tokens × tokens] matrix beyond one tile.
//
// The unnormalised accumulator is bounded by (keys seen) · max|v| since every weight e^(s − max) <= 1, so it
// cannot overflow at any realistic token count.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/head_operands.h"

namespace vitfast {

struct XwxShape {
  int64_t heads = 0, channels = 0, rank = 0, value_dim = 0, out_channels = 0;
  bool full = false;      // w_k absent: W_h = w_q[h] is [C × C] and the right operand is x
  bool key_bias = false;  // key_bias present
};

// Keys per tile of the online softmax: 16 panels of 16 (a 48 × 256 fp32 score tile is 48 KiB, in L2; at ViT's
// N = 197 one tile, so no rescaling pass).  Measured: 128 was 2-5% faster than 64 at DeiT-Ti/S, and 256 another
// ~2-3% faster than 128 (DeiT-S factored, 1 thread, loaded machine).
constexpr int64_t kXwxKeyTile = 256;

// Where each head's operands lie in the projection rows: per head h, head_cols columns
// [left (left_width) | right (right_width) | value (D)] starting at h · head_cols.  Phases 2 and 3 read only this,
// so they also serve projections made elsewhere (the int8 GEMMs of a quantized model: `xwx_heads`).
struct XwxLayout {
  XwxShape shape;
  int64_t left_width = 0;   // R (+1 with a key bias): columns of [L_h | 1]
  int64_t right_width = 0;  // factored: R (+1); full: 1 with a key bias (kb_h), else 0
  int64_t head_cols = 0;    // projection columns per head: left_width + right_width + D
  int64_t proj_cols() const { return shape.heads * head_cols; }
  int64_t left_col(int64_t h) const { return h * head_cols; }
  int64_t right_col(int64_t h) const { return h * head_cols + left_width; }
  int64_t value_col(int64_t h) const { return h * head_cols + left_width + right_width; }
};
XwxLayout xwx_layout(const XwxShape& shape);

// The weights, packed once (cached by the binding per weight version).
struct XwxPacked : XwxLayout {
  gemm::PackedB proj;       // B [C × H·head_cols] with the bias that makes the ones column
  gemm::PackedB w_o;        // B = the w_o blocks stacked [H·D × C_out], with b_o as its bias
  size_t bytes() const;
};

// The same weights packed for the bf16 GEMMs (gemm_bf16.h): a bf16 model's projection and output GEMMs on bf16
// operands with fp32 accumulation (the binding's bf16 path); phases 2-3 are the fp32 ones.
struct XwxPackedBf16 : XwxLayout {
  gemm16::PackedBf16B proj, w_o;
  size_t bytes() const;
};

// w_q [H, C, R], w_k [H, C, R] or nullptr (full form, R = C), key_bias [H, C] or nullptr, w_v [H, C, D],
// w_o [H, D, C_out], b_o [C_out] or nullptr; all contiguous fp32.
XwxPackedBf16 xwx_pack_bf16(const XwxShape& shape, const float* w_q, const float* w_k, const float* key_bias,
                            const float* w_v, const float* w_o, const float* b_o);
XwxPacked xwx_pack(const XwxShape& shape, const float* w_q, const float* w_k, const float* key_bias,
                   const float* w_v, const float* w_o, const float* b_o);

// Phase 1: proj [rows × proj_cols()] (row stride ldp) for token rows x [rows × C] (row stride ldx).
void xwx_project(const XwxPacked& w, int64_t rows, const float* x, int64_t ldx, float* proj, int64_t ldp, CpuIsa isa);

// Phase 2, per image and head: floats of the packed keys and values (64-byte multiples), and the scratch the
// full form needs to assemble [x | kb_h] (0 for the factored form).
int64_t xwx_keys_floats(const XwxLayout& w, int64_t tokens);
int64_t xwx_pack_scratch_floats(const XwxLayout& w, int64_t tokens);
// proj and x point at the image's row 0; keys (64-byte aligned) receives xwx_keys_floats floats.
void xwx_pack_keys(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* x, int64_t ldx,
                   int64_t h, float* keys, float* scratch);

// Head h's operands in one image's projection rows (proj, x at its row 0, strides ldp / ldx) for the attention
// kernels' strided entries (kernels/head_operands.h): Q = [L_h | 1], K = [K_h | kb_h] (factored), x (full, no key
// bias) or [x | kb_h] assembled in `scratch` (xwx_pack_scratch_floats(w, tokens) floats; nullptr: K left unset, for
// callers that read only Q and V), V = V_h.
HeadOperands xwx_head_operands(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* x,
                               int64_t ldx, int64_t h, float* scratch);

// Phase 3: query rows [q0, q1) of one image, all heads (their results side by side in the workspace).
// keys = the image's H blocks of xwx_keys_floats
// (head after head); residual [tokens × C_out] (row stride ld_res) or nullptr; out [tokens × C_out] (row
// stride ldo) must not alias residual.  workspace: xwx_rows_workspace_floats(w, q1 − q0) floats, 64-byte
// aligned.
int64_t xwx_rows_workspace_floats(const XwxPacked& w, int64_t q_rows);
void xwx_attention_rows(const XwxPacked& w, int64_t tokens, const float* proj, int64_t ldp, const float* keys,
                        int64_t q0, int64_t q1, const float* residual, int64_t ld_res, float* out, int64_t ldo,
                        float* workspace, CpuIsa isa);

// Phase 3 without the output GEMM: the heads' normalised results softmax(S_h) · V_h of query rows [q0, q1), head h
// in columns [h·D, (h+1)·D) of heads (row i is query q0 + i, row stride ldh >= H·D).  workspace:
// xwx_heads_workspace_floats(q1 − q0) floats, 64-byte aligned.
int64_t xwx_heads_workspace_floats(int64_t q_rows);
void xwx_heads_rows(const XwxLayout& w, int64_t tokens, const float* proj, int64_t ldp, const float* keys, int64_t q0,
                    int64_t q1, float* heads, int64_t ldh, float* workspace, CpuIsa isa);

// All three phases for one image on the calling thread (tests; the binding threads the phases itself).
void xwx_attention_image(const XwxPacked& w, int64_t tokens, const float* x, int64_t ldx, const float* residual,
                         int64_t ld_res, float* out, int64_t ldo, CpuIsa isa);

}  // namespace vitfast

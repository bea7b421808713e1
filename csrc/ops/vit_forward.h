// A fused timm VisionTransformer's whole inference forward as one C++ call (vitfast.nn.vit, through the extension's
// `_vit_forward`):
//
//   patch rows → patch GEMM (+ bias) → [cls, reg] tokens and + pos_embed → [norm_pre] → blocks (fused ViT, int8,
//   non-deep XWX, DW-conv or USDC gated blocks) → [norm] → pool ('token' / 'avg' / none) → [fc_norm] → [head]
//
// Why: at the digits demo's size (width 96, 4 blocks, 17 tokens) the model's Python — module calls, timm's
// forward_features / _pos_embed / forward_head, each op's Python entry and dispatch — was about half of a batch-1
// forward (docs/performance.md, "Tiny models"): 281 µs a forward, of which the four block ops' own time was 126 µs.
// Each step here is what the module path calls, with the same tensors: the patch GEMM and a PackedLinear head are
// `linear`'s CPU body (same packed-weight cache entries, same kernels); a block is `vit_block`'s, an int8 block's
// five ops (int8_block.h), or the ops an XWX / DW-conv / gated block's modules call; the model's LayerNorms, the
// average pool and a plain nn.Linear head are the same ATen calls as the modules'; the cls / pos additions are the
// same IEEE additions as timm's — so the logits have exactly the bits of the module path (tests/test_vit_forward.py
// checks it).  The one difference in work: with 'token' pooling the final LayerNorm normalises only the class-token
// rows the pool keeps (a LayerNorm's row depends on that row alone).
//
// Not an op: Python (vitfast.nn.vit.direct_forward) takes this call only where the module path would run these
// very kernels (inference, CPU, fp32 images of the model's size, no hooks, the auto backend, no tracing), so it needs
// no schema, reference or autograd beyond the modules'.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/int8_block.h"

namespace vitfast {
namespace ops {

// vit_block's CPU binding (ops/vit_block.cpp).
at::Tensor vit_block_op(const at::Tensor& x, double norm1_eps, const at::Tensor& w_qkv,
                        const std::optional<at::Tensor>& b_qkv, int64_t num_heads, const at::Tensor& w_proj,
                        const std::optional<at::Tensor>& b_proj, std::optional<double> ffn_norm_eps,
                        const at::Tensor& w_in, const std::optional<at::Tensor>& b_in, const at::Tensor& w_out,
                        const std::optional<at::Tensor>& b_out, bool ffn_residual);
// The other ops' CPU bindings (ops/<op>.cpp), for the blocks and the stem / head.
at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& residual = std::nullopt);
at::Tensor layer_norm_affine_op(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps);
at::Tensor channel_idle_ffn_op(const at::Tensor& x, const at::Tensor& w_in, const std::optional<at::Tensor>& b_in,
                               const at::Tensor& w_out, const std::optional<at::Tensor>& b_out,
                               const std::optional<at::Tensor>& residual);
at::Tensor xwx_attention_op(const at::Tensor& x, const at::Tensor& w_q, const std::optional<at::Tensor>& w_k,
                            const std::optional<at::Tensor>& key_bias, const at::Tensor& w_v, const at::Tensor& w_o,
                            const std::optional<at::Tensor>& b_o, const std::optional<at::Tensor>& residual);
at::Tensor xwx_heads_bf16_op(const at::Tensor& proj, const std::optional<at::Tensor>& x, int64_t num_heads,
                             int64_t value_dim);
at::Tensor xwx_heads_int8_op(const at::Tensor& proj, const std::optional<at::Tensor>& x, int64_t num_heads,
                             int64_t value_dim);
at::Tensor xwx_heads_op(const at::Tensor& proj, const std::optional<at::Tensor>& x, int64_t num_heads,
                        int64_t value_dim);
at::Tensor dwconv_heads_op(const at::Tensor& v, const at::Tensor& kernel, int64_t grid_h, int64_t grid_w);
at::Tensor batch_gate_op(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                         const std::optional<at::Tensor>& w2, const std::optional<at::Tensor>& b2, bool layer_norm,
                         const std::string& act, double eps);
at::Tensor dwconv_attention_op(const at::Tensor& x, const at::Tensor& w_v, const std::optional<at::Tensor>& b_v,
                               const at::Tensor& kernel, const at::Tensor& w_o, const std::optional<at::Tensor>& b_o,
                               int64_t grid_h, int64_t grid_w, const std::optional<at::Tensor>& residual);

// A plain torch / timm LayerNorm over the last dimension (F.layer_norm), or none.
struct ForwardNorm {
  bool present = false;
  std::optional<at::Tensor> weight, bias;
  double eps = 0.0;
};

// One fused block, as the module path runs it:
//   kVit     FusedBlock: vit_block's arguments (one call of its CPU binding)
//   kInt8    an int8 FusedBlock: int8_block's (its five ops)
//   kXwx     FusedXWXBlock: layer_norm → xwx_attention (+ x) → the FFN sub-block
//   kXwxProjected  a FusedXWXBlock whose attention is a ProjectedXWXAttention (an int8 model's): layer_norm →
//            proj_in linear[_int8] → xwx_heads → proj_out linear[_int8] (+ x) → the FFN sub-block
//   kDwconv  FusedDWConvBlock: layer_norm → [qkv linear → attention → proj (+ x)] → dwconv_attention (+ shortcut)
//            → the FFN sub-block
//   kDwconvProjected  a FusedDWConvBlock with int8 layers (an int8 model's): the same, each layer linear[_int8], and
//            value → dwconv_heads → out_proj (+ shortcut) unless value and out_proj are both fp32
//   kGated   FusedGatedBlock (USDC): batch_gate's [MHSA, FFN] decision for the batch, then both sub-blocks as one
//            vit_block call when both are open (and the block has both), else each open sub-block: the MHSA one
//            (layer_norm → qkv linear → attention → proj (+ x)) and the FFN one
//   kParts   a FusedBlock that does not run as one call (an int8 model with some layers kept fp32): its MHSA
//            sub-block, then its FFN sub-block, as kGated runs them with both open
// where the FFN sub-block (FusedChannelIdleFFN) is [layer_norm →] channel_idle_ffn [+ its input], or for an int8
// model's Int8ChannelIdleFFN (ffn_int8) [layer_norm →] channel_idle_ffn_int8 [+ its input]; a gated block's MHSA
// sub-block with Int8Linear qkv / proj (attn_int8) runs int8_block's heads, and both open as one int8_block.
enum class BlockKind : int64_t { kVit = 0, kInt8 = 1, kXwx = 2, kDwconv = 3, kGated = 4, kParts = 5,
                                 kXwxProjected = 6, kDwconvProjected = 7 };

// One linear layer of a block: an nn.Linear's weight and bias (fp32), or an Int8Linear's arguments.
struct ForwardLinear {
  bool int8 = false;
  at::Tensor weight;
  std::optional<at::Tensor> bias;
  Int8LinearArgs q;
};

struct ForwardBlock {
  BlockKind kind = BlockKind::kVit;
  double norm1_eps = 0.0;
  // kVit (w_qkv, w_proj and their biases; the FFN's tensors below)
  at::Tensor w_qkv, w_proj;
  std::optional<at::Tensor> b_qkv, b_proj;
  int64_t num_heads = 1;
  // FFN (kVit, kXwx, kDwconv): w_in, b_in, w_out, b_out; its LayerNorm (kVit: ffn_norm_eps, no affine; the others:
  // ffn_norm, the module's) and whether it adds its input
  at::Tensor w_in, w_out;
  std::optional<at::Tensor> b_in, b_out;
  std::optional<double> ffn_norm_eps;
  ForwardNorm ffn_norm;
  bool ffn_residual = false;
  // kInt8, and the int8 sub-blocks of the others: qkv / proj / attention (attn_int8: a kGated MHSA sub-block) and
  // ffn (ffn_int8: a kXwx, kDwconv or kGated FFN sub-block, with ffn_norm its norm)
  Int8LinearArgs qkv, proj;
  Int8FfnArgs ffn;
  BlockAttention attention = BlockAttention::kFp32;
  bool attn_int8 = false, ffn_int8 = false;
  // kXwx: xwx_attention's weights
  at::Tensor w_q, w_v, w_o;
  std::optional<at::Tensor> w_k, key_bias, b_o;
  // kXwxProjected: the projection and output layers, and xwx_heads' arguments (num_heads above; full: the heads
  // read the normed tokens as the right operand; products: xwx_heads, xwx_heads_int8 or xwx_heads_bf16)
  ForwardLinear xwx_in, xwx_out;
  int64_t value_dim = 0;
  bool xwx_full = false;
  BlockAttention xwx_products = BlockAttention::kFp32;
  // kDwconv: the attention heads (if any: w_qkv / b_qkv / num_heads above, attn_proj without bias), the value
  // projection, the depthwise kernel, the output projection and the token grid
  std::optional<at::Tensor> attn_proj;
  at::Tensor value_w, conv_kernel, out_w;
  std::optional<at::Tensor> value_b, out_b;
  int64_t grid_h = 0, grid_w = 0;
  // kDwconvProjected: its layers (qkv / attn_proj absent without attention heads; num_heads above) and the kernel
  // (conv_kernel above), the grid above
  std::optional<ForwardLinear> dw_qkv, dw_attn_proj;
  ForwardLinear dw_value, dw_out;
  // kGated: the gate's network (batch_gate's arguments after x); whether the block has each sub-block (the MHSA one
  // in w_qkv / b_qkv / num_heads / w_proj / b_proj or the int8 fields, the FFN one above; kParts has both), and
  // whether both together run as vit_block
  at::Tensor gate_w1;
  std::optional<at::Tensor> gate_b1, gate_w2, gate_b2;
  bool gate_layer_norm = false;
  std::string gate_act = "none";
  double gate_eps = 1e-5;
  bool has_attn = false, has_ffn = false, whole = false;
};

enum class ForwardPool : int64_t { kNone = 0, kToken = 1, kAvg = 2 };
enum class ForwardHead : int64_t { kIdentity = 0, kPacked = 1, kAten = 2 };

struct VitForwardPlan {
  // The model's float dtype (the images', the embeddings', norms' and head's): fp32, or bf16 for a bf16 model whose
  // blocks are all kVit (vit_block's bf16 GEMMs; needs a CPU bf16 extension, which the caller checks).
  at::ScalarType dtype = at::kFloat;
  // Stem: the patch projection's conv weight [C, C_in, p, q] (contiguous) and bias, or an int8 projection's
  // linear_int8 arguments (stem_int8).
  int64_t patch_h = 1, patch_w = 1;
  at::Tensor patch_weight;
  std::optional<at::Tensor> patch_bias;
  bool stem_int8 = false;
  Int8LinearArgs stem_q;
  // Tokens: cls_token [1, 1, C], reg_token [1, R, C] (either may be absent), pos_embed [1, L, C];
  // no_embed_class: pos_embed covers the patch tokens only (added before the prefix tokens are put in front).
  std::optional<at::Tensor> cls_token, reg_token;
  at::Tensor pos_embed;
  bool no_embed_class = false;
  ForwardNorm norm_pre;
  std::vector<ForwardBlock> blocks;
  ForwardNorm norm;
  ForwardPool pool = ForwardPool::kToken;
  int64_t num_prefix_tokens = 1;
  bool pool_include_prefix = false;
  ForwardNorm fc_norm;
  ForwardHead head = ForwardHead::kIdentity;
  at::Tensor head_weight;
  std::optional<at::Tensor> head_bias;
};

// The logits (or pooled features without a head) for images [B, C_in, H, W] (the plan's dtype, CPU, contiguous, H
// and W the model's image size), or nullopt when a tensor of the plan is no longer one this path takes (another
// dtype, device or layout since the plan was made): the caller then runs the module path.
std::optional<at::Tensor> vit_forward(const VitForwardPlan& plan, const at::Tensor& images);

}  // namespace ops
}  // namespace vitfast

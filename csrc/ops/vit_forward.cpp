// A fused timm VisionTransformer's inference forward as one call: see vit_forward.h.
#include "ops/vit_forward.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gemm_bf16.h"
#include "ops/op_threads.h"
#include "ops/output_pool.h"

namespace vitfast {
namespace ops {
namespace {

// The plan's tensors: CPU tensors of the model's float dtype (fp32, or bf16 for a bf16 model of kVit blocks), the
// int8 layers' int8 weights with fp32 biases.
bool float_cpu(const at::Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.scalar_type() == dtype && t.device().is_cpu();
}
bool float_cpu(const std::optional<at::Tensor>& t, at::ScalarType dtype) {
  return !t.has_value() || float_cpu(*t, dtype);
}
bool fp32_cpu(const std::optional<at::Tensor>& t) { return float_cpu(t, at::kFloat); }
bool int8_cpu(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kChar && t.device().is_cpu(); }

bool norm_ok(const ForwardNorm& n, at::ScalarType dtype) {
  return !n.present || (float_cpu(n.weight, dtype) && float_cpu(n.bias, dtype));
}

bool int8_linear_ok(const Int8LinearArgs& a) { return int8_cpu(a.qweight) && fp32_cpu(a.bias); }
bool linear_ok(const ForwardLinear& l) {
  return l.int8 ? int8_linear_ok(l.q) : float_cpu(l.weight, at::kFloat) && fp32_cpu(l.bias);
}
// A layer's weight [out × in] (the int8 one's codes when int8).
const at::Tensor& linear_weight(const ForwardLinear& l) { return l.int8 ? l.q.qweight : l.weight; }

// The FFN sub-block of a kXwx, kDwconv, kGated or kParts block (fp32 models; a kXwx block of a bf16 one).
bool ffn_ok(const ForwardBlock& b, at::ScalarType d = at::kFloat) {
  return (b.ffn_int8 ? int8_cpu(b.ffn.qw_in) : float_cpu(b.w_in, d)) && norm_ok(b.ffn_norm, d);
}

// Whether every tensor of the plan is still one this path computes with (the module path takes over otherwise:
// a model moved to another dtype or device since the plan was made, a weight made channels_last).  A bf16 plan
// takes the float block kinds (vitfast/nn/vit.py BF16_BLOCK_KINDS: the module path runs them as the same C++ ops on
// bf16 tensors).
bool plan_takes(const VitForwardPlan& p) {
  const at::ScalarType d = p.dtype;
  // bf16 only while the active path has a bf16 GEMM kernel: without one the module path runs a bf16 block as its
  // six ops (whole_block_args), not as vit_block (set_cpu_isa / VITFAST_CPU_EXT can change it after planning)
  if (d == at::kBFloat16 && gemm16::bf16_kernel(active_cpu_isa()) == gemm16::Bf16Kernel::kScalar) return false;
  const auto of = [d](const auto& t) { return float_cpu(t, d); };
  if (p.stem_int8 ? !int8_linear_ok(p.stem_q)
                  : !(of(p.patch_weight) && p.patch_weight.is_contiguous() && of(p.patch_bias)))
    return false;
  if (!of(p.pos_embed) || !of(p.cls_token) || !of(p.reg_token)) return false;
  if (!norm_ok(p.norm_pre, d) || !norm_ok(p.norm, d) || !norm_ok(p.fc_norm, d)) return false;
  for (const ForwardBlock& b : p.blocks) {
    if (d != at::kFloat && b.kind != BlockKind::kVit && b.kind != BlockKind::kXwx && b.kind != BlockKind::kDwconv &&
        b.kind != BlockKind::kGated)
      return false;
    bool ok = true;
    switch (b.kind) {
      case BlockKind::kInt8:
        ok = int8_linear_ok(b.qkv) && int8_linear_ok(b.proj) && int8_cpu(b.ffn.qw_in);
        break;
      case BlockKind::kVit:
        ok = of(b.w_qkv) && of(b.w_proj) && of(b.w_in) && of(b.w_out);
        break;
      case BlockKind::kXwx:
        ok = of(b.w_q) && of(b.w_v) && of(b.w_o) && of(b.w_k) && of(b.key_bias) && of(b.b_o) && ffn_ok(b, d);
        break;
      case BlockKind::kXwxProjected:
        ok = linear_ok(b.xwx_in) && linear_ok(b.xwx_out) && ffn_ok(b);
        break;
      case BlockKind::kDwconvProjected:
        ok = linear_ok(b.dw_value) && linear_ok(b.dw_out) && fp32_cpu(b.conv_kernel) && ffn_ok(b) &&
             (!b.dw_qkv.has_value() || (linear_ok(*b.dw_qkv) && linear_ok(*b.dw_attn_proj)));
        break;
      case BlockKind::kGated:
      case BlockKind::kParts:
        ok = (b.kind == BlockKind::kParts || of(b.gate_w1)) &&
             (!b.has_attn || (b.attn_int8 ? int8_linear_ok(b.qkv) && int8_linear_ok(b.proj)
                                          : of(b.w_qkv) && of(b.w_proj))) &&
             (!b.has_ffn || ffn_ok(b, d));
        break;
      case BlockKind::kDwconv:
        ok = of(b.value_w) && of(b.value_b) && of(b.conv_kernel) && of(b.out_w) && of(b.out_b) && ffn_ok(b, d) &&
             (!b.attn_proj.has_value() || (of(b.w_qkv) && of(b.b_qkv) && of(b.attn_proj)));
        break;
    }
    if (!ok) return false;
  }
  return p.head == ForwardHead::kIdentity || (of(p.head_weight) && of(p.head_bias));
}

at::Tensor apply_norm(const ForwardNorm& n, const at::Tensor& x) {
  if (!n.present) return x;
  // F.layer_norm's ATen call (torch passes cudnn_enable; the CPU kernel ignores it).
  return at::layer_norm(x, {x.size(-1)}, n.weight, n.bias, n.eps, true);
}

// [B, rows·cols, C_in·p·q] patch rows of contiguous NCHW images, each patch as (channel, row, column): the values
// (and order) of vitfast.nn.patch_embed.patch_rows for an NCHW input.
at::Tensor patch_rows(const at::Tensor& images, int64_t p, int64_t q) {
  const int64_t batch = images.size(0), channels = images.size(1), height = images.size(2), width = images.size(3);
  const int64_t rows = height / p, cols = width / q, k = channels * p * q;
  at::Tensor out = at::empty({batch, rows * cols, k}, images.options());
  const int64_t e = images.element_size();  // fp32 or bf16: the values are copied, not computed
  const char* src = static_cast<const char*>(images.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t gy = 0; gy < rows; ++gy)
      for (int64_t gx = 0; gx < cols; ++gx)
        for (int64_t c = 0; c < channels; ++c)
          for (int64_t py = 0; py < p; ++py) {
            const char* s = src + (((b * channels + c) * height + gy * p + py) * width + gx * q) * e;
            std::memcpy(dst, s, e * q);
            dst += e * q;
          }
  return out;
}

// timm's VisionTransformer._pos_embed on the patch tokens [B, N, C]: the prefix tokens (cls, then reg) in front, and
// pos_embed added — over all tokens, or (no_embed_class) over the patch tokens only, before the prefix goes in front.
// Each element is one fp32 addition of the same two values as timm's, so the same bits.
at::Tensor embed_tokens(const VitForwardPlan& p, const at::Tensor& patches) {
  if (p.dtype != at::kFloat) {  // bf16: timm's own ATen calls (cat, then add; or add, then cat), the same roundings
    const int64_t batch = patches.size(0);
    std::vector<at::Tensor> parts;
    if (p.cls_token.has_value()) parts.push_back(p.cls_token->expand({batch, -1, -1}));
    if (p.reg_token.has_value()) parts.push_back(p.reg_token->expand({batch, -1, -1}));
    if (p.no_embed_class) {
      parts.push_back(patches + p.pos_embed);
      return parts.size() == 1 ? parts.front() : at::cat(parts, 1);
    }
    parts.push_back(patches);
    return (parts.size() == 1 ? patches : at::cat(parts, 1)) + p.pos_embed;
  }
  const int64_t batch = patches.size(0), n = patches.size(1), c = patches.size(2);
  const int64_t cls = p.cls_token.has_value() ? 1 : 0, reg = p.reg_token.has_value() ? p.reg_token->size(1) : 0;
  const int64_t prefix = cls + reg, tokens = prefix + n;
  const at::Tensor pos = p.pos_embed.contiguous();
  const float* pe = pos.data_ptr<float>();
  at::Tensor out = empty_output({batch, tokens, c}, at::kFloat);
  float* o = out.data_ptr<float>();
  const at::Tensor cls_t = cls ? p.cls_token->contiguous() : at::Tensor();
  const at::Tensor reg_t = reg ? p.reg_token->contiguous() : at::Tensor();
  const at::Tensor pc = patches.contiguous();
  const float* src = pc.data_ptr<float>();
  const int64_t patch_pos = p.no_embed_class ? 0 : prefix;  // pos_embed row of the first patch token
  for (int64_t b = 0; b < batch; ++b) {
    float* ob = o + b * tokens * c;
    for (int64_t t = 0; t < prefix; ++t) {
      const float* v = t < cls ? cls_t.data_ptr<float>() : reg_t.data_ptr<float>() + (t - cls) * c;
      if (p.no_embed_class) {
        std::memcpy(ob + t * c, v, sizeof(float) * c);
      } else {
        for (int64_t j = 0; j < c; ++j) ob[t * c + j] = v[j] + pe[t * c + j];
      }
    }
    const float* sb = src + b * n * c;
    const float* pb = pe + patch_pos * c;
    float* dst = ob + prefix * c;
    for (int64_t i = 0; i < n * c; ++i) dst[i] = sb[i] + pb[i];
  }
  return out;
}

// f() under a profiler record named like the op the module path dispatches (no cost without a profiler).
template <class F>
at::Tensor recorded(const char* name, const at::Tensor& input, F&& f) {
  RECORD_FUNCTION(name, std::vector<c10::IValue>({input}));
  return f();
}

at::Tensor block_norm(const at::Tensor& x, double eps) {
  return recorded("vitfast::layer_norm", x, [&] { return layer_norm_affine_op(x, std::nullopt, std::nullopt, eps); });
}

// FusedChannelIdleFFN.forward: apply_norm(norm, x) → channel_idle_ffn(·, ..., x if residual); an
// Int8ChannelIdleFFN's: apply_norm(norm, x) → channel_idle_ffn_int8(·, ..., x if residual or split_identity).
at::Tensor ffn_sub_block(const ForwardBlock& b, const at::Tensor& x) {
  const at::Tensor y = b.ffn_norm.present ? recorded("vitfast::layer_norm", x, [&] {
    return layer_norm_affine_op(x, b.ffn_norm.weight, b.ffn_norm.bias, b.ffn_norm.eps);
  }) : x;
  if (b.ffn_int8) return int8_ffn(y, b.ffn, x);
  return recorded("vitfast::channel_idle_ffn", y, [&] {
    return channel_idle_ffn_op(y, b.w_in, b.b_in, b.w_out, b.b_out,
                               b.ffn_residual ? std::optional<at::Tensor>(x) : std::nullopt);
  });
}

// vit_block's call for a kVit block, or a kGated one with both sub-blocks open.
at::Tensor whole_block(const ForwardBlock& b, const at::Tensor& x) {
  return recorded("vitfast::vit_block", x, [&] {  // as the op's dispatch records it
    return vit_block_op(x, b.norm1_eps, b.w_qkv, b.b_qkv, b.num_heads, b.w_proj, b.b_proj, b.ffn_norm_eps, b.w_in,
                        b.b_in, b.w_out, b.b_out, b.ffn_residual);
  });
}

// FusedAttention.forward on normed rows y: qkv linear → attention → proj linear + residual.
at::Tensor attention_heads(const at::Tensor& y, const at::Tensor& w_qkv, const std::optional<at::Tensor>& b_qkv,
                           int64_t heads, const at::Tensor& w_proj, const std::optional<at::Tensor>& b_proj,
                           const at::Tensor& residual) {
  const at::Tensor qkv = recorded("vitfast::linear", y, [&] { return linear_op(y, w_qkv, b_qkv); });
  const at::Tensor h = recorded("vitfast::attention", qkv, [&] { return attention_op(qkv, heads); });
  return recorded("vitfast::linear", h, [&] { return linear_op(h, w_proj, b_proj, residual); });
}

// One layer as its module runs it: ops.linear for an nn.Linear, linear_int8 for an Int8Linear.
at::Tensor run_linear(const ForwardLinear& l, const at::Tensor& x, const std::optional<at::Tensor>& residual) {
  if (!l.int8) return recorded("vitfast::linear", x, [&] { return linear_op(x, l.weight, l.bias, residual); });
  return recorded("vitfast::linear_int8", x, [&] {
    return linear_int8_op(x, l.q.qweight, l.q.w_scale, l.q.bias, residual, l.q.smooth, l.q.act_scale);
  });
}

// The open sub-blocks of a kGated / kParts block, each as its module runs it: x + attn(LN(x)), then the FFN's.
at::Tensor sub_blocks(const ForwardBlock& b, const at::Tensor& x, bool run_attn, bool run_ffn) {
  at::Tensor h = x;
  if (b.has_attn && run_attn) {
    const at::Tensor y = block_norm(h, b.norm1_eps);
    h = b.attn_int8 ? int8_attention_heads(y, b.qkv, b.num_heads, b.attention, b.proj, h)
                    : attention_heads(y, b.w_qkv, b.b_qkv, b.num_heads, b.w_proj, b.b_proj, h);
  }
  if (b.has_ffn && run_ffn) h = ffn_sub_block(b, h);
  return h;
}

at::Tensor run_block(const ForwardBlock& b, const at::Tensor& x) {
  switch (b.kind) {
    case BlockKind::kInt8:
      return int8_block(x, b.norm1_eps, b.qkv, b.num_heads, b.attention, b.proj, b.ffn_norm_eps, b.ffn);
    case BlockKind::kVit:
      return whole_block(b, x);
    case BlockKind::kXwx: {  // FusedXWXBlock.forward
      const at::Tensor y = block_norm(x, b.norm1_eps);
      const at::Tensor x1 = recorded("vitfast::xwx_attention", y, [&] {
        return xwx_attention_op(y, b.w_q, b.w_k, b.key_bias, b.w_v, b.w_o, b.b_o, x);
      });
      return ffn_sub_block(b, x1);
    }
    case BlockKind::kXwxProjected: {  // FusedXWXBlock.forward with ProjectedXWXAttention.forward
      const at::Tensor y = block_norm(x, b.norm1_eps);
      const at::Tensor proj = run_linear(b.xwx_in, y, std::nullopt);
      const std::optional<at::Tensor> right = b.xwx_full ? std::optional<at::Tensor>(y) : std::nullopt;
      const at::Tensor heads =
          b.xwx_products == BlockAttention::kInt8
              ? recorded("vitfast::xwx_heads_int8", proj,
                         [&] { return xwx_heads_int8_op(proj, right, b.num_heads, b.value_dim); })
          : b.xwx_products == BlockAttention::kBf16
              ? recorded("vitfast::xwx_heads_bf16", proj,
                         [&] { return xwx_heads_bf16_op(proj, right, b.num_heads, b.value_dim); })
              : recorded("vitfast::xwx_heads", proj,
                         [&] { return xwx_heads_op(proj, right, b.num_heads, b.value_dim); });
      return ffn_sub_block(b, run_linear(b.xwx_out, heads, x));
    }
    case BlockKind::kGated: {  // FusedGatedBlock.forward on the CPU
      const at::Tensor decision = recorded("vitfast::batch_gate", x, [&] {
        return batch_gate_op(x, b.gate_w1, b.gate_b1, b.gate_w2, b.gate_b2, b.gate_layer_norm, b.gate_act, b.gate_eps);
      });
      // The module path's bool(v) of decision.tolist(): nonzero (NaN included) is open.
      const at::Tensor d = decision.to(at::kFloat).contiguous();
      const float* dp = d.data_ptr<float>();
      const bool run_attn = dp[0] != 0.0f, run_ffn = dp[1] != 0.0f;
      if (run_attn && run_ffn && b.whole) {
        if (b.attn_int8)  // an int8 block's five ops (the module path's int8_block_forward)
          return int8_block(x, b.norm1_eps, b.qkv, b.num_heads, b.attention, b.proj, b.ffn_norm_eps, b.ffn);
        return whole_block(b, x);
      }
      return sub_blocks(b, x, run_attn, run_ffn);
    }
    case BlockKind::kParts:  // FusedBlock.forward's module calls
      return sub_blocks(b, x, true, true);
    case BlockKind::kDwconvProjected: {  // FusedDWConvBlock.forward with int8 layers
      const at::Tensor xn = block_norm(x, b.norm1_eps);
      at::Tensor shortcut = x;
      if (b.dw_qkv.has_value()) {
        const at::Tensor qkv = run_linear(*b.dw_qkv, xn, std::nullopt);
        const at::Tensor h = recorded("vitfast::attention", qkv, [&] { return attention_op(qkv, b.num_heads); });
        shortcut = run_linear(*b.dw_attn_proj, h, x);
      }
      at::Tensor x1;
      if (!b.dw_value.int8 && !b.dw_out.int8) {
        x1 = recorded("vitfast::dwconv_attention", xn, [&] {
          return dwconv_attention_op(xn, b.dw_value.weight, b.dw_value.bias, b.conv_kernel, b.dw_out.weight,
                                     b.dw_out.bias, b.grid_h, b.grid_w, shortcut);
        });
      } else {
        const at::Tensor v = run_linear(b.dw_value, xn, std::nullopt);
        const at::Tensor u = recorded("vitfast::dwconv_heads", v, [&] {
          return dwconv_heads_op(v, b.conv_kernel, b.grid_h, b.grid_w);
        });
        x1 = run_linear(b.dw_out, u, shortcut);
      }
      return ffn_sub_block(b, x1);
    }
    case BlockKind::kDwconv: {  // FusedDWConvBlock.forward
      const at::Tensor xn = block_norm(x, b.norm1_eps);
      at::Tensor shortcut = x;
      if (b.attn_proj.has_value())  // x + attention heads · W^O (no bias)
        shortcut = attention_heads(xn, b.w_qkv, b.b_qkv, b.num_heads, *b.attn_proj, std::nullopt, x);
      const at::Tensor x1 = recorded("vitfast::dwconv_attention", xn, [&] {
        return dwconv_attention_op(xn, b.value_w, b.value_b, b.conv_kernel, b.out_w, b.out_b, b.grid_h, b.grid_w,
                                   shortcut);
      });
      return ffn_sub_block(b, x1);
    }
  }
  return x;
}

// block_macs' (weight elements, attention width) of a block without a whole-block op of its own: its GEMMs'
// weights, and the width that makes 2·B·N²·width its score and value products (an XWX head scores over rank R and
// weighs values of width D: H·(R + D) / 2).
int64_t ffn_weight_elements(const ForwardBlock& b) {
  if (!b.has_ffn && (b.kind == BlockKind::kGated || b.kind == BlockKind::kParts)) return 0;
  return b.ffn_int8 ? b.ffn.qw_in.numel() + b.ffn.qw_out.numel() : b.w_in.numel() + b.w_out.numel();
}
std::pair<int64_t, int64_t> parts_macs_shape(const ForwardBlock& b) {
  switch (b.kind) {
    case BlockKind::kXwx:
      return {b.w_q.numel() + (b.w_k.has_value() ? b.w_k->numel() : 0) + b.w_v.numel() + b.w_o.numel() +
                  ffn_weight_elements(b),
              b.w_q.size(0) * (b.w_q.size(2) + b.w_v.size(2)) / 2};
    case BlockKind::kXwxProjected: {  // per head P = left + right + D columns, left ≈ (P − D (+ C, full)) / 2
      const at::Tensor& w_in = linear_weight(b.xwx_in);
      const int64_t per_head = w_in.size(0) / b.num_heads, d = b.value_dim;
      const int64_t left = (per_head - d + (b.xwx_full ? w_in.size(1) : 0)) / 2;
      return {w_in.numel() + linear_weight(b.xwx_out).numel() + ffn_weight_elements(b), b.num_heads * (left + d) / 2};
    }
    case BlockKind::kDwconvProjected: {
      const bool heads = b.dw_qkv.has_value();
      return {linear_weight(b.dw_value).numel() + linear_weight(b.dw_out).numel() +
                  (heads ? linear_weight(*b.dw_qkv).numel() + linear_weight(*b.dw_attn_proj).numel() : 0) +
                  ffn_weight_elements(b),
              heads ? linear_weight(*b.dw_attn_proj).size(1) : 0};
    }
    case BlockKind::kDwconv: {
      const bool heads = b.attn_proj.has_value();
      return {b.value_w.numel() + b.out_w.numel() + (heads ? b.w_qkv.numel() + b.attn_proj->numel() : 0) +
                  ffn_weight_elements(b),
              heads ? b.attn_proj->size(1) : 0};
    }
    default: {  // kGated, kParts
      int64_t weights = ffn_weight_elements(b), width = 0;
      if (b.has_attn) {
        weights += b.attn_int8 ? b.qkv.qweight.numel() + b.proj.qweight.numel() : b.w_qkv.numel() + b.w_proj.numel();
        width = b.attn_int8 ? b.proj.qweight.size(1) : b.w_proj.size(1);
      }
      return {weights, width};
    }
  }
}

// Whether the model's blocks are too small for a parallel region to pay (the blocks' own rule, op_threads.h and
// int8_common.h, for its first block): then every op of the call runs on the calling thread, the patch GEMM and the
// head included.  At 17 tokens and width 96 a parallel region cost more than its second thread saved (~90 µs each
// under OMP_WAIT_POLICY=PASSIVE on a shared 2-core host, against a 10 µs patch GEMM); the split only changes which
// thread computes a row, never its arithmetic, so the bits are the same.  The non-deep, DW-conv, gated and
// sub-block kinds take the fp32 block's threshold on their own multiply-adds.
bool runs_serial(const VitForwardPlan& p, int64_t batch, int64_t tokens) {
  if (p.blocks.empty()) return false;
  const ForwardBlock& b = p.blocks.front();
  if (b.kind == BlockKind::kInt8) return int8_block_runs_serial(batch, tokens, b.qkv, b.proj, b.ffn);
  if (b.kind == BlockKind::kVit)
    return float_block_runs_serial(batch, tokens, b.w_qkv.numel() + b.w_proj.numel() + b.w_in.numel() +
                                   b.w_out.numel(), b.w_proj.size(-1));
  const auto [weights, width] = parts_macs_shape(b);
  return float_block_runs_serial(batch, tokens, weights, width);
}

}  // namespace

std::optional<at::Tensor> vit_forward(const VitForwardPlan& p, const at::Tensor& images) {
  if (!float_cpu(images, p.dtype) || images.dim() != 4 || !images.is_contiguous() || !plan_takes(p))
    return std::nullopt;
  const int64_t c_in = images.size(1);
  if (images.size(2) % p.patch_h != 0 || images.size(3) % p.patch_w != 0) return std::nullopt;
  const int64_t n = (images.size(2) / p.patch_h) * (images.size(3) / p.patch_w);
  const int64_t prefix = (p.cls_token.has_value() ? 1 : 0) + (p.reg_token.has_value() ? p.reg_token->size(1) : 0);
  if (p.pos_embed.dim() != 3 || p.pos_embed.size(1) != n + (p.no_embed_class ? 0 : prefix)) return std::nullopt;

  RECORD_FUNCTION("vitfast::vit_forward", std::vector<c10::IValue>({images}));
  const SerialOps serial(runs_serial(p, images.size(0), prefix + n));
  // Stem: GemmPatchProjection / Int8PatchProjection's forward (patch rows, then linear / linear_int8).
  const at::Tensor rows = patch_rows(images, p.patch_h, p.patch_w);
  at::Tensor tokens;
  if (p.stem_int8) {
    tokens = recorded("vitfast::linear_int8", rows, [&] {
      return linear_int8_op(rows, p.stem_q.qweight, p.stem_q.w_scale, p.stem_q.bias, std::nullopt, p.stem_q.smooth,
                            p.stem_q.act_scale);
    });
  } else {
    if (p.patch_weight.size(1) != c_in) return std::nullopt;
    tokens = recorded("vitfast::linear", rows, [&] {
      return linear_op(rows, p.patch_weight.reshape({p.patch_weight.size(0), -1}), p.patch_bias);
    });
  }
  at::Tensor x = apply_norm(p.norm_pre, embed_tokens(p, tokens));
  for (const ForwardBlock& b : p.blocks) x = run_block(b, x);

  at::Tensor pooled;
  switch (p.pool) {
    case ForwardPool::kToken:  // the class token's row (x[:, 0]); the norm on that row only
      pooled = apply_norm(p.norm, x.select(1, 0));
      break;
    case ForwardPool::kAvg: {
      const at::Tensor normed = apply_norm(p.norm, x);
      pooled = (p.pool_include_prefix ? normed : normed.slice(1, p.num_prefix_tokens)).mean(1);
      break;
    }
    case ForwardPool::kNone:
      pooled = apply_norm(p.norm, x);
      break;
  }
  pooled = apply_norm(p.fc_norm, pooled);
  switch (p.head) {
    case ForwardHead::kIdentity:
      return pooled;
    case ForwardHead::kPacked:
      return recorded("vitfast::linear", pooled, [&] { return linear_op(pooled, p.head_weight, p.head_bias); });
    case ForwardHead::kAten:
      return at::linear(pooled, p.head_weight, p.head_bias);
  }
  return pooled;
}

}  // namespace ops
}  // namespace vitfast

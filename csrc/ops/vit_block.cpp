// torch binding of the whole fused ViT block: `torch.ops.vitfast.vit_block` on CPU.
//
//   vit_block(Tensor x, float norm1_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, Tensor w_proj,
//             Tensor? b_proj, float? ffn_norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, Tensor? b_out,
//             bool ffn_residual) -> Tensor                                   (schema: vitfast/ops/vit_block.py)
//   x1 = x + proj(attention(qkv(LN(x))));  out = channel_idle_ffn([LN](x1)) [+ x1]   (= reference.vit_block)
//
// Why one op: a fixed cost per op call (dispatcher round trip with argument boxing, output allocation, the
// modules' Python) that the kernels cannot win back: one thread, interleaved, a 12-block model of near-zero FLOPs
// (48 wide, 5 tokens) ran ~35 µs less per block as this op than as six ops, a DeiT-Ti block at batch 1 ~5% less
// (benchmarks/bench_vit_block.py), a fused RePa-DeiT-Ti forward ~3% (docs/performance.md).  The six steps call the ops' own bodies (ops/cpu_ops.h) on one
// scratch buffer: same packed weights, same thread split, same kernels, so the result has exactly the bits of the
// op-by-op path.
//
// - fp32, and bf16 (the op-by-op path rounds between ops in fp16/bf16; vitfast.nn.Block takes this op for fp32, and
//   for bf16 when the CPU has a bf16 extension).  bf16 with the extension: the four GEMM inputs (norm1's output,
//   the heads' output, the FFN input, h_act) are rounded to bf16 once each and the GEMMs accumulate in fp32
//   (gemm_bf16.h), as do attention's Q·Kᵀ and P·V (attention_head_bf16: Q, K, V, P rounded to bf16; with an even
//   head dim the qkv GEMM stores only that rounding of its fp32 result); x, the LayerNorms, the softmax, x1, GELU,
//   biases and residuals stay fp32 in the block, and the output is rounded to bf16 once.  So it does not round between ops as the op-by-op bf16 path
//   does: more accurate than it, not its bits.  bf16 without the extension: the fp32 block on the fp32 conversions,
//   rounded once (block.py does not route bf16 here then: its six ops keep their behaviour).
//   fp16 is refused (the same message as reference.vit_block's fp32-only check: it names the fp32 op).
// - Checks: the same as vitfast.reference.vit_block.check_vit_block_args, same wording (ValueError).
// - Inference only: no autograd formula (vitfast.ops.vit_block runs the six ops when a gradient is needed).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "kernels/cpu_features.h"
#include "ops/cpu_ops.h"
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/output_pool.h"
#include "ops/vit_forward.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

void check_eps(const char* name, double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, name, ": expected a finite number >= 0, got ", eps);
}

// Mirror of vitfast.reference.vit_block.check_vit_block_args (same order, same messages).  Returns the head dim.
int64_t check_args(const at::Tensor& x, double norm1_eps, const at::Tensor& w_qkv, const at::Tensor& b_qkv,
                   int64_t num_heads, const at::Tensor& w_proj, const at::Tensor& b_proj,
                   const std::optional<double>& ffn_norm_eps, const at::Tensor& w_in, const at::Tensor& b_in,
                   const at::Tensor& w_out, const at::Tensor& b_out) {
  check_required({{"x", &x}});
  TORCH_CHECK_VALUE(x.dim() == 3, "x: expected 3-D [B, N, C], got shape ", fmt_shape(x.sizes()));
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                    "x: expected dtype torch.float32 or torch.bfloat16 (the block op's dtypes), got ",
                    py_dtype(x.scalar_type()));
  const int64_t c = x.size(2);
  check_eps("norm1_eps", norm1_eps);
  if (ffn_norm_eps.has_value()) check_eps("ffn_norm_eps", *ffn_norm_eps);
  TORCH_CHECK_VALUE(num_heads >= 1, "num_heads: expected an int >= 1, got ", num_heads);
  check_required({{"w_qkv", &w_qkv}, {"w_proj", &w_proj}});
  TORCH_CHECK_VALUE(w_qkv.dim() == 2 && w_qkv.size(1) == c, "w_qkv: expected shape [3·H·D, ", c, "] (C = x.shape[-1] = ",
                    c, "), got ", fmt_shape(w_qkv.sizes()));
  const int64_t width = w_qkv.size(0);
  TORCH_CHECK_VALUE(width > 0 && width % 3 == 0 && width / 3 % num_heads == 0, "w_qkv: expected a first dimension a "
                    "positive multiple of 3·num_heads = ", exact_product(3, num_heads), ", got shape ",
                    fmt_shape(w_qkv.sizes()));
  const int64_t attn_dim = width / 3;
  TORCH_CHECK_VALUE(w_proj.dim() == 2 && w_proj.size(0) == c && w_proj.size(1) == attn_dim, "w_proj: expected shape [",
                    c, ", ", attn_dim, "] ([C, H·D]), got ", fmt_shape(w_proj.sizes()));
  check_same_dtype_device_as_x(x, {{"w_qkv", &w_qkv}, {"b_qkv", &b_qkv}, {"w_proj", &w_proj}, {"b_proj", &b_proj}});
  check_bias_shape("b_qkv", b_qkv, width);
  check_bias_shape("b_proj", b_proj, c);
  const ChannelIdleFfnDims d = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, at::Tensor());
  TORCH_CHECK_VALUE(d.c_out == c, "w_out: expected shape [", c, ", A] (C = x.shape[-1] = ", c,
                    ": the block keeps its width), got ", fmt_shape(w_out.sizes()));
  check_dense({{"x", &x}, {"w_qkv", &w_qkv}, {"b_qkv", &b_qkv}, {"w_proj", &w_proj}, {"b_proj", &b_proj}});
  return attn_dim / num_heads;
}

// The block on the bf16 GEMMs (see the header comment): the fp32 block's steps, each GEMM input rounded to bf16 once
// (convert_rows' bits) by the step that produces it — the LayerNorms a few rows at a time (layer_norm_run_bf16), the
// heads' output by the P·V epilogue, x1 by the proj epilogue beside its fp32 store — so no GEMM input has an fp32
// copy; the weights from the bf16 cache entries.  Same bits as rounding each fp32 input with convert_rows.
at::Tensor vit_block_bf16(const at::Tensor& x, double norm1_eps, const at::Tensor& w_qkv, const at::Tensor& b_qkv,
                          int64_t heads, int64_t d, const at::Tensor& w_proj, const at::Tensor& b_proj,
                          const std::optional<double>& ffn_norm_eps, const at::Tensor& w_in, const at::Tensor& b_in,
                          const at::Tensor& w_out, const at::Tensor& b_out, bool ffn_residual,
                          gemm16::Bf16Kernel kernel) {
  const int64_t batch = x.size(0), tokens = x.size(1), c = x.size(2), rows = batch * tokens, attn_dim = heads * d;
  const auto qkv_w = packed_linear_weight_bf16(w_qkv, b_qkv, "w_qkv", "b_qkv");
  const auto proj_w = packed_linear_weight_bf16(w_proj, b_proj, "w_proj", "b_proj");
  const auto ffn_w = packed_channel_idle_ffn_weights_bf16(w_in, b_in, w_out, b_out);
  // A bf16 x is widened into the scratch (x_f32) by the first LayerNorm as it reads it, and the result rounded into
  // the bf16 output by the FFN's last GEMM as it stores it: no at::Tensor::to and no pass of its own for either.
  const bool x_bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xc = x.contiguous();
  // With an even head dim qkv exists only as its bf16 rounding (qkv16: every reader of it rounds it, and attention
  // reads bf16 Q rows as they are: kernels/attention.h), the qkv GEMM's c16 store; an odd one keeps fp32 qkv.
  const bool qkv_bf16 = d % 2 == 0;
  // fp32 scratch: [qkv,] x1 [, x_f32]; the LayerNorms' and the heads' outputs exist only as bf16 rows (scratch16).
  const int64_t qkv_floats = qkv_bf16 ? 0 : rows * 3 * attn_dim;
  at::Tensor scratch = empty_output({qkv_floats + rows * c + (x_bf16 ? rows * c : 0)}, at::kFloat);
  const int64_t ld_c = gemm16::padded_k(c), ld_a = gemm16::padded_k(attn_dim);
  // The FFN's operand rows [h_act | FFN input] (kernels/channel_idle_ffn.h: its second GEMM reads both side by side;
  // h_cols() is 0 when the FFN has one path): the FFN input is written at column ld_h, the FFN writes h_act in front.
  const int64_t ld_h = ffn_w->h_cols(), ld_f = ld_h + ld_c;
  const int64_t a16_len = (rows * (std::max(ld_c, ld_a) + ld_f) + 31) / 32 * 32;  // qkv16 on a 64-byte line
  at::Tensor scratch16 = empty_output({a16_len + (qkv_bf16 ? rows * 3 * attn_dim : 0)}, at::kBFloat16);
  float* qkv = qkv_bf16 ? nullptr : scratch.data_ptr<float>();
  float* x1 = scratch.data_ptr<float>() + qkv_floats;
  uint16_t* a16 = static_cast<uint16_t*>(scratch16.data_ptr());
  uint16_t* qkv16 = qkv_bf16 ? a16 + a16_len : nullptr;
  float* x_f32 = x_bf16 ? x1 + rows * c : nullptr;
  const float* xp = x_bf16 ? x_f32 : xc.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();

  layer_norm_run_bf16(xp, a16, ld_c, rows, c, nullptr, nullptr, float(norm1_eps), isa, kernel,
                      x_bf16 ? static_cast<const uint16_t*>(xc.data_ptr()) : nullptr, x_f32);
  linear_run_bf16(*qkv_w, rows, a16, ld_c, nullptr, 0, qkv, isa, kernel, qkv16, 3 * attn_dim);
  // Q·Kᵀ and P·V on the bf16 GEMMs too: measured on the DeiT-S block (batch 1, one thread, alternating runs)
  // 1.24 -> 1.18 ms, the relative error against the fp32 block 0.223% -> 0.226%.
  // The heads' output straight to bf16 rows (the P·V epilogue's c16): the proj GEMM's operand, no fp32 copy.
  const float scale = 1.0f / std::sqrt(float(d));
  if (qkv_bf16)
    attention_run_bf16(qkv16, 3 * attn_dim, batch, tokens, heads, d, scale, nullptr, isa, kernel, a16, ld_a);
  else
    attention_run_bf16(qkv, 3 * attn_dim, batch, tokens, heads, d, scale, nullptr, isa, kernel, a16, ld_a);
  if (attn_dim % 2 != 0)
    for (int64_t r = 0; r < rows; ++r) a16[r * ld_a + attn_dim] = 0;  // the pad of odd rows
  // x1 = x + attn(...) in fp32 (the FFN's residual).  The FFN input goes to column ld_h of the FFN's operand rows,
  // after the heads' rows (which other row tiles and threads are still reading while the proj GEMM runs): without an
  // FFN norm x1 is the FFN input, rounded to bf16 by the proj GEMM's epilogue as it stores it (c16: convert_rows'
  // bits); with one, the LayerNorm's bf16 rows.
  uint16_t* ffn16 = a16 + rows * std::max(ld_c, ld_a) + ld_h;
  const bool x1_is_ffn_in = !ffn_norm_eps.has_value();
  linear_run_bf16(*proj_w, rows, a16, ld_a, xp, c, x1, isa, kernel, x1_is_ffn_in ? ffn16 : nullptr, ld_f);
  if (!x1_is_ffn_in)
    layer_norm_run_bf16(x1, ffn16, ld_f, rows, c, nullptr, nullptr, float(*ffn_norm_eps), isa, kernel);
  if (c % 2 != 0 && x1_is_ffn_in)
    for (int64_t r = 0; r < rows; ++r) ffn16[r * ld_f + c] = 0;  // the pad of odd rows (the GEMM writes c columns)
  // A bf16 block result is stored only as bf16 by the FFN's last GEMM (no fp32 out); an odd width has no whole bf16
  // pairs per row for the epilogue: its fp32 result is narrowed after.
  at::Tensor out16 = x_bf16 ? empty_output(x.sizes(), x.scalar_type()) : at::Tensor();
  uint16_t* o16 = x_bf16 ? static_cast<uint16_t*>(out16.data_ptr()) : nullptr;
  const bool epilogue16 = o16 != nullptr && c % 2 == 0;
  at::Tensor out = epilogue16 ? at::Tensor() : empty_output(x.sizes(), at::kFloat);
  channel_idle_ffn_run_bf16(*ffn_w, rows, ffn16, ld_f, ffn_residual ? x1 : nullptr,
                            epilogue16 ? nullptr : out.data_ptr<float>(), isa, kernel, epilogue16 ? o16 : nullptr,
                            ld_h > 0);
  if (!x_bf16) return out;
  if (!epilogue16) gemm16::narrow_to_bf16(out.data_ptr<float>(), rows * c, o16, kernel);
  return out16;
}

at::Tensor vit_block_cpu(const at::Tensor& x, double norm1_eps, const at::Tensor& w_qkv, const OptTensor& b_qkv_opt,
                         int64_t num_heads, const at::Tensor& w_proj, const OptTensor& b_proj_opt,
                         std::optional<double> ffn_norm_eps, const at::Tensor& w_in, const OptTensor& b_in_opt,
                         const at::Tensor& w_out, const OptTensor& b_out_opt, bool ffn_residual) {
  const at::Tensor b_qkv = b_qkv_opt.value_or(at::Tensor()), b_proj = b_proj_opt.value_or(at::Tensor());
  const at::Tensor b_in = b_in_opt.value_or(at::Tensor()), b_out = b_out_opt.value_or(at::Tensor());
  const int64_t d = check_args(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                               b_out);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t batch = x.size(0), tokens = x.size(1), c = x.size(2), rows = batch * tokens;
  const int64_t heads = num_heads, attn_dim = heads * d;
  if (rows == 0 || c == 0) return at::empty(x.sizes(), x.options());
  // A block this small runs on the calling thread (op_threads.h): its multiply-adds, the GEMMs' and attention's.
  const SerialOps serial(float_block_runs_serial(
      batch, tokens, w_qkv.numel() + w_proj.numel() + w_in.numel() + w_out.numel(), attn_dim));

  const gemm16::Bf16Kernel kernel = bf16_gemm_kernel(x.scalar_type());
  if (kernel != gemm16::Bf16Kernel::kScalar)
    return vit_block_bf16(x, norm1_eps, w_qkv, b_qkv, heads, d, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
                          ffn_residual, kernel);
  const auto qkv_w = packed_linear_weight(w_qkv, b_qkv, "w_qkv", "b_qkv");
  const auto proj_w = packed_linear_weight(w_proj, b_proj, "w_proj", "b_proj");
  const auto ffn_w = packed_channel_idle_ffn_weights(w_in, b_in, w_out, b_out);
  const at::Tensor xc = x.to(at::kFloat).contiguous();  // bf16 without the extension: its fp32 conversion
  // One scratch for the intermediates: the normed rows (norm1's, later the FFN norm's: the first is dead once
  // qkv is computed), qkv, the heads' output and the attention sub-block's result x1.
  at::Tensor scratch = empty_output({rows * (c + 3 * attn_dim + attn_dim + c)}, at::kFloat);
  at::Tensor out = empty_output(x.sizes(), at::kFloat);
  float* normed = scratch.data_ptr<float>();
  float* qkv = normed + rows * c;
  float* heads_out = qkv + rows * 3 * attn_dim;
  float* x1 = heads_out + rows * attn_dim;
  const float* xp = xc.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();

  layer_norm_run(xp, normed, rows, c, nullptr, nullptr, float(norm1_eps), isa);
  linear_run(*qkv_w, rows, normed, c, nullptr, 0, qkv, isa);
  attention_run(qkv, 3 * attn_dim, batch, tokens, heads, d, 1.0f / std::sqrt(float(d)), heads_out, isa);
  linear_run(*proj_w, rows, heads_out, attn_dim, xp, c, x1, isa);  // x1 = x + attn(...)
  const float* ffn_in = x1;
  if (ffn_norm_eps.has_value()) {
    layer_norm_run(x1, normed, rows, c, nullptr, nullptr, float(*ffn_norm_eps), isa);
    ffn_in = normed;
  }
  channel_idle_ffn_run(*ffn_w, rows, ffn_in, ffn_residual ? x1 : nullptr, out.data_ptr<float>(), isa);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor vit_block_op(const at::Tensor& x, double norm1_eps, const at::Tensor& w_qkv, const OptTensor& b_qkv,
                        int64_t num_heads, const at::Tensor& w_proj, const OptTensor& b_proj,
                        std::optional<double> ffn_norm_eps, const at::Tensor& w_in, const OptTensor& b_in,
                        const at::Tensor& w_out, const OptTensor& b_out, bool ffn_residual) {
  return vit_block_cpu(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
                       ffn_residual);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("vit_block", &vitfast::ops::vit_block_cpu); }

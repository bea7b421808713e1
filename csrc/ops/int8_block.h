// An int8 fused ViT block (vitfast.quantize's FusedBlock: Int8Linear qkv / proj, Int8ChannelIdleFFN) as one C++ call
// of its five CPU ops, for vitfast.nn.block.int8_block_forward (through the extension's `_int8_block`):
//
//   h = linear_int8(LN(x)) → attention[_int8 | _bf16 | fp32](h) → x1 = linear_int8(h) + x → [LN] → FFN_int8 [+ x1]
//
// Why: the block's five torch.ops calls from Python cost a dispatcher round trip each plus the Python between them:
// one call took a DeiT-S/0.75 int8 block from 0.552 to 0.518 ms at batch 1 on one thread (4.14 to 4.08 ms at batch 8;
// benchmarks/bench_vit_block.py::test_int8_block_interleaved, 300 interleaved rounds), and the digits demo's int8
// model at batch 1 from 0.82x to 0.92x of its fp32 one (4 blocks of width 96, 17 tokens: the per-call costs are most
// of such a block).  Each step is the op's own CPU binding (same checks, packed weights, thread split and kernels),
// so the result has exactly the bits of the five-op path.  Not an op of its own: the call is
// taken only where the five-op path would run on the CPU kernels (int8_block_forward decides), so it needs no schema,
// reference or autograd beyond theirs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace vitfast {
namespace ops {

// The ops' CPU bindings (ops/<op>.cpp), with the arguments the block passes.
at::Tensor layer_norm_op(const at::Tensor& x, double eps);
at::Tensor linear_int8_op(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& w_scale,
                          const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                          const std::optional<at::Tensor>& smooth, double act_scale);
at::Tensor attention_op(const at::Tensor& qkv, int64_t num_heads);
at::Tensor attention_bf16_op(const at::Tensor& qkv, int64_t num_heads);
at::Tensor attention_int8_op(const at::Tensor& qkv, int64_t num_heads);
at::Tensor channel_idle_ffn_int8_op(const at::Tensor& x, const at::Tensor& qw_in, const at::Tensor& s_in,
                                    const std::optional<at::Tensor>& b_in, const at::Tensor& qw_out,
                                    const at::Tensor& s_out, const std::optional<at::Tensor>& b_out,
                                    const std::optional<at::Tensor>& residual,
                                    const std::optional<at::Tensor>& smooth_in,
                                    const std::optional<at::Tensor>& smooth_out, double act_scale_in,
                                    double act_scale_out);

// The attention products of an int8 block (FusedAttention's int8_attention / bf16_attention flags).
enum class BlockAttention : int64_t { kFp32 = 0, kInt8 = 1, kBf16 = 2 };

// One int8 linear's tensors: qweight, w_scale, bias, smooth and the static scale (0: per token).
struct Int8LinearArgs {
  at::Tensor qweight, w_scale;
  std::optional<at::Tensor> bias, smooth;
  double act_scale;
};
struct Int8FfnArgs {
  at::Tensor qw_in, s_in;
  std::optional<at::Tensor> b_in;
  at::Tensor qw_out, s_out;
  std::optional<at::Tensor> b_out, smooth_in, smooth_out;
  double act_scale_in, act_scale_out;
  bool residual;  // add x1 (the FFN's shortcut, or the split identity): the op's residual input
};

// An int8 FusedAttention on normed rows y (its forward with Int8Linear qkv / proj): h = linear_int8(y) →
// attention[_int8 | _bf16 | fp32](h) → linear_int8(h) + residual.
at::Tensor int8_attention_heads(const at::Tensor& y, const Int8LinearArgs& qkv, int64_t num_heads,
                                BlockAttention attention, const Int8LinearArgs& proj, const at::Tensor& residual);
// Int8ChannelIdleFFN.forward after its norm: channel_idle_ffn_int8 of the normed rows y, adding x (its input) when
// ffn.residual.
at::Tensor int8_ffn(const at::Tensor& y, const Int8FfnArgs& ffn, const at::Tensor& x);

// Whether an int8 block of these weights on [batch, tokens] rows is too small for its parallel regions to pay
// (op_threads.h; min_parallel_block_macs of the active int8 kernel, int8_common.h).
bool int8_block_runs_serial(int64_t batch, int64_t tokens, const Int8LinearArgs& qkv, const Int8LinearArgs& proj,
                            const Int8FfnArgs& ffn);

at::Tensor int8_block(const at::Tensor& x, double norm1_eps, const Int8LinearArgs& qkv, int64_t num_heads,
                      BlockAttention attention, const Int8LinearArgs& proj, std::optional<double> ffn_norm_eps,
                      const Int8FfnArgs& ffn);

}  // namespace ops
}  // namespace vitfast

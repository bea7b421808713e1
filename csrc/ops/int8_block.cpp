#include "ops/int8_block.h"

#include <ATen/record_function.h>

namespace vitfast {
namespace ops {

at::Tensor int8_block(const at::Tensor& x, double norm1_eps, const Int8LinearArgs& qkv, int64_t num_heads,
                      BlockAttention attention, const Int8LinearArgs& proj, std::optional<double> ffn_norm_eps,
                      const Int8FfnArgs& ffn) {
  RECORD_FUNCTION("vitfast::int8_block", std::vector<c10::IValue>({x}));  // what a profiler shows for the block
  at::Tensor h = linear_int8_op(layer_norm_op(x, norm1_eps), qkv.qweight, qkv.w_scale, qkv.bias, std::nullopt,
                                qkv.smooth, qkv.act_scale);
  h = attention == BlockAttention::kInt8   ? attention_int8_op(h, num_heads)
      : attention == BlockAttention::kBf16 ? attention_bf16_op(h, num_heads)
                                           : attention_op(h, num_heads);
  const at::Tensor x1 = linear_int8_op(h, proj.qweight, proj.w_scale, proj.bias, x, proj.smooth, proj.act_scale);
  h = at::Tensor();  // the heads' output back to the cache before the FFN's output is taken from it
  const at::Tensor y = ffn_norm_eps.has_value() ? layer_norm_op(x1, *ffn_norm_eps) : x1;
  const std::optional<at::Tensor> residual = ffn.residual ? std::optional<at::Tensor>(x1) : std::nullopt;
  return channel_idle_ffn_int8_op(y, ffn.qw_in, ffn.s_in, ffn.b_in, ffn.qw_out, ffn.s_out, ffn.b_out,
                                  residual, ffn.smooth_in, ffn.smooth_out, ffn.act_scale_in, ffn.act_scale_out);
}

}  // namespace ops
}  // namespace vitfast

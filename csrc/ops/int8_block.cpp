#include "ops/int8_block.h"

#include <ATen/record_function.h>

#include <optional>

#include "kernels/cpu_features.h"
#include "ops/int8_common.h"
#include "ops/op_threads.h"

namespace vitfast {
namespace ops {

namespace {

// f() under a profiler record named like the op (what the five torch.ops calls showed): no cost without a profiler.
template <class F>
at::Tensor recorded(const char* name, const at::Tensor& input, F&& f) {
  RECORD_FUNCTION(name, std::vector<c10::IValue>({input}));
  return f();
}

}  // namespace

at::Tensor int8_attention_heads(const at::Tensor& y, const Int8LinearArgs& qkv, int64_t num_heads,
                                BlockAttention attention, const Int8LinearArgs& proj, const at::Tensor& residual) {
  at::Tensor h = recorded("vitfast::linear_int8", y, [&] {
    return linear_int8_op(y, qkv.qweight, qkv.w_scale, qkv.bias, std::nullopt, qkv.smooth, qkv.act_scale);
  });
  if (attention == BlockAttention::kInt8)
    h = recorded("vitfast::attention_int8", h, [&] { return attention_int8_op(h, num_heads); });
  else if (attention == BlockAttention::kBf16)
    h = recorded("vitfast::attention_bf16", h, [&] { return attention_bf16_op(h, num_heads); });
  else
    h = recorded("vitfast::attention", h, [&] { return attention_op(h, num_heads); });
  // (h, the heads' output, goes back to the output cache on return, before the caller's next op takes one)
  return recorded("vitfast::linear_int8", h, [&] {
    return linear_int8_op(h, proj.qweight, proj.w_scale, proj.bias, residual, proj.smooth, proj.act_scale);
  });
}

at::Tensor int8_ffn(const at::Tensor& y, const Int8FfnArgs& ffn, const at::Tensor& x) {
  const std::optional<at::Tensor> residual = ffn.residual ? std::optional<at::Tensor>(x) : std::nullopt;
  return recorded("vitfast::channel_idle_ffn_int8", y, [&] {
    return channel_idle_ffn_int8_op(y, ffn.qw_in, ffn.s_in, ffn.b_in, ffn.qw_out, ffn.s_out, ffn.b_out, residual,
                                    ffn.smooth_in, ffn.smooth_out, ffn.act_scale_in, ffn.act_scale_out);
  });
}

bool int8_block_runs_serial(int64_t batch, int64_t tokens, const Int8LinearArgs& qkv, const Int8LinearArgs& proj,
                            const Int8FfnArgs& ffn) {
  const int64_t weights = qkv.qweight.numel() + proj.qweight.numel() + ffn.qw_in.numel() + ffn.qw_out.numel();
  return block_runs_serial(block_macs(batch, tokens, weights, proj.qweight.size(-1)),
                           min_parallel_block_macs(gemm8::int8_kernel(active_cpu_isa())));
}

at::Tensor int8_block(const at::Tensor& x, double norm1_eps, const Int8LinearArgs& qkv, int64_t num_heads,
                      BlockAttention attention, const Int8LinearArgs& proj, std::optional<double> ffn_norm_eps,
                      const Int8FfnArgs& ffn) {
  std::optional<SerialOps> serial;
  RECORD_FUNCTION("vitfast::int8_block", std::vector<c10::IValue>({x}));
  // A block this small runs on the calling thread (op_threads.h, min_parallel_block_macs in int8_common.h).
  if (x.dim() == 3) serial.emplace(int8_block_runs_serial(x.size(0), x.size(1), qkv, proj, ffn));
  const auto norm = [](const at::Tensor& t, double eps) {
    return recorded("vitfast::layer_norm", t, [&] { return layer_norm_op(t, eps); });
  };
  const at::Tensor x1 = int8_attention_heads(norm(x, norm1_eps), qkv, num_heads, attention, proj, x);
  return int8_ffn(ffn_norm_eps.has_value() ? norm(x1, *ffn_norm_eps) : x1, ffn, x1);
}

}  // namespace ops
}  // namespace vitfast

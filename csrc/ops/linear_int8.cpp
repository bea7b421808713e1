// torch binding of the int8 dense layer: `torch.ops.vitfast.linear_int8` on CPU.
//
//   linear_int8(Tensor x, Tensor qweight, Tensor w_scale, Tensor? bias=None, Tensor? residual=None,
//               Tensor? smooth=None, float act_scale=0.0) -> Tensor          (schema: vitfast/ops/linear_int8.py)
//   y = fp32(Σ q_x · q_w) · s_x · s_w + bias + residual,   (q_x, s_x) = quantize(x · smooth)   (= reference.linear_int8)
//
// - Checks: the same as vitfast.reference.linear_int8.check_linear_int8_args, same wording (ValueError).
// - The weight is packed once per version for the kernel of the active CPU path (gemm_int8.h: VNNI, AVX2, NEON dot
//   product or scalar) and kept in the weight cache; scales and bias must be finite, weights in [−127, 127].
// - Threads: rows split into balanced shares (gemm::RowShares); each thread quantizes its own rows a tile at a time
//   (tiles of <= 198 rows, one ViT image: the quantized tile and the output rows stay in L2 while every panel of the
//   weight streams once) and runs the GEMM on them.
// - fp16/bf16 x: converted to fp32, computed as fp32 would be, rounded once at the end.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "ops/int8_common.h"
#include "ops/op_utils.h"
#include "ops/output_pool.h"
#include "ops/int8_block.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Mirror of vitfast.reference.linear_int8.check_linear_int8_args (same order, same messages).  Returns N.
int64_t check_args(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& w_scale, const at::Tensor& bias,
                   const at::Tensor& residual, const at::Tensor& smooth, double act_scale) {
  check_required({{"x", &x}});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension [..., K], got a 0-d tensor");
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  const int64_t k = x.size(-1);
  const int64_t n = check_int8_weight("qweight", "w_scale", qweight, w_scale, k, "K = x.shape[-1]", x);
  check_same_dtype_device_as_x(x, {{"bias", &bias}, {"residual", &residual}});
  check_bias_shape("bias", bias, n);
  check_residual_shape(residual, x, n);
  check_smooth("smooth", smooth, k, x);
  check_act_scale("act_scale", act_scale);
  check_dense({{"x", &x}, {"qweight", &qweight}, {"w_scale", &w_scale}, {"bias", &bias}, {"residual", &residual},
               {"smooth", &smooth}});
  return n;
}

at::Tensor linear_int8_cpu(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& w_scale,
                           const OptTensor& bias_opt, const OptTensor& residual_opt, const OptTensor& smooth_opt,
                           double act_scale) {
  const at::Tensor bias = bias_opt.value_or(at::Tensor()), residual = residual_opt.value_or(at::Tensor());
  const at::Tensor smooth = smooth_opt.value_or(at::Tensor());
  const int64_t n = check_args(x, qweight, w_scale, bias, residual, smooth, act_scale);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t k = x.size(-1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = n;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < out_shape.size(); ++i) rows *= out_shape[i];
  if (rows == 0 || n == 0) return at::empty(out_shape, x.options());
  const CpuIsa isa = active_cpu_isa();
  const gemm8::Int8Kernel kernel = gemm8::int8_kernel(isa);
  const auto w = packed_int8_weight("linear_int8", qweight, w_scale, bias, 0, n, at::Tensor(), kernel, "qweight",
                                    "w_scale", "bias");
  const at::Tensor xf = contiguous_float(x), rf = contiguous_float(residual), sf = smooth.contiguous();
  at::Tensor out = empty_output(out_shape, at::kFloat);
  const float* xp = xf.data_ptr<float>();
  const float* rp = rf.defined() ? rf.data_ptr<float>() : nullptr;
  const float* sp = sf.defined() ? sf.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();

  for_each_token_tile(rows, isa, k * n, kernel, [&](int64_t r0, int64_t m) {
    const QuantizedRows q = thread_quantized_rows(m, k, 0);
    quantize_activations(xp + r0 * k, k, m, k, sp, act_scale, q, isa);
    gemm::Epilogue ep;
    ep.bias = true;
    ep.addend = rp ? rp + r0 * n : nullptr;
    ep.ld_addend = n;
    gemm8::gemm_int8(m, q.qa, q.lda, q.sa, q.rowsum, *w, op + r0 * n, n, ep, kernel);
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace
at::Tensor linear_int8_op(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& w_scale,
                          const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                          const std::optional<at::Tensor>& smooth, double act_scale) {
  return linear_int8_cpu(x, qweight, w_scale, bias, residual, smooth, act_scale);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("linear_int8", &vitfast::ops::linear_int8_cpu); }

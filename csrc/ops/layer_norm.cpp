// torch binding of the row LayerNorm: `torch.ops.vitfast.layer_norm` on CPU.
//
//   layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor   (schema: vitfast/ops/layer_norm.py)
//   over the last dimension, = F.layer_norm(x, (C,), weight, bias, eps)
//
// - Checks: the same as vitfast.reference.layer_norm.check_layer_norm_args, same wording (ValueError).
// - fp16/bf16: converted to fp32, normalised in fp32, rounded once at the end (as torch's CPU kernel does).
// - Threads: blocks of rows with at::parallel_for (a grain of ≥ 16 K floats, so a DeiT-Ti batch-1 norm of
//   197 × 192 floats stays on one thread: splitting 8 µs of work costs more than it saves).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/layer_norm.h"
#include "ops/cpu_ops.h"
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/vit_forward.h"
#include "ops/output_pool.h"
#include "ops/int8_block.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Mirror of vitfast.reference.layer_norm.check_layer_norm_args (same order, same messages).
void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  check_required({{"x", &x}});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension [..., C], got a 0-d tensor");
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  check_same_dtype_device_as_x(x, {{"weight", &weight}, {"bias", &bias}});
  check_bias_shape("weight", weight, x.size(-1));
  check_bias_shape("bias", bias, x.size(-1));
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, "eps: expected a finite number >= 0, got ", eps);
  check_dense({{"x", &x}, {"weight", &weight}, {"bias", &bias}});
}

at::Tensor as_float_contiguous(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.to(at::kFloat).contiguous();
}

at::Tensor layer_norm_cpu(const at::Tensor& x, const OptTensor& weight_opt, const OptTensor& bias_opt, double eps) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  check_args(x, weight, bias, eps);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t c = x.size(-1);
  const int64_t rows = c > 0 ? x.numel() / c : 0;
  if (rows == 0 || c == 0) return at::empty(x.sizes(), x.options());
  const at::Tensor xf = as_float_contiguous(x), wf = as_float_contiguous(weight), bf = as_float_contiguous(bias);
  at::Tensor out = empty_output(x.sizes(), at::kFloat);
  const float* xp = xf.data_ptr<float>();
  const float* gp = wf.defined() ? wf.data_ptr<float>() : nullptr;
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  layer_norm_run(xp, op, rows, c, gp, bp, float(eps), active_cpu_isa());
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor layer_norm_affine_op(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps) {
  return layer_norm_cpu(x, weight, bias, eps);
}

void layer_norm_run(const float* xp, float* op, int64_t rows, int64_t c, const float* gp, const float* bp,
                    float eps, CpuIsa isa) {
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 14) / c);
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    layer_norm_rows(xp + begin * c, op + begin * c, end - begin, c, gp, bp, eps, isa);
  });
}

void layer_norm_run_bf16(const float* xp, uint16_t* o16, int64_t ld16, int64_t rows, int64_t c, const float* gp,
                         const float* bp, float eps, CpuIsa isa, gemm16::Bf16Kernel kernel, const uint16_t* x16,
                         float* widened) {
  // 16 rows (24-48 KiB at ViT widths: L1/L2) per step; a row's values do not depend on its neighbours (the row groups
  // of layer_norm_rows), so the bits are layer_norm_run's followed by convert_rows.  A bf16 input is widened in the
  // same steps, on every thread: widened whole on one thread beforehand, it was a separate pass over the block's
  // input and output ~2% of a bf16 DeiT-S forward at batch 8 on two threads, the other thread waiting.
  constexpr int64_t kRows = 16;
  if (x16 != nullptr) xp = widened;
  const int64_t blocks = (rows + kRows - 1) / kRows;
  parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> buf;
    if (buf.size() < size_t(kRows * c)) buf.resize(size_t(kRows * c));
    for (int64_t b = begin; b < end; ++b) {
      const int64_t r0 = b * kRows, n = std::min(kRows, rows - r0);
      layer_norm_rows_bf16(xp + r0 * c, x16 != nullptr ? x16 + r0 * c : nullptr,
                           x16 != nullptr ? widened + r0 * c : nullptr, o16 + r0 * ld16, ld16, n, c, gp, bp, eps, isa,
                           kernel, buf.data());
    }
  });
}

at::Tensor layer_norm_op(const at::Tensor& x, double eps) {
  return layer_norm_cpu(x, std::nullopt, std::nullopt, eps);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("layer_norm", &vitfast::ops::layer_norm_cpu); }

// torch binding of the drop-in depthwise-convolution heads: `torch.ops.vitfast.dwconv_attention` on CPU.
//
//   dwconv_attention(Tensor x, Tensor w_v, Tensor? b_v, Tensor kernel, Tensor w_o, Tensor? b_o, int grid_h,
//                    int grid_w, Tensor? residual=None) -> Tensor                      (schema: vitfast/ops/dwconv_attention.py)
//
// - Checks: the same as vitfast/reference/dwconv_attention.py, same wording (ValueError).  Non-contiguous inputs are
//   copied to contiguous.  Weights must be finite (checked once per weight version, with the packing).
// - Weights packed once per version in the process-wide cache (ops/weight_cache.h).
// - bf16 on a CPU with a bf16 extension (ops/cpu_ops.h bf16_gemm_kernel): linear (bf16 GEMM) → dwconv_heads → linear
//   (bf16 GEMM, b_o and the residual in fp32): V and U rounded to bf16 as the GEMMs' operands, the convolution in
//   fp32.  fp16, and bf16 without the extension: converted to fp32, computed in fp32, rounded once at the end.
// - Threads (op_threads.h: torch's, or one inside a SerialOps scope): tasks = (image, band of grid rows); an image
//   is split into as many row ranges as needed to give every thread work (batch 1 on 2 threads: two halves, each
//   recomputing k − 1 halo rows of V, the same values).  The prefix rows of an image are computed by the task that
//   owns its first grid row.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "kernels/cpu_features.h"
#include "kernels/dwconv_attention.h"
#include "ops/cpu_ops.h"
#include "ops/op_utils.h"
#include "ops/vit_forward.h"
#include "ops/weight_cache.h"
#include "ops/op_threads.h"
#include "ops/output_pool.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

struct Dims {
  int64_t prefix, width, ksize, c_out;
};

// Mirror of vitfast.reference.dwconv_attention.check_dwconv_attention_args (same order, same messages).
Dims check_args(const at::Tensor& x, const at::Tensor& w_v, const at::Tensor& b_v, const at::Tensor& kernel,
                const at::Tensor& w_o, const at::Tensor& b_o, int64_t grid_h, int64_t grid_w,
                const at::Tensor& residual) {
  check_required({{"x", &x}, {"w_v", &w_v}, {"kernel", &kernel}, {"w_o", &w_o}});
  TORCH_CHECK_VALUE(x.dim() == 3, "x: expected 3-D [B, N, C], got shape ", fmt_shape(x.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  const int64_t prefix = check_token_grid("x", x, grid_h, grid_w), channels = x.size(2);
  TORCH_CHECK_VALUE(w_v.dim() == 2 && w_v.size(1) == channels, "w_v: expected 2-D [D, ", channels,
                    "] (C = x.shape[-1]), got shape ", fmt_shape(w_v.sizes()));
  const int64_t width = w_v.size(0);
  TORCH_CHECK_VALUE(kernel.dim() == 3 && kernel.size(0) == width && kernel.size(1) == kernel.size(2) &&
                        kernel.size(1) % 2 == 1,
                    "kernel: expected [", width, ", k, k] with k odd (one k×k filter per value channel), got shape ",
                    fmt_shape(kernel.sizes()));
  TORCH_CHECK_VALUE(w_o.dim() == 2 && w_o.size(1) == width, "w_o: expected 2-D [C_out, ", width,
                    "] (D = w_v.shape[0]), got shape ", fmt_shape(w_o.sizes()));
  const int64_t c_out = w_o.size(0);
  check_same_dtype_device_as_x(x, {{"w_v", &w_v}, {"b_v", &b_v}, {"kernel", &kernel}, {"w_o", &w_o},
                                   {"b_o", &b_o}, {"residual", &residual}});
  check_bias_shape("b_v", b_v, width);
  check_bias_shape("b_o", b_o, c_out);
  check_residual_shape(residual, x, c_out);
  check_dense({{"x", &x}, {"w_v", &w_v}, {"b_v", &b_v}, {"kernel", &kernel}, {"w_o", &w_o}, {"b_o", &b_o},
               {"residual", &residual}});
  return {prefix, width, kernel.size(1), c_out};
}

at::Tensor as_float_contiguous(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.to(at::kFloat).contiguous();
}

std::shared_ptr<const DwconvAttentionWeights> packed_weights(const at::Tensor& w_v, const at::Tensor& b_v,
                                                             const at::Tensor& kernel, const at::Tensor& w_o,
                                                             const at::Tensor& b_o, const Dims& d) {
  return cached_pack_as<DwconvAttentionWeights>(
      "dwconv_attention", {w_v, b_v, kernel, w_o, b_o}, [&]() -> PackedEntry {
        check_finite("w_v", w_v);
        check_finite("b_v", b_v);
        check_finite("kernel", kernel);
        check_finite("w_o", w_o);
        check_finite("b_o", b_o);
        const at::Tensor wv = as_float_contiguous(w_v), bv = as_float_contiguous(b_v);
        const at::Tensor k = as_float_contiguous(kernel);
        const at::Tensor wo = as_float_contiguous(w_o), bo = as_float_contiguous(b_o);
        auto packed = std::make_shared<DwconvAttentionWeights>(DwconvAttentionWeights::pack(
            wv.data_ptr<float>(), bv.defined() ? bv.data_ptr<float>() : nullptr, k.data_ptr<float>(),
            wo.data_ptr<float>(), bo.defined() ? bo.data_ptr<float>() : nullptr, wv.size(1), d.width, d.ksize,
            d.c_out));
        PackedEntry e;
        e.bytes = packed->bytes();
        e.packed = std::move(packed);
        return e;
      });
}

at::Tensor dwconv_attention_cpu(const at::Tensor& x, const at::Tensor& w_v, const OptTensor& b_v_opt,
                                const at::Tensor& kernel, const at::Tensor& w_o, const OptTensor& b_o_opt,
                                int64_t grid_h, int64_t grid_w, const OptTensor& residual_opt) {
  const at::Tensor b_v = b_v_opt.value_or(at::Tensor());
  const at::Tensor b_o = b_o_opt.value_or(at::Tensor());
  const at::Tensor residual = residual_opt.value_or(at::Tensor());
  const Dims d = check_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t batch = x.size(0), tokens = x.size(1), c_in = x.size(2), hw = grid_h * grid_w;
  if (batch == 0 || d.c_out == 0) return at::empty({batch, tokens, d.c_out}, x.options());
  if (d.width == 0) {
    // No replaced channel: the heads contribute nothing, out = b_o + residual.
    at::Tensor out = at::zeros({batch, tokens, d.c_out}, x.options());
    if (b_o.defined()) out.add_(b_o);
    if (residual.defined()) out.add_(residual);
    return out;
  }

  if (bf16_gemm_kernel(x.scalar_type()) != gemm16::Bf16Kernel::kScalar) {
    // bf16 on a CPU with a bf16 extension: the two GEMMs on the bf16 kernels (linear's bf16 path), the convolution
    // between them in fp32 on the values rounded to bf16 (dwconv_heads); V and U are bf16 GEMM operands either way.
    const at::Tensor v = linear_op(x, w_v, b_v_opt);
    const at::Tensor u = dwconv_heads_op(v, kernel, grid_h, grid_w);
    return linear_op(u, w_o, b_o_opt, residual_opt);
  }
  const std::shared_ptr<const DwconvAttentionWeights> w = packed_weights(w_v, b_v, kernel, w_o, b_o, d);
  const at::Tensor xf = as_float_contiguous(x);
  const at::Tensor rf = as_float_contiguous(residual);
  at::Tensor out = empty_output({batch, tokens, d.c_out}, at::kFloat);
  const float* xp = xf.data_ptr<float>();
  const float* rp = rf.defined() ? rf.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();
  const DwconvAttentionTiling tiling;
  const int64_t ws_floats = dwconv_attention_workspace_floats(*w, grid_w, tiling);

  dwconv_grid_tasks(batch, grid_h, ws_floats, [&](int64_t b, int64_t row0, int64_t row1, float* ws) {
    const float* xi = xp + b * tokens * c_in;
    const float* ri = rp != nullptr ? rp + b * tokens * d.c_out : nullptr;
    float* oi = op + b * tokens * d.c_out;
    const float* x_grid = xi + d.prefix * c_in;
    if (row0 == 0) dwconv_attention_prefix(*w, hw, d.prefix, x_grid, ri, oi, ws, isa);
    dwconv_attention_grid_rows(*w, grid_h, grid_w, row0, row1, x_grid, ri != nullptr ? ri + d.prefix * d.c_out : nullptr,
                               oi + d.prefix * d.c_out, ws, isa, tiling);
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

void dwconv_grid_tasks(int64_t batch, int64_t grid_h, int64_t ws_floats,
                       const std::function<void(int64_t b, int64_t row0, int64_t row1, float* workspace)>& task) {
  const int64_t threads = op_threads();
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(grid_h, (threads + batch - 1) / batch));
  parallel_for(0, batch * splits, 1, [&](int64_t begin, int64_t end) {
    thread_local gemm::AlignedFloats buffer;  // the calling thread's scratch, kept between calls
    if (buffer.size() < ws_floats) buffer = gemm::AlignedFloats(ws_floats);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t % splits;
      task(t / splits, grid_h * s / splits, grid_h * (s + 1) / splits, buffer.data());
    }
  });
}

at::Tensor dwconv_attention_op(const at::Tensor& x, const at::Tensor& w_v, const OptTensor& b_v, const at::Tensor& kernel,
                               const at::Tensor& w_o, const OptTensor& b_o, int64_t grid_h, int64_t grid_w,
                               const OptTensor& residual) {
  return dwconv_attention_cpu(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual);
}
}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("dwconv_attention", &vitfast::ops::dwconv_attention_cpu); }

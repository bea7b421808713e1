// torch binding of the dense linear layer: `torch.ops.vitfast.linear` on CPU.
//
//   linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor   (schema: vitfast/ops/linear.py)
//   out = x · weightᵀ + bias + residual
//
// - Checks: the same as vitfast.reference.linear.check_linear_args, same wording (ValueError).
// - The weight (with its bias) is packed once per version and kept in the process-wide cache
//   (ops/weight_cache.h); weight and bias must be finite (checked at pack time).
// - No copy of x or residual when their rows are uniformly strided with a unit inner stride (contiguous
//   tensors, and 2-D views such as the cls token x[:, 0] a classifier head reads): the GEMM takes row strides.
// - bf16 on a CPU with a bf16 extension (AVX512_BF16, ARM BF16; ops/cpu_ops.h bf16_gemm_kernel): the weight is packed
//   as bf16 (cache entry "linear_bf16"), x read as bf16 (in place when its rows allow), the GEMM accumulates in fp32
//   (gemm_bf16.h), bias and residual are added in fp32, rounded once to bf16.  Twice the fp32 GEMM's speed.
// - fp16, and bf16 without the extension: converted to fp32, computed in fp32 (fp32 accumulation), rounded once at
//   the end.
// - Threads (at::parallel_for, so torch.set_num_threads is respected): rows split into at most
//   get_num_threads() balanced chunks of whole 6-row register blocks; with fewer register blocks than threads
//   (a head on a handful of cls tokens) the output panels are split instead, so both cores still stream half
//   of the weight each.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "kernels/cpu_features.h"
#include "kernels/linear.h"
#include "ops/cpu_ops.h"
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/weight_cache.h"
#include "ops/output_pool.h"
#include "ops/vit_forward.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Mirror of vitfast.reference.linear.check_linear_args (same order, same messages).  Returns N (out_features).
int64_t check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& residual) {
  check_required({{"x", &x}, {"weight", &weight}});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension [..., K], got a 0-d tensor");
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight: expected 2-D [N, K], got shape ", fmt_shape(weight.sizes()));
  const int64_t k = x.size(-1), n = weight.size(0);
  TORCH_CHECK_VALUE(weight.size(1) == k, "weight: expected shape [N, ", k, "] (K = x.shape[-1] = ", k, "), got ",
                    fmt_shape(weight.sizes()));
  check_same_dtype_device_as_x(x, {{"weight", &weight}, {"bias", &bias}, {"residual", &residual}});
  check_bias_shape("bias", bias, n);
  check_residual_shape(residual, x, n);
  check_dense({{"x", &x}, {"weight", &weight}, {"bias", &bias}, {"residual", &residual}});
  return n;
}

// A [rows × cols] fp32 view of t's rows and its row stride, without a copy when t already is one (contiguous,
// or 2-D with unit column stride, e.g. x[:, 0]); otherwise a contiguous fp32 copy (kept alive in `holder`).
const float* rows_view(const at::Tensor& t, int64_t cols, at::Tensor& holder, int64_t& ld) {
  if (t.scalar_type() == at::kFloat && t.is_contiguous()) {
    holder = t;
    ld = cols;
  } else if (t.scalar_type() == at::kFloat && t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= cols) {
    holder = t;
    ld = t.stride(0);
  } else {
    holder = t.to(at::kFloat).contiguous();
    ld = cols;
  }
  return holder.data_ptr<float>();
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias_opt,
                      const OptTensor& residual_opt) {
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const at::Tensor residual = residual_opt.value_or(at::Tensor());
  const int64_t n = check_args(x, weight, bias, residual);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t k = x.size(-1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = n;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < out_shape.size(); ++i) rows *= out_shape[i];
  if (rows == 0 || n == 0) return at::empty(out_shape, x.options());

  const CpuIsa isa = active_cpu_isa();
  const gemm16::Bf16Kernel kernel = bf16_gemm_kernel(x.scalar_type());
  if (kernel != gemm16::Bf16Kernel::kScalar) {
    const std::shared_ptr<const gemm16::PackedBf16B> w = packed_linear_weight_bf16(weight, bias);
    at::Tensor xh, rh;
    int64_t ldx = k, ldr = n;
    const uint16_t* xp = bf16_rows_view(x, k, xh, ldx, kernel);
    const float* rp = residual.defined() ? rows_view(residual, n, rh, ldr) : nullptr;
    at::Tensor out = empty_output(out_shape, at::kFloat);
    linear_run_bf16(*w, rows, xp, ldx, rp, ldr, out.data_ptr<float>(), isa, kernel);
    return out.to(x.scalar_type());
  }
  const std::shared_ptr<const gemm::PackedB> w = packed_linear_weight(weight, bias);
  at::Tensor xh, rh;
  int64_t ldx = k, ldr = n;
  const float* xp = rows_view(x, k, xh, ldx);
  const float* rp = residual.defined() ? rows_view(residual, n, rh, ldr) : nullptr;
  at::Tensor out = empty_output(out_shape, at::kFloat);
  float* op = out.data_ptr<float>();
  linear_run(*w, rows, xp, ldx, rp, ldr, op, isa);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias, const OptTensor& residual) {
  return linear_cpu(x, weight, bias, residual);
}

std::shared_ptr<const gemm::PackedB> packed_linear_weight(const at::Tensor& weight, const at::Tensor& bias,
                                                          const char* weight_name, const char* bias_name) {
  return cached_pack_as<gemm::PackedB>("linear", {weight, bias}, [&]() -> PackedEntry {
    // Once per weight version: refuse NaN/Inf (they would silently poison every output), then pack.
    check_finite(weight_name, weight);
    check_finite(bias_name, bias);
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
    auto packed = std::make_shared<gemm::PackedB>(gemm::PackedB::pack_linear(
        w.data_ptr<float>(), w.size(0), w.size(1), w.size(1), b.defined() ? b.data_ptr<float>() : nullptr));
    PackedEntry e;
    e.bytes = packed->bytes();
    e.packed = std::move(packed);
    return e;
  });
}

gemm16::Bf16Kernel bf16_gemm_kernel(at::ScalarType t) {
  return t == at::kBFloat16 ? gemm16::bf16_kernel(active_cpu_isa()) : gemm16::Bf16Kernel::kScalar;
}

const uint16_t* bf16_rows_view(const at::Tensor& t, int64_t cols, at::Tensor& holder, int64_t& ld,
                               gemm16::Bf16Kernel kernel) {
  if (t.scalar_type() == at::kBFloat16 && cols % 2 == 0) {
    if (t.is_contiguous()) {
      holder = t;
      ld = cols;
      return static_cast<const uint16_t*>(t.data_ptr());
    }
    if (t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= cols && t.stride(0) % 2 == 0) {
      holder = t;
      ld = t.stride(0);
      return static_cast<const uint16_t*>(t.data_ptr());
    }
  }
  at::Tensor fh;
  int64_t ldf = cols;
  const float* f = rows_view(t, cols, fh, ldf);
  const int64_t rows = cols > 0 ? t.numel() / cols : 0;
  ld = gemm16::padded_k(cols);
  holder = at::empty({rows, ld}, t.options().dtype(at::kBFloat16));
  uint16_t* dst = static_cast<uint16_t*>(holder.data_ptr());
  gemm16::convert_rows(f, ldf, rows, cols, dst, ld, kernel);
  return dst;
}

std::shared_ptr<const gemm16::PackedBf16B> packed_linear_weight_bf16(const at::Tensor& weight, const at::Tensor& bias,
                                                                     const char* weight_name, const char* bias_name) {
  return cached_pack_as<gemm16::PackedBf16B>("linear_bf16", {weight, bias}, [&]() -> PackedEntry {
    check_finite(weight_name, weight);
    check_finite(bias_name, bias);
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
    auto packed = std::make_shared<gemm16::PackedBf16B>(gemm16::PackedBf16B::pack_linear(
        w.data_ptr<float>(), w.size(0), w.size(1), w.size(1), b.defined() ? b.data_ptr<float>() : nullptr));
    PackedEntry e;
    e.bytes = packed->bytes();
    e.packed = std::move(packed);
    return e;
  });
}

namespace {
// linear's thread split: balanced shares of the token rows (gemm::RowShares), or, with fewer register blocks of rows
// than threads (a head on B cls tokens), the output panels, i.e. the weight, so both cores still stream half of it.
// rows_fn(r0, r1) / panels_fn(p0, p1) run on torch's intra-op threads.
template <class RowsFn, class PanelsFn>
void split_linear(int64_t rows, int64_t panels, CpuIsa isa, const RowsFn& rows_fn, const PanelsFn& panels_fn) {
  const int64_t threads = op_threads();
  const int64_t blocks = (rows + gemm::kMr - 1) / gemm::kMr;
  if (blocks >= threads || panels < 2) {
    const gemm::RowShares shares(rows, threads, isa);
    at::parallel_for(0, shares.chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) rows_fn(shares.begin(c), shares.end(c));
    });
  } else {
    const int64_t chunks = std::min(threads, panels);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) panels_fn(panels * c / chunks, panels * (c + 1) / chunks);
    });
  }
}
}  // namespace

void linear_run_bf16(const gemm16::PackedBf16B& w, int64_t rows, const uint16_t* xp, int64_t ldx, const float* rp,
                     int64_t ldr, float* op, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* o16, int64_t ld16) {
  const int64_t n = w.n();
  const LinearTiling tiling;
  split_linear(
      rows, w.panels(), isa,
      [&](int64_t r0, int64_t r1) {
        linear_rows_bf16(w, r1 - r0, xp + r0 * ldx, ldx, rp ? rp + r0 * ldr : nullptr, ldr,
                         op ? op + r0 * n : nullptr, n, kernel, 0, -1, tiling, o16 ? o16 + r0 * ld16 : nullptr, ld16);
      },
      [&](int64_t p0, int64_t p1) {
        linear_rows_bf16(w, rows, xp, ldx, rp, ldr, op, n, kernel, p0, p1, tiling, o16, ld16);
      });
}

void linear_run(const gemm::PackedB& w, int64_t rows, const float* xp, int64_t ldx, const float* rp,
                int64_t ldr, float* op, CpuIsa isa) {
  const int64_t n = w.n();
  split_linear(
      rows, w.panels(), isa,
      [&](int64_t r0, int64_t r1) {
        linear_rows(w, r1 - r0, xp + r0 * ldx, ldx, rp ? rp + r0 * ldr : nullptr, ldr, op + r0 * n, n, isa);
      },
      [&](int64_t p0, int64_t p1) { linear_rows(w, rows, xp, ldx, rp, ldr, op, n, isa, p0, p1); });
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("linear", &vitfast::ops::linear_cpu); }

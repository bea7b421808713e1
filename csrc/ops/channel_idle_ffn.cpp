// torch binding of the channel-idle FFN: `torch.ops.vitfast.channel_idle_ffn` on CPU.
//
//   channel_idle_ffn(Tensor x, Tensor w_in, Tensor? b_in, Tensor w_out, Tensor? b_out=None,
//                    Tensor? residual=None) -> Tensor              (schema: vitfast/ops/channel_idle_ffn.py)
//
// - Checks: the same as vitfast/reference/channel_idle_ffn.py, same wording (ValueError for bad values, via
//   TORCH_CHECK_VALUE).  Non-contiguous inputs are accepted (copied to contiguous).  Weights and biases
//   must be finite (checked once per weight version, together with the packing).
// - Weights are packed once per version and kept in the process-wide cache (ops/weight_cache.h).
// - bf16 on a CPU with a bf16 extension (ops/cpu_ops.h bf16_gemm_kernel): the GEMMs on bf16 operands with fp32
//   accumulation (with both paths two: GELU to bf16 h_act, then one over [h_act | x]; kernels/channel_idle_ffn.h
//   ChannelIdleFfnBf16Weights, cache entry "channel_idle_ffn_bf16"), GELU, biases and residual in fp32, rounded once
//   to bf16.
// - fp32 runs the C++ kernel.  fp16 (and bf16 without a bf16 extension) on CPU: the inputs are converted to fp32,
//   the op runs in fp32 (fp32 accumulation, the GELU on fp32) and the result is rounded to the input dtype once at
//   the end; the packed weights are the fp32 conversions, so the conversion of the weights is cached too.
// - Threads: rows (tokens) are split into at most torch.get_num_threads() balanced chunks, aligned to the
//   6-row register block, and run with at::parallel_for, so torch.set_num_threads is respected and batch 1
//   (197 tokens) uses both cores.  Each thread has its own scratch (the h_act token tile).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "kernels/channel_idle_ffn.h"
#include "kernels/cpu_features.h"
#include "ops/cpu_ops.h"
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/vit_forward.h"
#include "ops/weight_cache.h"
#include "ops/output_pool.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

at::Tensor as_float_contiguous(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.to(at::kFloat).contiguous();
}

// Per-thread scratch for the h_act token tile, kept between calls (no allocation and page faults per call).
float* thread_workspace(int64_t floats) {
  thread_local gemm::AlignedFloats buffer;
  if (buffer.size() < floats) buffer = gemm::AlignedFloats(floats);
  return buffer.data();
}

at::Tensor channel_idle_ffn_cpu(const at::Tensor& x, const at::Tensor& w_in, const OptTensor& b_in_opt,
                                const at::Tensor& w_out, const OptTensor& b_out_opt, const OptTensor& residual_opt) {
  const at::Tensor b_in = b_in_opt.value_or(at::Tensor());
  const at::Tensor b_out = b_out_opt.value_or(at::Tensor());
  const at::Tensor residual = residual_opt.value_or(at::Tensor());
  const ChannelIdleFfnDims d = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = d.c_out;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < out_shape.size(); ++i) rows *= out_shape[i];
  const bool fp32 = x.scalar_type() == at::kFloat;
  if (rows == 0) return at::empty(out_shape, x.options());

  const gemm16::Bf16Kernel kernel = bf16_gemm_kernel(x.scalar_type());
  if (kernel != gemm16::Bf16Kernel::kScalar) {
    const auto w = packed_channel_idle_ffn_weights_bf16(w_in, b_in, w_out, b_out);
    at::Tensor xh;
    int64_t ldx = x.size(-1);
    const uint16_t* xp = bf16_rows_view(x.contiguous(), x.size(-1), xh, ldx, kernel);
    const at::Tensor rf = as_float_contiguous(residual);
    const float* rp = rf.defined() ? rf.data_ptr<float>() : nullptr;
    if (x.scalar_type() == at::kBFloat16 && d.c_out % 2 == 0) {
      // Only the bf16 result, rounded by the last GEMM's epilogue (convert_rows' bits, torch's rounding): no fp32
      // output and no conversion pass.
      at::Tensor out16 = empty_output(out_shape, at::kBFloat16);
      channel_idle_ffn_run_bf16(*w, rows, xp, ldx, rp, nullptr, active_cpu_isa(), kernel,
                                static_cast<uint16_t*>(out16.data_ptr()));
      return out16;
    }
    at::Tensor out = empty_output(out_shape, at::kFloat);
    channel_idle_ffn_run_bf16(*w, rows, xp, ldx, rp, out.data_ptr<float>(), active_cpu_isa(), kernel);
    return out.to(x.scalar_type());
  }
  const std::shared_ptr<const ChannelIdleFfnWeights> w = packed_channel_idle_ffn_weights(w_in, b_in, w_out, b_out);
  const at::Tensor xf = as_float_contiguous(x);
  const at::Tensor rf = as_float_contiguous(residual);
  at::Tensor out = empty_output(out_shape, at::kFloat);
  const float* xp = xf.data_ptr<float>();
  const float* rp = rf.defined() ? rf.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  channel_idle_ffn_run(*w, rows, xp, rp, op, active_cpu_isa());
  return fp32 ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor channel_idle_ffn_op(const at::Tensor& x, const at::Tensor& w_in, const OptTensor& b_in, const at::Tensor& w_out,
                               const OptTensor& b_out, const OptTensor& residual) {
  return channel_idle_ffn_cpu(x, w_in, b_in, w_out, b_out, residual);
}

// Mirror of vitfast.reference.channel_idle_ffn.check_channel_idle_ffn_args (same order, same messages).
ChannelIdleFfnDims check_channel_idle_ffn_args(const at::Tensor& x, const at::Tensor& w_in, const at::Tensor& b_in,
                                               const at::Tensor& w_out, const at::Tensor& b_out,
                                               const at::Tensor& residual) {
  check_required({{"x", &x}, {"w_in", &w_in}, {"w_out", &w_out}});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension [..., C_in], got a 0-d tensor");
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  TORCH_CHECK_VALUE(w_in.dim() == 2, "w_in: expected 2-D [A + L, C_in], got shape ", fmt_shape(w_in.sizes()));
  TORCH_CHECK_VALUE(w_out.dim() == 2, "w_out: expected 2-D [C_out, A], got shape ", fmt_shape(w_out.sizes()));
  const int64_t c_in = x.size(-1);
  TORCH_CHECK_VALUE(w_in.size(1) == c_in, "w_in: expected shape [A + L, ", c_in, "] (C_in = x.shape[-1] = ", c_in,
                    "), got ", fmt_shape(w_in.sizes()));
  const int64_t c_out = w_out.size(0), active = w_out.size(1);
  TORCH_CHECK_VALUE(active <= w_in.size(0), "w_out: expected at most w_in.shape[0] = ", w_in.size(0),
                    " active columns, got shape ", fmt_shape(w_out.sizes()));
  const int64_t linear = w_in.size(0) - active;
  TORCH_CHECK_VALUE(linear == 0 || linear == c_out, "w_in: expected ", active, " (no linear path) or ",
                    active + c_out, " (A + C_out) rows for w_out of shape ", fmt_shape(w_out.sizes()), ", got ",
                    w_in.size(0));
  check_same_dtype_device_as_x(
      x, {{"w_in", &w_in}, {"b_in", &b_in}, {"w_out", &w_out}, {"b_out", &b_out}, {"residual", &residual}});
  check_bias_shape("b_in", b_in, w_in.size(0));
  check_bias_shape("b_out", b_out, c_out);
  check_residual_shape(residual, x, c_out);
  check_dense({{"x", &x}, {"w_in", &w_in}, {"b_in", &b_in}, {"w_out", &w_out}, {"b_out", &b_out},
               {"residual", &residual}});
  return {active, linear, c_out};
}

namespace {
// Once per weight version and packed form: refuse NaN/Inf (they would silently poison every output), then pack
// (Weights = ChannelIdleFfnWeights or its bf16 form, both `pack(w_in, b_in, w_out, b_out, c_in, A, L, C_out)`).
template <class Weights>
std::shared_ptr<const Weights> cached_ffn_pack(const char* op, const at::Tensor& w_in, const at::Tensor& b_in,
                                               const at::Tensor& w_out, const at::Tensor& b_out) {
  const int64_t active = w_out.size(1), linear = w_in.size(0) - active, c_out = w_out.size(0);
  return cached_pack_as<Weights>(op, {w_in, b_in, w_out, b_out}, [&]() -> PackedEntry {
    check_finite("w_in", w_in);
    check_finite("b_in", b_in);
    check_finite("w_out", w_out);
    check_finite("b_out", b_out);
    const at::Tensor wi = as_float_contiguous(w_in), bi = as_float_contiguous(b_in);
    const at::Tensor wo = as_float_contiguous(w_out), bo = as_float_contiguous(b_out);
    auto packed = std::make_shared<Weights>(Weights::pack(
        wi.data_ptr<float>(), bi.defined() ? bi.data_ptr<float>() : nullptr, wo.data_ptr<float>(),
        bo.defined() ? bo.data_ptr<float>() : nullptr, wi.size(1), active, linear, c_out));
    PackedEntry e;
    e.bytes = packed->bytes();
    e.packed = std::move(packed);
    return e;
  });
}
}  // namespace

std::shared_ptr<const ChannelIdleFfnWeights> packed_channel_idle_ffn_weights(const at::Tensor& w_in,
                                                                             const at::Tensor& b_in,
                                                                             const at::Tensor& w_out,
                                                                             const at::Tensor& b_out) {
  return cached_ffn_pack<ChannelIdleFfnWeights>("channel_idle_ffn", w_in, b_in, w_out, b_out);
}

std::shared_ptr<const ChannelIdleFfnBf16Weights> packed_channel_idle_ffn_weights_bf16(const at::Tensor& w_in,
                                                                                     const at::Tensor& b_in,
                                                                                     const at::Tensor& w_out,
                                                                                     const at::Tensor& b_out) {
  return cached_ffn_pack<ChannelIdleFfnBf16Weights>("channel_idle_ffn_bf16", w_in, b_in, w_out, b_out);
}

void channel_idle_ffn_run_bf16(const ChannelIdleFfnBf16Weights& w, int64_t rows, const uint16_t* xp, int64_t ldx,
                               const float* rp, float* op, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* out16,
                               bool x_has_h_room) {
  const int64_t c_out = w.c_out();
  const ChannelIdleFfnTiling tiling;
  const int64_t ws_floats = channel_idle_ffn_workspace_floats(w, tiling);
  const gemm::RowShares shares(rows, op_threads(), isa);
  at::parallel_for(0, shares.chunks, 1, [&](int64_t begin, int64_t end) {
    float* ws = thread_workspace(ws_floats);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = shares.begin(c), r1 = shares.end(c);
      channel_idle_ffn_rows_bf16(w, r1 - r0, xp + r0 * ldx, ldx, rp ? rp + r0 * c_out : nullptr,
                                 op ? op + r0 * c_out : nullptr, ws, kernel, tiling,
                                 out16 ? out16 + r0 * c_out : nullptr, x_has_h_room);
    }
  });
}

void channel_idle_ffn_run(const ChannelIdleFfnWeights& w, int64_t rows, const float* xp, const float* rp,
                          float* op, CpuIsa isa) {
  const int64_t c_in = w.c_in(), c_out = w.c_out();
  const ChannelIdleFfnTiling tiling;
  const int64_t ws_floats = channel_idle_ffn_workspace_floats(w, tiling);

  // One balanced share of the token rows per thread (gemm::RowShares).
  const gemm::RowShares shares(rows, op_threads(), isa);
  at::parallel_for(0, shares.chunks, 1, [&](int64_t begin, int64_t end) {
    float* ws = thread_workspace(ws_floats);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = shares.begin(c), r1 = shares.end(c);
      channel_idle_ffn_rows(w, r1 - r0, xp + r0 * c_in, rp ? rp + r0 * c_out : nullptr, op + r0 * c_out, ws,
                            isa, tiling);
    }
  });
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("channel_idle_ffn", &vitfast::ops::channel_idle_ffn_cpu); }

// torch binding of the int8 channel-idle FFN: `torch.ops.vitfast.channel_idle_ffn_int8` on CPU.
//
//   channel_idle_ffn_int8(Tensor x, Tensor qw_in, Tensor s_in, Tensor? b_in, Tensor qw_out, Tensor s_out,
//                         Tensor? b_out=None, Tensor? residual=None, Tensor? smooth_in=None, Tensor? smooth_out=None,
//                         float act_scale_in=0.0, float act_scale_out=0.0) -> Tensor
//                                                            (schema: vitfast/ops/channel_idle_ffn_int8.py)
// = reference.channel_idle_ffn_int8.  The fp32 op's structure (kernels/channel_idle_ffn.h) on the int8 core, per
// token tile of <= 198 rows and per thread:
//   q1  = quantize(x · smooth_in)                                   (per row, or the static scale)
//   out = lin(q1) + (b_in[A:] + b_out) + residual                   (L = C_out: the linear path, written first)
//   h   = GELU(act(q1) + b_in[:A])                                  (fp32 scratch, tile × A)
//   q2  = quantize(h · smooth_out)
//   out = fma(q2 · W_out ·  s2, s_out, out)                         (accumulated; L = 0: + b_out + residual instead)
// so the tile's quantized rows, h and out stay in L2 while the weights stream once per tile.
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

struct Dims {
  int64_t active, linear, c_out;
};

// Mirror of vitfast.reference.channel_idle_ffn_int8.check_channel_idle_ffn_int8_args (same order, same messages).
Dims check_args(const at::Tensor& x, const at::Tensor& qw_in, const at::Tensor& s_in, const at::Tensor& b_in,
                const at::Tensor& qw_out, const at::Tensor& s_out, const at::Tensor& b_out, const at::Tensor& residual,
                const at::Tensor& smooth_in, const at::Tensor& smooth_out, double act_scale_in,
                double act_scale_out) {
  check_required({{"x", &x}});
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension [..., C_in], got a 0-d tensor");
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  const int64_t c_in = x.size(-1);
  const int64_t rows = check_int8_weight("qw_in", "s_in", qw_in, s_in, c_in, "C_in = x.shape[-1]", x);
  check_required({{"qw_out", &qw_out}});
  const int64_t active = qw_out.dim() == 2 ? qw_out.size(1) : -1;
  const int64_t c_out = check_int8_weight("qw_out", "s_out", qw_out, s_out, active, "A", x);
  TORCH_CHECK_VALUE(active <= rows, "qw_out: expected at most qw_in.shape[0] = ", rows, " active columns, got shape ",
                    fmt_shape(qw_out.sizes()));
  const int64_t linear = rows - active;
  TORCH_CHECK_VALUE(linear == 0 || linear == c_out, "qw_in: expected ", active, " (no linear path) or ",
                    active + c_out, " (A + C_out) rows for qw_out of shape ", fmt_shape(qw_out.sizes()), ", got ",
                    rows);
  check_same_dtype_device_as_x(x, {{"b_in", &b_in}, {"b_out", &b_out}, {"residual", &residual}});
  check_bias_shape("b_in", b_in, rows);
  check_bias_shape("b_out", b_out, c_out);
  check_residual_shape(residual, x, c_out);
  check_smooth("smooth_in", smooth_in, c_in, x);
  check_smooth("smooth_out", smooth_out, active, x);
  check_act_scale("act_scale_in", act_scale_in);
  check_act_scale("act_scale_out", act_scale_out);
  check_dense({{"x", &x}, {"qw_in", &qw_in}, {"s_in", &s_in}, {"b_in", &b_in}, {"qw_out", &qw_out},
               {"s_out", &s_out}, {"b_out", &b_out}, {"residual", &residual}, {"smooth_in", &smooth_in},
               {"smooth_out", &smooth_out}});
  return {active, linear, c_out};
}

at::Tensor channel_idle_ffn_int8_cpu(const at::Tensor& x, const at::Tensor& qw_in, const at::Tensor& s_in,
                                     const OptTensor& b_in_opt, const at::Tensor& qw_out, const at::Tensor& s_out,
                                     const OptTensor& b_out_opt, const OptTensor& residual_opt,
                                     const OptTensor& smooth_in_opt, const OptTensor& smooth_out_opt,
                                     double act_scale_in, double act_scale_out) {
  const at::Tensor b_in = b_in_opt.value_or(at::Tensor()), b_out = b_out_opt.value_or(at::Tensor());
  const at::Tensor residual = residual_opt.value_or(at::Tensor());
  const at::Tensor smooth_in = smooth_in_opt.value_or(at::Tensor()), smooth_out = smooth_out_opt.value_or(at::Tensor());
  const Dims d = check_args(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in, smooth_out, act_scale_in,
                            act_scale_out);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const int64_t c_in = x.size(-1), a = d.active, c_out = d.c_out;
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = c_out;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < out_shape.size(); ++i) rows *= out_shape[i];
  if (rows == 0 || c_out == 0) return at::empty(out_shape, x.options());
  if (a == 0 && d.linear == 0) {  // no GEMM at all: b_out + residual, as the reference computes it
    at::Tensor out = at::zeros(out_shape, x.options().dtype(at::kFloat));
    if (b_out.defined()) out = out + b_out.to(at::kFloat);
    if (residual.defined()) out = out + residual.to(at::kFloat);
    return out.to(x.scalar_type());
  }

  const CpuIsa isa = active_cpu_isa();
  const gemm8::Int8Kernel kernel = gemm8::int8_kernel(isa);
  std::shared_ptr<const gemm8::PackedInt8B> act, lin, outw;
  if (a > 0) {
    act = packed_int8_weight("channel_idle_ffn_int8.act", qw_in, s_in, b_in, 0, a, at::Tensor(), kernel, "qw_in",
                             "s_in", "b_in");
    // L = 0: b_out is the second GEMM's own bias (packed with it), else it is folded into the linear path's
    outw = packed_int8_weight("channel_idle_ffn_int8.out", qw_out, s_out, d.linear == 0 ? b_out : at::Tensor(), 0,
                              c_out, at::Tensor(), kernel, "qw_out", "s_out", "b_out");
  }
  if (d.linear > 0)
    lin = packed_int8_weight("channel_idle_ffn_int8.lin", qw_in, s_in, b_in, a, d.linear, b_out, kernel, "qw_in",
                             "s_in", "b_in");

  const at::Tensor xf = contiguous_float(x), rf = contiguous_float(residual);
  const at::Tensor si = smooth_in.contiguous(), so = smooth_out.contiguous();
  at::Tensor out = empty_output(out_shape, at::kFloat);
  const float* xp = xf.data_ptr<float>();
  const float* rp = rf.defined() ? rf.data_ptr<float>() : nullptr;
  const float* sip = si.defined() ? si.data_ptr<float>() : nullptr;
  const float* sop = so.defined() ? so.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();

  for_each_token_tile(rows, isa, c_in * (a + d.linear) + a * c_out, kernel, [&](int64_t r0, int64_t m) {
    const QuantizedRows q1 = thread_quantized_rows(m, c_in, 0);
    quantize_activations(xp + r0 * c_in, c_in, m, c_in, sip, act_scale_in, q1, isa);
    float* o = op + r0 * c_out;
    const float* res = rp ? rp + r0 * c_out : nullptr;
    if (lin) {
      gemm::Epilogue ep;
      ep.bias = true;
      ep.addend = res;
      ep.ld_addend = c_out;
      gemm8::gemm_int8(m, q1.qa, q1.lda, q1.sa, q1.rowsum, *lin, o, c_out, ep, kernel);
    }
    if (act) {
      // h in a padded scratch (row stride = whole panels): the GELU tile is stored whole, no masks
      const int64_t ldh = act->padded_n();
      float* h = thread_int8_scratch(m * ldh);
      gemm::Epilogue ep_act;
      ep_act.bias = true;
      ep_act.gelu = true;
      ep_act.c_padded = true;
      gemm8::gemm_int8(m, q1.qa, q1.lda, q1.sa, q1.rowsum, *act, h, ldh, ep_act, kernel);
      const QuantizedRows q2 = thread_quantized_rows(m, a, 1);
      quantize_activations(h, ldh, m, a, sop, act_scale_out, q2, isa);
      gemm::Epilogue ep_out;
      if (lin) {
        ep_out.accumulate = true;
      } else {
        ep_out.bias = true;
        ep_out.addend = res;
        ep_out.ld_addend = c_out;
      }
      gemm8::gemm_int8(m, q2.qa, q2.lda, q2.sa, q2.rowsum, *outw, o, c_out, ep_out, kernel);
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace
at::Tensor channel_idle_ffn_int8_op(const at::Tensor& x, const at::Tensor& qw_in, const at::Tensor& s_in,
                                    const std::optional<at::Tensor>& b_in, const at::Tensor& qw_out,
                                    const at::Tensor& s_out, const std::optional<at::Tensor>& b_out,
                                    const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& smooth_in,
                                    const std::optional<at::Tensor>& smooth_out, double act_scale_in,
                                    double act_scale_out) {
  return channel_idle_ffn_int8_cpu(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in, smooth_out,
                                   act_scale_in, act_scale_out);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("channel_idle_ffn_int8", &vitfast::ops::channel_idle_ffn_int8_cpu); }

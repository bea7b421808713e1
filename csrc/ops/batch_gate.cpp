// torch binding of the USDC batch gate: `torch.ops.vitfast.batch_gate` on CPU.
//
//   batch_gate(Tensor x, Tensor w1, Tensor? b1, Tensor? w2=None, Tensor? b2=None, bool layer_norm=False,
//              str act='none', float eps=1e-05) -> Tensor                     (schema: vitfast/ops/batch_gate.py)
//
// - Checks: the same as vitfast/reference/batch_gate.py, same wording (ValueError via TORCH_CHECK_VALUE).
// - fp16/bf16 inputs are converted to fp32 (the reference pools in fp32 too); the decision is returned in x's dtype.
// - One thread: the whole op is one streaming pass over x plus a matrix-vector product of the gate network, far
//   below a block's cost (benchmarks/bench_batch_gate.py), and thread start-up would cost more than it saves.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "kernels/batch_gate.h"
#include "ops/op_utils.h"
#include "ops/vit_forward.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

GateAct parse_act(const std::string& act) {
  if (act == "none") return GateAct::kNone;
  if (act == "relu") return GateAct::kRelu;
  if (act == "gelu") return GateAct::kGelu;
  TORCH_CHECK_VALUE(false, "act: expected one of ('none', 'relu', 'gelu'), got '", act, "'");
  return GateAct::kNone;
}

// Mirror of vitfast.reference.batch_gate.check_batch_gate_args (same order, same messages); returns H.
int64_t check_args(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                   const at::Tensor& b2, bool layer_norm, GateAct act, double eps) {
  check_required({{"x", &x}, {"w1", &w1}});
  TORCH_CHECK_VALUE(x.dim() == 3, "x: expected 3-D [B, N, C], got shape ", fmt_shape(x.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  TORCH_CHECK_VALUE(x.size(0) > 0 && x.size(1) > 0, "x: expected at least one sample and one token, got shape ",
                    fmt_shape(x.sizes()));
  const int64_t channels = x.size(2);
  TORCH_CHECK_VALUE(w1.dim() == 2 && w1.size(1) == channels, "w1: expected shape [H, ", channels,
                    "] (C = x.shape[-1]), got ", fmt_shape(w1.sizes()));
  const int64_t hidden = w1.size(0);
  // An empty hidden layer has an empty w2, whose null data pointer the kernel would read as "no second layer".
  TORCH_CHECK_VALUE(hidden >= 1, "w1: expected at least one hidden unit, shape [H >= 1, ", channels, "], got ",
                    fmt_shape(w1.sizes()));
  TORCH_CHECK_VALUE(eps > 0, "eps: expected a number > 0, got ", eps);
  if (!w2.defined()) {
    TORCH_CHECK_VALUE(!b2.defined(), "b2: expected None when w2 is None (one-layer gate network), got ",
                      fmt_shape(b2.sizes()));
    TORCH_CHECK_VALUE(hidden == 2, "w1: expected shape [2, ", channels,
                      "] for a one-layer gate network (w2=None), got ", fmt_shape(w1.sizes()));
    TORCH_CHECK_VALUE(!layer_norm && act == GateAct::kNone,
                      "layer_norm, act: expected False and 'none' for a one-layer gate network (w2=None)");
  } else {
    TORCH_CHECK_VALUE(w2.dim() == 2 && w2.size(0) == 2 && w2.size(1) == hidden, "w2: expected shape [2, ", hidden,
                      "] (H = w1.shape[0]), got ", fmt_shape(w2.sizes()));
  }
  check_bias_shape("b1", b1, hidden);
  check_bias_shape("b2", b2, 2);
  check_same_dtype_device_as_x(x, {{"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2}});
  check_dense({{"x", &x}, {"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2}});
  return hidden;
}

at::Tensor as_float_contiguous(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.to(at::kFloat).contiguous();
}

const float* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

at::Tensor batch_gate_cpu(const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1_opt,
                          const OptTensor& w2_opt, const OptTensor& b2_opt, bool layer_norm, std::string act,
                          double eps) {
  const at::Tensor b1 = b1_opt.value_or(at::Tensor());
  const at::Tensor w2 = w2_opt.value_or(at::Tensor());
  const at::Tensor b2 = b2_opt.value_or(at::Tensor());
  const GateAct gate_act = parse_act(act);
  const int64_t hidden = check_args(x, w1, b1, w2, b2, layer_norm, gate_act, eps);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());

  const at::Tensor xf = as_float_contiguous(x), w1f = as_float_contiguous(w1), b1f = as_float_contiguous(b1);
  const at::Tensor w2f = as_float_contiguous(w2), b2f = as_float_contiguous(b2);
  BatchGateNet net;
  net.w1 = ptr(w1f);
  net.b1 = ptr(b1f);
  net.hidden = hidden;
  net.w2 = ptr(w2f);
  net.b2 = ptr(b2f);
  net.layer_norm = layer_norm;
  net.act = gate_act;
  net.eps = static_cast<float>(eps);
  const int64_t channels = x.size(2);
  std::vector<float> scratch(static_cast<size_t>(channels + hidden));
  float decision[2];
  batch_gate(xf.data_ptr<float>(), x.size(0) * x.size(1), channels, net, scratch.data(), decision);
  at::Tensor out = at::empty({2}, x.options().dtype(at::kFloat));
  out.data_ptr<float>()[0] = decision[0];
  out.data_ptr<float>()[1] = decision[1];
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor batch_gate_op(const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1, const OptTensor& w2,
                         const OptTensor& b2, bool layer_norm, const std::string& act, double eps) {
  return batch_gate_cpu(x, w1, b1, w2, b2, layer_norm, act, eps);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("batch_gate", &vitfast::ops::batch_gate_cpu); }

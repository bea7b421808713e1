// torch binding of the heads of collapsed non-deep attention: `torch.ops.vitfast.xwx_heads` on CPU.
//
//   xwx_heads(Tensor proj, Tensor? x, int num_heads, int value_dim) -> Tensor     (schema: vitfast/ops/xwx_heads.py)
//   out[..., h·D:(h+1)·D] = softmax_j(A_h B_hᵀ) · V_h   from proj [B, N, H·P] = per head [A_h | B'_h | V_h],
//   B_h = B'_h (factored), or [x | B'_h] with x [B, N, C] given (full form)          (vitfast/reference/xwx_heads.py)
//
// - Checks: the same as vitfast.reference.xwx_heads.check_xwx_heads_args, same wording (ValueError).
// - Phases 2 and 3 of the xwx_attention kernel (kernels/xwx_attention.h, threaded by ops/xwx_phases.h) on the given
//   projection, with the normalised heads written straight into the output rows (no output GEMM).  The layout is
//   the one xwx_attention's projection writes, so the two ops compute the same heads from the same projections.
// - fp16/bf16: converted to fp32, computed in fp32 (fp32 softmax statistics), rounded once at the end.
//
//   xwx_heads_int8(Tensor proj, Tensor? x, int num_heads, int value_dim) -> Tensor   (vitfast/reference/xwx_heads_int8.py)
//   the same heads with the score and value products on int8: `attention_int8`'s head (kernels/attention_int8.h) on
//   the strided operands A_h, B_h, V_h of the projection (softmax scale 1: folded into A_h), split into tasks as
//   `attention_int8` splits them (ops/attention_tasks.h).  The full form's B_h = [x | key bias column] is copied
//   into one contiguous block per task (N × (C + 1) floats, O(N·C) beside the O(N²·C) products); without a key bias
//   B_h is x itself.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_int8.h"
#include "kernels/cpu_features.h"
#include "kernels/xwx_attention.h"
#include "ops/attention_tasks.h"
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/output_pool.h"
#include "ops/xwx_phases.h"

namespace vitfast {
namespace ops {
namespace {

// Mirror of vitfast.reference.xwx_heads.check_xwx_heads_args (same order, same messages).
XwxLayout check_args(const at::Tensor& proj, const at::Tensor& x, int64_t num_heads, int64_t value_dim) {
  check_required({{"proj", &proj}});
  TORCH_CHECK_VALUE(proj.dim() == 3, "proj: expected 3-D [B, N, H·P], got shape ", fmt_shape(proj.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(proj.scalar_type()), "proj: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(proj.scalar_type()));
  TORCH_CHECK_VALUE(num_heads >= 1, "num_heads: expected an int >= 1, got ", num_heads);
  TORCH_CHECK_VALUE(value_dim >= 1, "value_dim: expected an int >= 1, got ", value_dim);
  const int64_t width = proj.size(2);
  TORCH_CHECK_VALUE(width > 0 && width % num_heads == 0, "proj: expected last dimension a positive multiple of "
                    "num_heads = ", num_heads, ", got shape ", fmt_shape(proj.sizes()));
  const int64_t per_head = width / num_heads, d = value_dim;
  XwxLayout l;
  l.shape.heads = num_heads;
  l.shape.value_dim = d;
  l.head_cols = per_head;
  if (!x.defined()) {
    const int64_t rest = per_head - d;
    TORCH_CHECK_VALUE(rest >= 2 && rest % 2 == 0, "proj: expected 2·R + value_dim columns per head (R >= 1: the left "
                      "and right score factors, then ", d, " value columns), got ", per_head,
                      " columns per head, shape ", fmt_shape(proj.sizes()));
    l.left_width = l.right_width = rest / 2;
    l.shape.rank = rest / 2;
    l.shape.channels = 0;  // unused by the factored form's phases
    return l;
  }
  TORCH_CHECK_VALUE(x.dim() == 3 && x.size(0) == proj.size(0) && x.size(1) == proj.size(1), "x: expected shape [",
                    proj.size(0), ", ", proj.size(1), ", C] (proj's tokens), got shape ", fmt_shape(x.sizes()));
  TORCH_CHECK_VALUE(x.scalar_type() == proj.scalar_type() && x.device() == proj.device(), "x: expected dtype ",
                    py_dtype(proj.scalar_type()), " on ", proj.device(), " (like proj), got ",
                    py_dtype(x.scalar_type()), " on ", x.device());
  const int64_t channels = x.size(2), rest = per_head - d - channels;
  TORCH_CHECK_VALUE(rest == 0 || rest == 2, "proj: expected C + 2·kb + value_dim columns per head with x given (C = ",
                    channels, ", kb 0 or 1: a key bias column, then ", d, " value columns), got ", per_head,
                    " columns per head, shape ", fmt_shape(proj.sizes()));
  l.shape.full = true;
  l.shape.key_bias = rest == 2;
  l.shape.channels = channels;
  l.shape.rank = channels;
  l.right_width = rest / 2;
  l.left_width = channels + rest / 2;
  return l;
}

at::Tensor f32(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat).contiguous() : at::Tensor(); }

}  // namespace

at::Tensor xwx_heads_op(const at::Tensor& proj, const std::optional<at::Tensor>& x_opt, int64_t num_heads,
                        int64_t value_dim) {
  const at::Tensor x = x_opt.value_or(at::Tensor());
  const XwxLayout w = check_args(proj, x, num_heads, value_dim);
  TORCH_CHECK_VALUE(proj.device().is_cpu(), "proj: expected device cpu (the CPU kernel), got ", proj.device());
  check_dense({{"proj", &proj}, {"x", &x}});
  const int64_t batch = proj.size(0), tokens = proj.size(1), hd = w.shape.heads * w.shape.value_dim;
  at::Tensor out = empty_output({batch, tokens, hd}, at::kFloat);
  if (batch == 0 || tokens == 0) return out.to(proj.scalar_type());
  const at::Tensor pf = f32(proj), xf = f32(x);
  const float* pp = pf.data_ptr<float>();
  const float* xp = xf.defined() ? xf.data_ptr<float>() : nullptr;
  const int64_t ldp = w.proj_cols(), C = w.shape.channels;
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();
  xwx_run(w, batch, tokens, xp, C, pp, op_threads(), isa, nullptr,
          [](int64_t q_rows) { return xwx_heads_workspace_floats(q_rows); },
          [&](int64_t image, int64_t q0, int64_t q1, const float* proj_image, const float* keys, float* ws) {
            xwx_heads_rows(w, tokens, proj_image, ldp, keys, q0, q1, op + (image * tokens + q0) * hd, hd, ws, isa);
          });
  return proj.scalar_type() == at::kFloat ? out : out.to(proj.scalar_type());
}

namespace {
// Per-thread scratch of the strided-head ops: the kernel's workspace, and the full form's [x | kb_h] rows.
struct Int8HeadsScratch {
  AttentionInt8Workspace ws;
  std::vector<float> keys;
};
struct Bf16HeadsScratch {
  gemm::AlignedFloats ws;
  std::vector<float> keys;
};

// The heads of `proj` as (image, head, query block) tasks on the attention ops' split (ops/attention_tasks.h):
// head(scratch, operands, q0, q1, out) with the head's operands at the image's row 0 (kernels/head_operands.h) and
// out at the head's first output column of that image's row 0 (row stride H·D).  The full form's keys [x | kb_h]
// are copied into the thread's scratch (N × (C + 1) floats, O(N·C) beside the O(N²·C) products); without a key
// bias they are x itself.
template <class Scratch, class Head>
at::Tensor strided_heads(const at::Tensor& proj, const std::optional<at::Tensor>& x_opt, int64_t num_heads,
                         int64_t value_dim, Scratch& (*scratch)(), Head head) {
  const at::Tensor x = x_opt.value_or(at::Tensor());
  const XwxLayout w = check_args(proj, x, num_heads, value_dim);
  TORCH_CHECK_VALUE(proj.device().is_cpu(), "proj: expected device cpu (the CPU kernel), got ", proj.device());
  check_dense({{"proj", &proj}, {"x", &x}});
  const int64_t batch = proj.size(0), tokens = proj.size(1), D = w.shape.value_dim, hd = w.shape.heads * D;
  at::Tensor out = empty_output({batch, tokens, hd}, at::kFloat);
  if (batch == 0 || tokens == 0) return out.to(proj.scalar_type());
  const at::Tensor pf = f32(proj), xf = f32(x);
  const float* pp = pf.data_ptr<float>();
  const float* xp = xf.defined() ? xf.data_ptr<float>() : nullptr;
  const int64_t ldp = w.proj_cols(), C = w.shape.channels, keys_floats = xwx_pack_scratch_floats(w, tokens);
  float* op = out.data_ptr<float>();
  for_each_attention_task(
      batch, tokens, w.shape.heads, active_cpu_isa(), [&](int64_t) { return &scratch(); },
      [&](Scratch* s, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t, int64_t, int64_t, int64_t) {
        if (keys_floats > 0 && int64_t(s->keys.size()) < keys_floats) s->keys.resize(size_t(keys_floats));
        const HeadOperands o = xwx_head_operands(w, tokens, pp + b * tokens * ldp, ldp,
                                                 xp != nullptr ? xp + b * tokens * C : nullptr, C, h,
                                                 keys_floats > 0 ? s->keys.data() : nullptr);
        head(*s, o, tokens, q0, q1, op + b * tokens * hd + h * D, hd);
      });
  return proj.scalar_type() == at::kFloat ? out : out.to(proj.scalar_type());
}

Int8HeadsScratch& int8_heads_scratch() {
  thread_local Int8HeadsScratch s;
  return s;
}
Bf16HeadsScratch& bf16_heads_scratch() {
  thread_local Bf16HeadsScratch s;
  return s;
}
}  // namespace

at::Tensor xwx_heads_int8_op(const at::Tensor& proj, const std::optional<at::Tensor>& x_opt, int64_t num_heads,
                             int64_t value_dim) {
  const CpuIsa isa = active_cpu_isa();
  return strided_heads(proj, x_opt, num_heads, value_dim, int8_heads_scratch,
                       [isa](Int8HeadsScratch& s, const HeadOperands& o, int64_t tokens, int64_t q0, int64_t q1,
                             float* out, int64_t ld_out) {
                         attention_int8_head(o, tokens, q0, q1, 1.0f, out, ld_out, s.ws, isa);
                       });
}

// The products on this CPU path's bf16 GEMMs, or the portable bf16 kernel where it has none (as attention_bf16: the
// op's definition does not depend on the hardware).
at::Tensor xwx_heads_bf16_op(const at::Tensor& proj, const std::optional<at::Tensor>& x_opt, int64_t num_heads,
                             int64_t value_dim) {
  const CpuIsa isa = active_cpu_isa();
  const gemm16::Bf16Kernel kernel = gemm16::bf16_kernel(isa);
  return strided_heads(proj, x_opt, num_heads, value_dim, bf16_heads_scratch,
                       [isa, kernel](Bf16HeadsScratch& s, const HeadOperands& o, int64_t tokens, int64_t q0,
                                     int64_t q1, float* out, int64_t ld_out) {
                         const int64_t floats = attention_workspace_floats_bf16(tokens, o.dk, o.dv, q1 - q0);
                         if (s.ws.size() < floats) s.ws = gemm::AlignedFloats(floats);
                         attention_head_bf16(o, tokens, q0, q1, 1.0f, out, ld_out, s.ws.data(), isa, kernel);
                       });
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) {
  m.impl("xwx_heads", &vitfast::ops::xwx_heads_op);
  m.impl("xwx_heads_int8", &vitfast::ops::xwx_heads_int8_op);
  m.impl("xwx_heads_bf16", &vitfast::ops::xwx_heads_bf16_op);
}

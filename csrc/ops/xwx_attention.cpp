// torch binding of collapsed non-deep attention: `torch.ops.vitfast.xwx_attention` on CPU.
//
//   xwx_attention(Tensor x, Tensor w_q, Tensor? w_k, Tensor? key_bias, Tensor w_v, Tensor w_o,
//                 Tensor? b_o=None, Tensor? residual=None) -> Tensor                 (schema: vitfast/ops/xwx_attention.py)
//   out = residual + b_o + Σ_h softmax(x W_h xᵀ + key bias) · (x w_v[h]) · w_o[h]     (kernels/xwx_attention.h)
//
// - Checks: the same as vitfast.reference.xwx_attention.check_xwx_attention_args, same wording (ValueError).
// - The weights are packed once per version into one projection weight and per-head output blocks, kept in the
//   process-wide cache (ops/weight_cache.h); they must be finite (checked at pack time).
// - bf16 on a CPU with a bf16 extension (AVX512_BF16, AMX, ARM BF16; ops/cpu_ops.h bf16_gemm_kernel): the
//   projection and output GEMMs on bf16 operands with fp32 accumulation (x as given; weights packed as bf16, cache
//   entry "xwx_attention_bf16"), the heads' score and value products on bf16 operands too (xwx_heads_bf16's: see
//   xwx_attention_bf16 below), b_o and the residual added in fp32, rounded once.  Measured (DeiT-S-sized two-branch
//   block, one thread, AMD EPYC with AVX512_BF16): 5.9 ms as fp32 compute -> 3.7 ms with the two GEMMs bf16 -> 2.9 ms
//   with the heads' products bf16 too (docs/quantization.md, bf16).
// - fp16, and bf16 without the extension: converted to fp32, computed in fp32 (fp32 softmax statistics), rounded
//   once at the end.
// - Threads (op_threads.h: torch's, or one inside a SerialOps scope), per group of that many images: the projection
//   over balanced chunks of token rows, the key/value packing over (image, head), the attention over (image, block
//   of query rows) — each task runs every head for its rows and owns those output rows (one output GEMM over all
//   heads per block).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/attention.h"
#include "kernels/xwx_attention.h"
#include "kernels/linear.h"
#include "ops/cpu_ops.h"
#include "ops/op_utils.h"
#include "ops/vit_forward.h"
#include "ops/weight_cache.h"
#include "ops/op_threads.h"
#include "ops/output_pool.h"
#include "ops/xwx_phases.h"

namespace vitfast {
namespace ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Mirror of vitfast.reference.xwx_attention.check_xwx_attention_args (same order, same messages).
XwxShape check_args(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_k, const at::Tensor& key_bias,
                    const at::Tensor& w_v, const at::Tensor& w_o, const at::Tensor& b_o, const at::Tensor& residual) {
  check_required({{"x", &x}, {"w_q", &w_q}, {"w_v", &w_v}, {"w_o", &w_o}});
  TORCH_CHECK_VALUE(x.dim() == 3, "x: expected a [B, N, C] tensor, got ", fmt_shape(x.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(x.scalar_type()), "x: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(x.scalar_type()));
  const int64_t C = x.size(2);
  TORCH_CHECK_VALUE(w_q.dim() == 3 && w_q.size(1) == C, "w_q: expected [H, ", C, ", R] (or [H, ", C, ", ", C,
                    "] with w_k=None), got ", fmt_shape(w_q.sizes()));
  const int64_t H = w_q.size(0), R = w_q.size(2);
  TORCH_CHECK_VALUE(H >= 1 && R >= 1, "w_q: expected at least one head and rank >= 1, got ", fmt_shape(w_q.sizes()));
  if (!w_k.defined()) {
    TORCH_CHECK_VALUE(R == C, "w_q: expected the full score matrices [H, ", C, ", ", C, "] when w_k is None, got ",
                      fmt_shape(w_q.sizes()));
  } else {
    TORCH_CHECK_VALUE(w_k.sizes().equals(w_q.sizes()), "w_k: expected the same shape as w_q ",
                      fmt_shape(w_q.sizes()), ", got ", fmt_shape(w_k.sizes()));
  }
  if (key_bias.defined())
    TORCH_CHECK_VALUE(key_bias.dim() == 2 && key_bias.size(0) == H && key_bias.size(1) == C, "key_bias: expected [",
                      H, ", ", C, "] or None, got ", fmt_shape(key_bias.sizes()));
  TORCH_CHECK_VALUE(w_v.dim() == 3 && w_v.size(0) == H && w_v.size(1) == C, "w_v: expected [", H, ", ", C,
                    ", D], got ", fmt_shape(w_v.sizes()));
  const int64_t D = w_v.size(2);
  TORCH_CHECK_VALUE(w_o.dim() == 3 && w_o.size(0) == H && w_o.size(1) == D, "w_o: expected [", H, ", ", D,
                    ", C_out], got ", fmt_shape(w_o.sizes()));
  const int64_t CO = w_o.size(2);
  if (b_o.defined())
    TORCH_CHECK_VALUE(b_o.dim() == 1 && b_o.size(0) == CO, "b_o: expected [", CO, "] or None, got ",
                      fmt_shape(b_o.sizes()));
  if (residual.defined()) {
    const std::vector<int64_t> expected{x.size(0), x.size(1), CO};
    TORCH_CHECK_VALUE(residual.sizes().equals(expected), "residual: expected ", fmt_shape(expected),
                      " or None, got ", fmt_shape(residual.sizes()));
  }
  for (const auto& [name, t] : std::initializer_list<NamedTensor>{
           {"w_q", &w_q}, {"w_k", &w_k}, {"key_bias", &key_bias}, {"w_v", &w_v}, {"w_o", &w_o}, {"b_o", &b_o},
           {"residual", &residual}}) {
    if (!t->defined()) continue;
    TORCH_CHECK_VALUE(t->scalar_type() == x.scalar_type() && t->device() == x.device(), name, ": expected dtype ",
                      py_dtype(x.scalar_type()), " on ", x.device(), " (like x), got ", py_dtype(t->scalar_type()),
                      " on ", t->device());
  }
  check_dense({{"x", &x}, {"w_q", &w_q}, {"w_k", &w_k}, {"key_bias", &key_bias}, {"w_v", &w_v}, {"w_o", &w_o},
               {"b_o", &b_o}, {"residual", &residual}});
  XwxShape s;
  s.heads = H;
  s.channels = C;
  s.rank = R;
  s.value_dim = D;
  s.out_channels = CO;
  s.full = !w_k.defined();
  s.key_bias = key_bias.defined();
  return s;
}

at::Tensor f32(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat).contiguous() : at::Tensor(); }
const float* data(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The weights packed by `pack` (xwx_pack or xwx_pack_bf16) into a T, cached under `entry` per weight version;
// non-finite weights are refused there.
template <class T, class Pack>
std::shared_ptr<const T> cached_xwx_weights(const char* entry, const XwxShape& s, const at::Tensor& w_q,
                                            const at::Tensor& w_k, const at::Tensor& key_bias, const at::Tensor& w_v,
                                            const at::Tensor& w_o, const at::Tensor& b_o, Pack pack) {
  return cached_pack_as<T>(entry, {w_q, w_k, key_bias, w_v, w_o, b_o}, [&]() -> PackedEntry {
    for (const auto& [name, t] : std::initializer_list<NamedTensor>{
             {"w_q", &w_q}, {"w_k", &w_k}, {"key_bias", &key_bias}, {"w_v", &w_v}, {"w_o", &w_o}, {"b_o", &b_o}})
      check_finite(name, *t);
    const at::Tensor q = f32(w_q), k = f32(w_k), kb = f32(key_bias), v = f32(w_v), o = f32(w_o), bo = f32(b_o);
    auto packed = std::make_shared<T>(pack(s, data(q), data(k), data(kb), data(v), data(o), data(bo)));
    PackedEntry e;
    e.bytes = packed->bytes();
    e.packed = std::move(packed);
    return e;
  });
}

// The bf16 path (a bf16 model on a CPU with a bf16 extension): the projection GEMM reads x as bf16 (fp32
// projections); the heads' score and value products run on bf16 operands with fp32 sums — each (image, head)'s keys
// [K_h | kb_h] (the full form: [x | kb_h]) and values packed once as bf16 panels (attention_pack_bf16), then per row
// task every head's rows (attention_rows_bf16: `attention_bf16`'s products, softmax scale 1, folded into L_h),
// written as bf16 for the output GEMM; both GEMMs accumulate in fp32 (gemm_bf16.h) and add b_o and the residual in
// fp32; the result is rounded once.  These are `xwx_heads_bf16`'s heads (vitfast/reference/xwx_heads_bf16.py) between
// the two bf16 GEMMs.
at::Tensor xwx_attention_bf16(const XwxShape& s, const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_k,
                              const at::Tensor& key_bias, const at::Tensor& w_v, const at::Tensor& w_o,
                              const at::Tensor& b_o, const at::Tensor& residual, gemm16::Bf16Kernel kernel) {
  const int64_t batch = x.size(0), tokens = x.size(1), C = s.channels, CO = s.out_channels;
  const auto packed =
      cached_xwx_weights<XwxPackedBf16>("xwx_attention_bf16", s, w_q, w_k, key_bias, w_v, w_o, b_o, xwx_pack_bf16);
  const XwxPackedBf16& w = *packed;
  at::Tensor out = empty_output({batch, tokens, CO}, at::kFloat);
  if (batch == 0 || tokens == 0) return out.to(x.scalar_type());
  at::Tensor xh;
  int64_t ldx16 = C;
  const uint16_t* x16 = bf16_rows_view(x.reshape({batch * tokens, C}), C, xh, ldx16, kernel);
  const at::Tensor xf = s.full ? f32(x) : at::Tensor();  // the full form's right operand [x | kb_h], in fp32
  const at::Tensor res = f32(residual);
  const float* rp = data(res);
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();
  const int64_t D = s.value_dim, HD = s.heads * D, ld16 = gemm16::padded_k(HD), ldp = w.proj_cols();
  const int64_t lw = w.left_width;
  const int64_t per_head = attention_packed_floats_bf16(tokens, lw, D);
  // One head's operands in an image's projections (proj, x at its row 0); the full form's keys with a key bias are
  // assembled in `scratch` (xwx_run's per-thread xwx_pack_scratch_floats).
  auto operands = [&](const float* proj, const float* xi, int64_t h, float* scratch) {
    return xwx_head_operands(w, tokens, proj, ldp, xi, C, h, scratch);
  };
  XwxKeys keys;
  keys.floats_per_head = per_head;
  keys.pack = [&](const float* proj, const float* xi, int64_t h, float* out_keys, float* scratch) {
    attention_pack_bf16(operands(proj, xi, h, scratch), tokens, out_keys, kernel);
  };
  const int64_t rows_ws_floats = attention_rows_workspace_floats_bf16(tokens, lw, tokens);
  xwx_run(
      w, batch, tokens, s.full ? xf.data_ptr<float>() : nullptr, C, nullptr, op_threads(), isa,
      [&](int64_t r0, int64_t r1, float* proj) {
        linear_rows_bf16(w.proj, r1 - r0, x16 + r0 * ldx16, ldx16, nullptr, 0, proj, ldp, kernel);
      },
      // the heads' workspace, then their bf16 rows [q_rows × H·D] (uint16 pairs in floats)
      [&](int64_t q_rows) { return rows_ws_floats + (q_rows * ld16 + 1) / 2; },
      [&](int64_t image, int64_t q0, int64_t q1, const float* proj, const float* image_keys, float* ws) {
        const int64_t m = q1 - q0;
        uint16_t* heads16 = reinterpret_cast<uint16_t*>(ws + rows_ws_floats);
        for (int64_t h = 0; h < s.heads; ++h)
          attention_rows_bf16(operands(proj, nullptr, h, nullptr), image_keys + h * per_head, tokens, q0, q1, 1.0f,
                              nullptr, 0, heads16 + h * D, ld16, ws, isa, kernel);
        gemm::Epilogue ep;
        ep.bias = true;
        ep.addend = rp != nullptr ? rp + (image * tokens + q0) * CO : nullptr;
        ep.ld_addend = CO;
        gemm16::gemm_bf16(m, heads16, ld16, w.w_o, op + (image * tokens + q0) * CO, CO, ep, kernel);
      },
      &keys);
  return out.to(x.scalar_type());
}

at::Tensor xwx_attention_cpu(const at::Tensor& x, const at::Tensor& w_q, const OptTensor& w_k_opt,
                             const OptTensor& key_bias_opt, const at::Tensor& w_v, const at::Tensor& w_o,
                             const OptTensor& b_o_opt, const OptTensor& residual_opt) {
  const at::Tensor w_k = w_k_opt.value_or(at::Tensor()), key_bias = key_bias_opt.value_or(at::Tensor());
  const at::Tensor b_o = b_o_opt.value_or(at::Tensor()), residual = residual_opt.value_or(at::Tensor());
  const XwxShape s = check_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x: expected device cpu (the CPU kernel), got ", x.device());
  const gemm16::Bf16Kernel kernel = bf16_gemm_kernel(x.scalar_type());
  if (kernel != gemm16::Bf16Kernel::kScalar)
    return xwx_attention_bf16(s, x, w_q, w_k, key_bias, w_v, w_o, b_o, residual, kernel);
  const int64_t batch = x.size(0), tokens = x.size(1), C = s.channels, CO = s.out_channels;
  const auto packed = cached_xwx_weights<XwxPacked>("xwx_attention", s, w_q, w_k, key_bias, w_v, w_o, b_o, xwx_pack);
  const XwxPacked& w = *packed;
  at::Tensor out = empty_output({batch, tokens, CO}, at::kFloat);
  if (batch == 0 || tokens == 0) return out.to(x.scalar_type());
  const at::Tensor xf = f32(x), res = f32(residual);
  const float* xp = xf.data_ptr<float>();
  const float* rp = data(res);
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();
  // Phase 1 the fp32 projection GEMM; each row task runs every head for its rows and owns those output rows.
  xwx_run(
      w, batch, tokens, xp, C, nullptr, op_threads(), isa,
      [&](int64_t r0, int64_t r1, float* proj) {
        xwx_project(w, r1 - r0, xp + r0 * C, C, proj, w.proj_cols(), isa);
      },
      [&](int64_t q_rows) { return xwx_rows_workspace_floats(w, q_rows); },
      [&](int64_t image, int64_t q0, int64_t q1, const float* proj, const float* keys, float* ws) {
        xwx_attention_rows(w, tokens, proj, w.proj_cols(), keys, q0, q1,
                           rp != nullptr ? rp + image * tokens * CO : nullptr, CO, op + image * tokens * CO, CO, ws,
                           isa);
      });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor xwx_attention_op(const at::Tensor& x, const at::Tensor& w_q, const OptTensor& w_k, const OptTensor& key_bias,
                            const at::Tensor& w_v, const at::Tensor& w_o, const OptTensor& b_o,
                            const OptTensor& residual) {
  return xwx_attention_cpu(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual);
}
}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("xwx_attention", &vitfast::ops::xwx_attention_cpu); }

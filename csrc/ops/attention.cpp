// torch binding of multi-head self-attention from packed qkv: `torch.ops.vitfast.attention` on CPU.
//
//   attention(Tensor qkv, int num_heads, float? scale=None) -> Tensor          (schema: vitfast/ops/attention.py)
//   qkv [B, N, 3·H·D] (timm's qkv Linear output, q | k | v, heads inside each)  ->  [B, N, H·D]
//   = softmax(Q_h K_hᵀ · scale) V_h per head (scale defaults to D^-1/2), heads side by side: what proj reads.
//
// - Checks: the same as vitfast.reference.attention.check_attention_args, same wording (ValueError).
// - qkv is read in place (any row stride with unit inner stride); the output is written once, already in
//   proj's layout: no permute, transpose or copy on either side (see kernels/attention.h).
// - bf16 on a CPU with a bf16 extension: Q·Kᵀ and P·V on the bf16 GEMMs (Q, K, V and P rounded to bf16, fp32
//   accumulation; kernels/attention.h attention_head_bf16), the softmax in fp32, rounded once at the end.
// - fp16, and bf16 without the extension: converted to fp32, computed in fp32 (fp32 softmax statistics), rounded once
//   at the end.
// - Threads (at::parallel_for): (image, head, query-row block) tasks.  Query rows are split when there are
//   fewer than two (image, head) pairs per thread (DeiT-Ti at batch 1 has 3 heads for 2 threads), in balanced
//   blocks of whole 6-row register blocks (the kernel bounds its score tile itself, in row chunks); each
//   thread has its own scratch.  Each task is told the next one its thread runs, to prefetch it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "ops/attention_tasks.h"
#include "ops/cpu_ops.h"
#include "ops/op_utils.h"
#include "ops/output_pool.h"
#include "ops/int8_block.h"

namespace vitfast {
namespace ops {
namespace {

// Per-thread scratch (packed K/V of one head and its score tile), kept between calls.
float* thread_workspace(int64_t floats) {
  thread_local gemm::AlignedFloats buffer;
  if (buffer.size() < floats) buffer = gemm::AlignedFloats(floats);
  return buffer.data();
}

at::Tensor attention_cpu(const at::Tensor& qkv, int64_t num_heads, std::optional<double> scale_opt) {
  const AttentionInput in = attention_input(qkv, num_heads, scale_opt);
  if (in.empty()) return at::empty({in.batch, in.tokens, in.attn_dim}, qkv.options());
  at::Tensor out = empty_output({in.batch, in.tokens, in.attn_dim}, at::kFloat);
  const float* qp = in.src.data_ptr<float>();
  const gemm16::Bf16Kernel kernel = bf16_gemm_kernel(qkv.scalar_type());
  if (kernel != gemm16::Bf16Kernel::kScalar)
    attention_run_bf16(qp, in.ld_qkv, in.batch, in.tokens, in.heads, in.d, in.scale, out.data_ptr<float>(),
                       active_cpu_isa(), kernel);
  else
    attention_run(qp, in.ld_qkv, in.batch, in.tokens, in.heads, in.d, in.scale, out.data_ptr<float>(),
                  active_cpu_isa());
  return qkv.scalar_type() == at::kFloat ? out : out.to(qkv.scalar_type());
}

// `torch.ops.vitfast.attention_bf16` (schema: vitfast/ops/attention_bf16.py): qkv in its dtype (computed from its
// fp32 values), the output in qkv's dtype, the products
// on the bf16 GEMMs of this CPU path — or on the portable bf16 kernel where it has none (the same products, slowly):
// the op's definition does not depend on the hardware.
at::Tensor attention_bf16_cpu(const at::Tensor& qkv, int64_t num_heads, std::optional<double> scale_opt) {
  const AttentionInput in = attention_input(qkv, num_heads, scale_opt);
  if (in.empty()) return at::empty({in.batch, in.tokens, in.attn_dim}, qkv.options());
  at::Tensor out = empty_output({in.batch, in.tokens, in.attn_dim}, at::kFloat);
  const CpuIsa isa = active_cpu_isa();
  attention_run_bf16(in.src.data_ptr<float>(), in.ld_qkv, in.batch, in.tokens, in.heads, in.d, in.scale,
                     out.data_ptr<float>(), isa, gemm16::bf16_kernel(isa));
  // fp16/bf16 qkv: computed from its fp32 values, the output rounded back once (as `attention_int8`).
  return qkv.scalar_type() == at::kFloat ? out : out.to(qkv.scalar_type());
}

// Per-thread scratch of the bf16 heads (a separate buffer: its layout differs from the fp32 one).
float* thread_workspace_bf16(int64_t floats) {
  thread_local gemm::AlignedFloats buffer;
  if (buffer.size() < floats) buffer = gemm::AlignedFloats(floats);
  return buffer.data();
}

}  // namespace

// Mirror of vitfast.reference.attention.check_attention_args (same order, same messages; attention_int8 takes the
// same).  Returns the head dim.
int64_t check_attention_args(const at::Tensor& qkv, int64_t num_heads, const std::optional<double>& scale) {
  check_required({{"qkv", &qkv}});
  TORCH_CHECK_VALUE(qkv.dim() == 3, "qkv: expected 3-D [B, N, 3·H·D], got shape ", fmt_shape(qkv.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(qkv.scalar_type()), "qkv: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(qkv.scalar_type()));
  TORCH_CHECK_VALUE(num_heads >= 1, "num_heads: expected an int >= 1, got ", num_heads);
  const int64_t width = qkv.size(2);
  // 3·num_heads divides width, tested without forming 3·num_heads (it wraps for a huge num_heads, which then
  // passed the check and crashed the kernel).
  TORCH_CHECK_VALUE(width > 0 && width % 3 == 0 && width / 3 % num_heads == 0, "qkv: expected last dimension a "
                    "positive multiple of 3·num_heads = ", exact_product(3, num_heads), ", got shape ",
                    fmt_shape(qkv.sizes()));
  if (scale.has_value())
    TORCH_CHECK_VALUE(std::isfinite(*scale), "scale: expected a finite number, got ", *scale);
  TORCH_CHECK_VALUE(qkv.layout() == at::kStrided, "qkv: expected a dense (strided) tensor, got layout ",
                    qkv.layout());
  return width / 3 / num_heads;
}

AttentionInput attention_input(const at::Tensor& qkv, int64_t num_heads, const std::optional<double>& scale) {
  AttentionInput in{};
  in.d = check_attention_args(qkv, num_heads, scale);
  TORCH_CHECK_VALUE(qkv.device().is_cpu(), "qkv: expected device cpu (the CPU kernel), got ", qkv.device());
  in.batch = qkv.size(0), in.tokens = qkv.size(1), in.heads = num_heads, in.attn_dim = num_heads * in.d;
  in.scale = scale.has_value() ? float(*scale) : 1.0f / std::sqrt(float(in.d));
  in.src = qkv;
  if (in.empty()) return in;
  if (qkv.scalar_type() != at::kFloat || qkv.stride(2) != 1 || qkv.stride(0) != qkv.stride(1) * in.tokens ||
      qkv.stride(1) < 3 * in.attn_dim)
    in.src = qkv.to(at::kFloat).contiguous();
  in.ld_qkv = in.src.stride(1);
  return in;
}


namespace {
// The prefetch hint for the thread's next task (nb = -1: none); `out` nullptr: its output is not prefetched.
template <class T>
AttentionNext next_task(const T* qp, int64_t ld_qkv, int64_t tokens, float* out, int64_t attn_dim, int64_t nb,
                        int64_t nh, int64_t nq0, int64_t nq1) {
  AttentionNext next;
  if (nb >= 0) {
    next.qkv = qp + nb * tokens * ld_qkv;
    next.out = out != nullptr ? out + nb * tokens * attn_dim : nullptr;
    next.h = nh, next.q0 = nq0, next.q1 = nq1;
  }
  return next;
}

// qkv fp32 (T = float) or already bf16 (T = uint16_t): the two attention_head_bf16 entries.
template <class T>
void run_bf16(const T* qp, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d, float scale,
              float* op, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* o16, int64_t ld_o16) {
  const int64_t attn_dim = heads * d;
  for_each_attention_task(
      batch, tokens, heads, isa,
      [&](int64_t rows) { return thread_workspace_bf16(attention_workspace_floats_bf16(tokens, d, rows)); },
      [&](float* ws, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t nb, int64_t nh, int64_t nq0, int64_t nq1) {
        const AttentionNext next = next_task(qp, ld_qkv, tokens, o16 != nullptr ? nullptr : op, attn_dim, nb, nh,
                                             nq0, nq1);
        attention_head_bf16(qp + b * tokens * ld_qkv, ld_qkv, tokens, heads, d, h, q0, q1, scale,
                            o16 != nullptr ? nullptr : op + b * tokens * attn_dim, attn_dim, ws, isa, kernel, next,
                            o16 != nullptr ? o16 + b * tokens * ld_o16 : nullptr, ld_o16);
      });
}
}  // namespace

void attention_run_bf16(const float* qp, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                        float scale, float* op, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* o16,
                        int64_t ld_o16) {
  run_bf16(qp, ld_qkv, batch, tokens, heads, d, scale, op, isa, kernel, o16, ld_o16);
}

void attention_run_bf16(const uint16_t* qp, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                        float scale, float* op, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* o16,
                        int64_t ld_o16) {
  run_bf16(qp, ld_qkv, batch, tokens, heads, d, scale, op, isa, kernel, o16, ld_o16);
}

void attention_run(const float* qp, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                   float scale, float* op, CpuIsa isa) {
  const int64_t attn_dim = heads * d;
  for_each_attention_task(
      batch, tokens, heads, isa,
      [&](int64_t rows) { return thread_workspace(attention_workspace_floats(tokens, d, rows)); },
      [&](float* ws, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t nb, int64_t nh, int64_t nq0, int64_t nq1) {
        const AttentionNext next = next_task(qp, ld_qkv, tokens, op, attn_dim, nb, nh, nq0, nq1);
        attention_head(qp + b * tokens * ld_qkv, ld_qkv, tokens, heads, d, h, q0, q1, scale,
                       op + b * tokens * attn_dim, attn_dim, ws, isa, next);
      });
}

at::Tensor attention_op(const at::Tensor& qkv, int64_t num_heads) { return attention_cpu(qkv, num_heads, std::nullopt); }
at::Tensor attention_bf16_op(const at::Tensor& qkv, int64_t num_heads) {
  return attention_bf16_cpu(qkv, num_heads, std::nullopt);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) {
  m.impl("attention", &vitfast::ops::attention_cpu);
  m.impl("attention_bf16", &vitfast::ops::attention_bf16_cpu);
}

// torch binding of multi-head self-attention with int8 score and value products: `torch.ops.vitfast.attention_int8`
// on CPU.
//
//   attention_int8(Tensor qkv, int num_heads, float? scale=None) -> Tensor   (schema: vitfast/ops/attention_int8.py)
//   qkv [B, N, 3·H·D] -> [B, N, H·D], as `attention`, with Q·Kᵀ and P·V on the int8 core (kernels/attention_int8.h;
//   the definition: vitfast/reference/attention_int8.py).
//
// - Checks: those of `attention` (vitfast.reference.attention.check_attention_args), same wording (ValueError).
// - qkv is read in place (uniformly strided rows, unit inner stride), the output written in proj's layout.
// - fp16/bf16: converted to fp32, computed as fp32 input would be, rounded once at the end.
// - Threads (at::parallel_for): (image, head, query-row block) tasks, split as `attention` does (query blocks only
//   when there are fewer than two (image, head) pairs per thread); each thread has its own scratch.  Each task is
//   told the next one its thread runs, to prefetch it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "kernels/attention_int8.h"
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


AttentionInt8Workspace& thread_workspace() {
  thread_local AttentionInt8Workspace ws;
  return ws;
}

at::Tensor attention_int8_cpu(const at::Tensor& qkv, int64_t num_heads, std::optional<double> scale_opt) {
  const AttentionInput in = attention_input(qkv, num_heads, scale_opt);
  if (in.empty()) return at::empty({in.batch, in.tokens, in.attn_dim}, qkv.options());
  const int64_t batch = in.batch, tokens = in.tokens, heads = in.heads, d = in.d, attn_dim = in.attn_dim;
  const int64_t ld_qkv = in.ld_qkv;
  const float scale = in.scale;
  const float* qp = in.src.data_ptr<float>();
  at::Tensor out = empty_output({batch, tokens, attn_dim}, at::kFloat);
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();

  // Prefetching the next task pays when qkv is larger than the caches hold (measured, 1 thread, interleaved with
  // fp32 attention: DeiT-B batch 8 (15 MB of qkv) 0.97x -> 1.28x of fp32) and costs where it is already there
  // (DeiT-S/B batch 1, 0.9 / 1.8 MB: 1.38x -> 1.29x): only above 4 MiB.
  const bool prefetch_next = double(batch) * double(tokens) * double(ld_qkv) * sizeof(float) > double(4 << 20);
  for_each_attention_task(
      batch, tokens, heads, isa, [](int64_t) { return &thread_workspace(); },
      [&](AttentionInt8Workspace* ws, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t nb, int64_t nh,
          int64_t nq0, int64_t nq1) {
        AttentionInt8Next next;
        if (prefetch_next && nb >= 0) {
          next.qkv = qp + nb * tokens * ld_qkv;
          next.out = op + nb * tokens * attn_dim;
          next.h = nh, next.q0 = nq0, next.q1 = nq1;
        }
        attention_int8_head(qp + b * tokens * ld_qkv, ld_qkv, tokens, heads, d, h, q0, q1, scale,
                            op + b * tokens * attn_dim, attn_dim, *ws, isa, next);
      });
  return qkv.scalar_type() == at::kFloat ? out : out.to(qkv.scalar_type());
}

}  // namespace
at::Tensor attention_int8_op(const at::Tensor& qkv, int64_t num_heads) {
  return attention_int8_cpu(qkv, num_heads, std::nullopt);
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("attention_int8", &vitfast::ops::attention_int8_cpu); }

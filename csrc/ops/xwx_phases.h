// The phases of the XWX kernels (kernels/xwx_attention.h) over a batch, threaded, shared by the bindings that run
// them: `xwx_attention` (its fp32 or bf16 projection GEMM first, the output GEMM inside each row task) and
// `xwx_heads` (projections made by the caller — a quantized model's int8 GEMM — and no output GEMM).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu_features.h"
#include "kernels/xwx_attention.h"

namespace vitfast {
namespace ops {

// The XWX ops' whole loop (kernels/xwx_attention.h's phases, threaded).  Images in groups of `threads`: a group's
// projections and packed keys (~1.5 MiB per DeiT-Ti image) stay in cache between the phases; the whole batch at once
// streamed them from DRAM (batch 8 ran ~10% slower per image than batch 1).  Per group:
//   phase 1 (`project` given): project(r0, r1, out) writes the projections of the batch's token rows [r0, r1) into
//           out (row stride w.proj_cols(), the calling thread's buffer, kept between calls: a fresh ~1.5 MiB per
//           image cost page faults on every call, ~10% of a batch-1 call), one balanced share of the group's rows
//           per thread (gemm::RowShares); without `project`, `proj` holds the whole batch's projections;
//   phase 2: keys and values of every (image, head) packed once (x: the full form's right operand, row stride ldx);
//   phase 3: (image, block of query rows) tasks rows(image, q0, q1, proj, keys, workspace), proj / keys at that
//           image's row 0 / packed keys, with a per-thread 64-byte aligned workspace of workspace_floats(rows of the
//           largest block) floats.  Blocks of about 48 query rows (the score tile and the accumulator stay in L1/L2),
//           more blocks when there are fewer than two tasks per thread.
//   keys (optional): phase 2's packing instead of xwx_pack_keys — pack(proj, x, h, keys, scratch) for one (image,
//           head), proj / x at that image's row 0, into floats_per_head floats (a 64-byte multiple), scratch the
//           thread's xwx_pack_scratch_floats(w, tokens) floats (xwx_attention's bf16 path packs bf16 panels).
using XwxProject = std::function<void(int64_t r0, int64_t r1, float* out)>;
struct XwxKeys {
  int64_t floats_per_head = 0;
  std::function<void(const float* proj, const float* x, int64_t h, float* keys, float* scratch)> pack;
};
using XwxRows = std::function<void(int64_t image, int64_t q0, int64_t q1, const float* proj, const float* keys,
                                   float* workspace)>;
void xwx_run(const XwxLayout& w, int64_t batch, int64_t tokens, const float* x, int64_t ldx, const float* proj,
             int64_t threads, CpuIsa isa, const XwxProject& project,
             const std::function<int64_t(int64_t)>& workspace_floats, const XwxRows& rows,
             const XwxKeys* keys = nullptr);

}  // namespace ops
}  // namespace vitfast

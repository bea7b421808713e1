// Phases 2 and 3 of the XWX kernels (kernels/xwx_attention.h) over a group of images, threaded, shared by the two
// bindings that run them: `xwx_attention` (its own fp32 projection GEMM first, the output GEMM inside each row task)
// and `xwx_heads` (projections made by the caller — a quantized model's int8 GEMM — and no output GEMM).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu_features.h"
#include "kernels/xwx_attention.h"

namespace vitfast {
namespace ops {

// The calling thread's buffers for `images` images' projections / packed keys (kept between calls: a fresh
// allocation of ~1.5 MiB per DeiT-Ti image costs page faults on every call, ~10% of a batch-1 call).
float* xwx_projection_buffer(int64_t floats);
float* xwx_keys_buffer(int64_t floats);

// Phase 1's split: one balanced share of a group's `rows` token rows per thread (gemm::RowShares), each projected by
// project(r0, r1) (the fp32 or the bf16 projection GEMM over those rows).
void xwx_project_shares(int64_t rows, int64_t threads, CpuIsa isa,
                        const std::function<void(int64_t r0, int64_t r1)>& project);

// Keys and values of every (image, head) packed once into `keys` (images · heads · xwx_keys_floats floats), then
// (image, block of query rows) tasks: rows(b, q0, q1, workspace) with a per-thread 64-byte aligned workspace of
// workspace_floats(rows of the largest block) floats.  proj / x point at image 0's row 0 (row strides ldp, ldx).
// Blocks of about 48 query rows (the score tile and the accumulator stay in L1/L2), more blocks when there are
// fewer than two tasks per thread.
void xwx_keys_and_rows(const XwxLayout& w, int64_t images, int64_t tokens, const float* proj, int64_t ldp,
                       const float* x, int64_t ldx, float* keys, int64_t threads, CpuIsa isa,
                       const std::function<int64_t(int64_t)>& workspace_floats,
                       const std::function<void(int64_t b, int64_t q0, int64_t q1, float* workspace)>& rows);

}  // namespace ops
}  // namespace vitfast

#include "ops/xwx_phases.h"

#include <algorithm>

#include "kernels/gemm.h"
#include "ops/op_threads.h"

namespace vitfast {
namespace ops {
namespace {

// Per-thread scratch kept between calls (64-byte aligned: the packed panels are read with aligned loads).
enum class Scratch { kWorker, kProjections, kKeys };
template <Scratch kind>
float* thread_buffer(int64_t floats) {
  thread_local gemm::AlignedFloats buffer;
  if (buffer.size() < floats) buffer = gemm::AlignedFloats(floats);
  return buffer.data();
}

void xwx_project_shares(int64_t rows, int64_t threads, CpuIsa isa,
                        const std::function<void(int64_t r0, int64_t r1)>& project) {
  const gemm::RowShares shares(rows, threads, isa);
  parallel_for(0, shares.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = shares.begin(c), r1 = shares.end(c);
      if (r1 > r0) project(r0, r1);
    }
  });
}

void xwx_keys_and_rows(const XwxLayout& w, int64_t images, int64_t tokens, const float* proj, int64_t ldp,
                       const float* x, int64_t ldx, float* keys, int64_t per_head, const XwxKeys* pack,
                       int64_t threads, CpuIsa isa, const std::function<int64_t(int64_t)>& workspace_floats,
                       const std::function<void(int64_t b, int64_t q0, int64_t q1, float* workspace)>& rows) {
  const int64_t scratch_floats = xwx_pack_scratch_floats(w, tokens);
  parallel_for(0, images * w.shape.heads, 1, [&](int64_t begin, int64_t end) {
    float* scratch = scratch_floats > 0 ? thread_buffer<Scratch::kWorker>(scratch_floats) : nullptr;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / w.shape.heads, h = t % w.shape.heads;
      const float* xb = x != nullptr ? x + b * tokens * ldx : nullptr;
      if (pack != nullptr)
        pack->pack(proj + b * tokens * ldp, xb, h, keys + t * per_head, scratch);
      else
        xwx_pack_keys(w, tokens, proj + b * tokens * ldp, ldp, xb, ldx, h, keys + t * per_head, scratch);
    }
  });
  constexpr int64_t kQueryRows = 48;
  const int64_t q_blocks = (tokens + gemm::kMr - 1) / gemm::kMr;
  int64_t splits = std::max<int64_t>(1, (tokens + kQueryRows - 1) / kQueryRows);
  if (images * splits < 2 * threads) splits = std::max(splits, (2 * threads + images - 1) / images);
  splits = std::min(splits, q_blocks);
  const gemm::RowShares query_shares(tokens, splits, isa);  // splits <= q_blocks <= tokens: chunks == splits
  const int64_t ws_floats = workspace_floats(query_shares.max_share());
  parallel_for(0, images * splits, 1, [&](int64_t begin, int64_t end) {
    float* ws = thread_buffer<Scratch::kWorker>(ws_floats);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / splits, part = t % splits;
      rows(b, query_shares.begin(part), query_shares.end(part), ws);
    }
  });
}

}  // namespace

void xwx_run(const XwxLayout& w, int64_t batch, int64_t tokens, const float* x, int64_t ldx, const float* proj,
             int64_t threads, CpuIsa isa, const XwxProject& project,
             const std::function<int64_t(int64_t)>& workspace_floats, const XwxRows& rows, const XwxKeys* keys) {
  const int64_t ldp = w.proj_cols(), per_head = keys != nullptr ? keys->floats_per_head : xwx_keys_floats(w, tokens);
  const int64_t group = std::min(batch, threads);
  // The calling thread's buffers (the workers only read and write through these pointers during the call).
  float* pp = project ? thread_buffer<Scratch::kProjections>(group * tokens * ldp) : nullptr;
  float* kp = thread_buffer<Scratch::kKeys>(group * w.shape.heads * per_head);
  for (int64_t b0 = 0; b0 < batch; b0 += group) {
    const int64_t images = std::min(group, batch - b0), row0 = b0 * tokens;
    const float* pg = pp;
    if (project)
      xwx_project_shares(images * tokens, threads, isa,
                         [&](int64_t r0, int64_t r1) { project(row0 + r0, row0 + r1, pp + r0 * ldp); });
    else
      pg = proj + row0 * ldp;
    xwx_keys_and_rows(w, images, tokens, pg, ldp, x != nullptr ? x + row0 * ldx : nullptr, ldx, kp, per_head, keys,
                      threads, isa, workspace_floats, [&](int64_t b, int64_t q0, int64_t q1, float* ws) {
                        rows(b0 + b, q0, q1, pg + b * tokens * ldp, kp + b * w.shape.heads * per_head, ws);
                      });
  }
}

}  // namespace ops
}  // namespace vitfast

// The thread split of the attention ops (fp32, bf16 and int8 heads): one task per (image, head), split into query
// blocks only to give every thread work, each thread told its next task so the head can prefetch it.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "ops/op_threads.h"

namespace vitfast {
namespace ops {

// Query rows are split when there are fewer than two (image, head) pairs per thread (DeiT-Ti at batch 1 has 3
// heads for 2 threads), in balanced blocks of whole register blocks; a task runs its rows in chunks, so the score
// tile stays small at any sequence length, and each extra block re-packs K and V.
//   workspace_for(rows) -> the thread's scratch for tasks of at most `rows` query rows (once per thread chunk);
//   body(ws, b, h, q0, q1, nb, nh, nq0, nq1) runs one task; (nb, nh, nq0, nq1) is the thread's next task (nb = -1:
//   none), prefetched during this one (kernels/attention.h, kernels/attention_int8.h).
template <class WorkspaceFor, class Body>
void for_each_attention_task(int64_t batch, int64_t tokens, int64_t heads, CpuIsa isa, WorkspaceFor workspace_for,
                             Body body) {
  const int64_t threads = op_threads();
  const int64_t pairs = batch * heads;
  const int64_t row_blocks = (tokens + gemm::kMr - 1) / gemm::kMr;
  const int64_t splits = std::min(row_blocks, pairs >= 2 * threads ? int64_t(1) : (2 * threads + pairs - 1) / pairs);
  const gemm::RowShares shares(tokens, splits, isa);  // splits <= row_blocks <= tokens: shares.chunks == splits
  auto task = [&](int64_t t, int64_t& b, int64_t& h, int64_t& q0, int64_t& q1) {
    const int64_t pair = t / splits, part = t % splits;
    b = pair / heads;
    h = pair % heads;
    q0 = shares.begin(part);
    q1 = shares.end(part);
  };
  parallel_for(0, pairs * splits, 1, [&](int64_t begin, int64_t end) {
    auto ws = workspace_for(shares.max_share());
    for (int64_t t = begin; t < end; ++t) {
      int64_t b, h, q0, q1, nb = -1, nh = 0, nq0 = 0, nq1 = 0;
      task(t, b, h, q0, q1);
      if (t + 1 < end) task(t + 1, nb, nh, nq0, nq1);
      body(ws, b, h, q0, q1, nb, nh, nq0, nq1);
    }
  });
}

}  // namespace ops
}  // namespace vitfast

// How many threads a CPU op splits its work over.
//
// torch's intra-op threads (at::get_num_threads(), so torch.set_num_threads is respected), or one inside a SerialOps
// scope.  A whole-block op (vit_block, int8_block) opens one when its block is too small for a parallel region's
// fork and join to pay: at the demo model's shape (17 tokens, width 96) a block's six parallel regions on two threads
// cost more than the second thread saves (fp32 block 34.8 µs on one thread, 41.9 on two).  Inside the scope every
// op runs its work as one share on the calling thread (at::parallel_for over one chunk runs inline); the shares only
// change which thread computes a row, never its arithmetic, so the bits are the same.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace vitfast {
namespace ops {

int64_t op_threads();

class SerialOps {
 public:
  explicit SerialOps(bool on);
  ~SerialOps();
  SerialOps(const SerialOps&) = delete;
  SerialOps& operator=(const SerialOps&) = delete;

 private:
  bool previous_;
};

// at::parallel_for over [begin, end) in chunks of at least `grain`; inside a SerialOps scope, the whole range in one
// call on the calling thread.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, op_threads() == 1 ? std::max<int64_t>(grain, end - begin) : grain, f);
}

// Multiply-adds of a ViT block: its GEMMs' (rows × the four weight matrices' elements) and attention's two products.
inline int64_t block_macs(int64_t batch, int64_t tokens, int64_t weight_elements, int64_t attn_dim) {
  return batch * tokens * weight_elements + 2 * batch * tokens * tokens * attn_dim;
}

// Multiply-adds of a block below which vit_block (fp32 / bf16) runs on one thread.  At the demo model's shape, one
// thread ÷ two, paired: 1.4 M (batch 1) 1.01 with this rule (two threads were 20% slower without it), 2.8 M 1.16.
constexpr int64_t kMinParallelBlockMacs = int64_t(1) << 21;

// How many times more work a block needs before its parallel regions pay: 8 under OMP_WAIT_POLICY=PASSIVE or
// GOMP_SPINCOUNT=0 (idle threads sleep, so each region pays a wake-up), else 1.  Measured on a shared 2-core host under PASSIVE, two threads
// ÷ one, fused DeiT-Ti at batch 1: 50 tokens (13.9 M multiply-adds a block) 0.97×, 101 tokens (30 M) 1.10×; the
// demo-sized non-deep model (2.5 M) 0.28× (~0.3 ms of wake-ups a block) — so the break-even is near 8 × 2 M.
int64_t parallel_block_macs_scale();

// Whether a block of `macs` multiply-adds runs on the calling thread under the threshold `min_parallel_macs`.
inline bool block_runs_serial(int64_t macs, int64_t min_parallel_macs) {
  return macs < min_parallel_macs * parallel_block_macs_scale();
}

// The rule of an fp32 / bf16 block (vit_block, and the one-call forward's blocks without a whole-block op): its
// GEMMs' weight elements and its attention width (block_macs).
inline bool float_block_runs_serial(int64_t batch, int64_t tokens, int64_t weight_elements, int64_t attn_dim) {
  return block_runs_serial(block_macs(batch, tokens, weight_elements, attn_dim), kMinParallelBlockMacs);
}

}  // namespace ops
}  // namespace vitfast

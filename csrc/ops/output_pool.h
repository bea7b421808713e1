// The CPU ops' output tensors, from a small cache of freed blocks.
//
// Why: glibc's malloc returns large freed blocks to the kernel (its trim threshold follows the largest block freed so
// far), so a forward that allocates and frees outputs of a few MB each gets fresh pages for some of them on every
// call, and the first write of each 4 KiB page is a page fault inside the kernel that writes it.  An int8
// RePa-DeiT-S/0.75 forward at batch 8 on two threads took 2.3-17.6 thousand faults (9-70 MB of zeroed pages) in
// linear_int8's outputs, 5-20 ms of system time and 38-58 ms a forward, against 37-39 ms and no fault with malloc's
// thresholds raised (docs/performance.md, "Page faults").  A forward's outputs repeat the same sizes, so a freed
// block is kept for the next output of its size instead.
//
// Blocks of at least kPooledBytes only (smaller ones come from the CPU allocator, as with at::empty); at most
// kPerSize blocks of one size and kMaxCachedBytes in all are kept, beyond that a freed block goes back to malloc.
// VITFAST_OUTPUT_POOL=0 in the environment (read once) turns the cache off: every output is at::empty's.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

namespace vitfast {
namespace ops {

constexpr size_t kPooledBytes = size_t(1) << 20;
constexpr size_t kPerSize = 4;
constexpr size_t kMaxCachedBytes = size_t(512) << 20;

// A contiguous CPU tensor of `sizes` and `dtype`, uninitialised (at::empty's contract); its storage is resizable and
// frees into the cache.
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype);

// Bytes held in the cache now, and blocks handed out from it since the process started (for tests).
struct OutputPoolStats {
  int64_t cached_bytes = 0;
  int64_t reused = 0;
  bool enabled = true;
};
OutputPoolStats output_pool_stats();
// Frees every cached block (the memory goes back to malloc); outputs still alive are not affected.
void output_pool_clear();

}  // namespace ops
}  // namespace vitfast

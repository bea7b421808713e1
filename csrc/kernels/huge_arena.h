// An arena on transparent huge pages for the kernels' long-lived storage: packed weights and the grow-only
// scratch buffers (everything `AlignedArray` holds from kHugeArenaMinBytes up).
//
// Why: at batch 1 a model's packed weights are read once per forward from L3 or memory, and in 4 KiB pages
// every 4 KiB of a weight costs a TLB miss, a two-level page walk under a hypervisor.  The packed qkv weight of
// DeiT-S (1.77 MiB, under the 2 MiB a single allocation needs before the kernel can back it with a huge page)
// was 1.32-1.45× slower cold (24 weights in turn) than hot on 4 KiB pages, 1.08-1.11× in this arena; the whole
// fused DeiT-S/0.75 forward (batch 1, one thread, fp32) is 1.09× faster with it (table huge_pages_ab,
// docs/performance.md, "Prepacking and huge pages").  One allocation per weight cannot get there: most
// weights are < 2 MiB, and rounding each up to 2 MiB would triple a DeiT-S's weight memory.  So weights are
// carved from 2 MiB-aligned chunks of kHugeArenaChunkBytes that are advised for huge pages (MADV_HUGEPAGE; THP in
// its default "madvise" mode backs nothing else), and packed densely.
//
// Allocation is best fit over each chunk's free ranges, freeing coalesces neighbours, and a chunk whose every
// range is free is unmapped.  Only the pages an allocation touches are backed (the arena zeroes what it hands
// out), so a chunk's unused tail costs address space, not memory.  Thread-safe (one mutex, held across fork()).
//
// Off (allocations fall back to aligned_alloc) when VITFAST_HUGE_PAGES=0, on systems without MADV_HUGEPAGE,
// and in AddressSanitizer builds (ASan must see every allocation's bounds).
#pragma once

#include <cstddef>

namespace vitfast {

// Allocations at least this large go to the arena: a packed 16-column panel of K = 1024 floats is 64 KiB; below
// that an allocation spans few pages and is one of few.
constexpr size_t kHugeArenaMinBytes = size_t(64) << 10;
// Address space mapped per chunk (an allocation larger than this gets a chunk of its own, rounded to 2 MiB).
constexpr size_t kHugeArenaChunkBytes = size_t(32) << 20;

// `bytes` (rounded up to 64) from the arena, 64-byte aligned and zeroed; nullptr when the arena is off or the
// system refuses the mapping (the caller then allocates elsewhere).
void* huge_arena_alloc(size_t bytes);

// Frees `p` if the arena handed it out and returns true; returns false (and does nothing) otherwise.
bool huge_arena_free(void* p);

struct HugeArenaStats {
  size_t chunks = 0;         // chunks mapped now
  size_t mapped_bytes = 0;   // their address space
  size_t live_blocks = 0;    // allocations not freed
  size_t live_bytes = 0;     // their sizes (rounded to 64)
  size_t largest_free = 0;   // the largest free range in any chunk
};
HugeArenaStats huge_arena_stats();

// Whether the arena is on in this process (VITFAST_HUGE_PAGES, the build, the system).
bool huge_arena_enabled();

}  // namespace vitfast

// The next panels' weights asked into L2 by the row tiles of the current ones: the next pair of 16-column panels in
// the AVX-512 fp32 and VNNI int8 14 × 32 kernels, the next panel in the AVX2 6 × 16 one (gemm_driver.h).  Plain C++
// (the kernels issue the prefetch themselves) with internal linkage: each ISA file compiles its own copy under its own
// target, so the linker cannot hand an AVX-512 copy to a caller on the AVX2 path (gemm_avx2.cpp's ODR note).
//
// At batch 1 a pair's B (K lines of 64 B per panel) comes from L3 or memory for the first row tile and from L2 for
// the other 13, and the first tile waits on it: in a DeiT-S forward it ran at half the others' rate (rdtsc per tile),
// and in a C++ loop over 12 rotating weights at a quarter (~6 GB/s: bound by the misses a tile keeps in flight, not by
// bandwidth).  So the row tiles after the first each prefetch a contiguous share of the next pair's lines, one line
// every kNextPairStride k steps, branch-free: the pointer stops on the share's last line (a repeated prefetch of a line
// already on its way is nearly free; a branch in the K loop is not).  Measured on that loop, 196 × K × N, one
// thread, flops per TSC cycle over the whole GEMM: 384 × 1152 59.6 -> 65.3, 768 × 768 59.4 -> 64.5, 768 × 2304
// 57.5 -> 63.1, hot weights unchanged (±1%); one prefetch every k step, or a branch per step, slowed the other
// tiles more than the first gained.  Whole forwards, off ÷ on: table next_panel_prefetch_ab in docs/performance.md
// (benchmarks/next_panel_prefetch_ab.py).  The AVX-512 bf16 kernel (gemm_bf16_avx512.cpp) keeps its own variant:
// this one measured slower there.  The K loop that issues the share (has_next / next / next_last and the four-step
// body) is written out in each kernel rather than shared as a cursor object here: that refactor changed GCC's
// register allocation of the 28-accumulator loops and measured no better in alternating builds, so it was not kept.
#pragma once

#include <stdint.h>

namespace vitfast {

// False when VITFAST_NEXT_PANEL_PREFETCH=0 (read once; for A/B runs: benchmarks/next_panel_prefetch_ab.py): the kernels
// then give no tile a share.  Defined in gemm.cpp, outside the ISA-targeted files.
bool next_panel_prefetch_enabled();

// k steps (fp32) or 4-k groups (int8) per prefetched line; the kernels' K loops issue one per four unrolled steps.
constexpr int64_t kNextPairStride = 4;

struct NextPairShare {
  const char* next = nullptr;      // first line to prefetch
  const char* next_end = nullptr;  // one past the last (next == next_end: nothing)
};

// Panels of the next group for the current one's tiles to prefetch: those of [first, first + width) below panel_end,
// none when the prefetch is off (width 2 for the 14 × 32 kernels' pairs, 1 for the AVX2 driver's single panels).
static inline int64_t next_panels(int64_t first, int64_t panel_end, int64_t width, bool on) {
  const int64_t left = panel_end - first;
  return !on || left <= 0 ? 0 : (left < width ? left : width);
}

// Tile t's share of the next pair: np_next panels (0 = no next pair) of `lines` 64-byte lines each, the first at
// `next_panel0` and the second `panel_stride` bytes on.  Tile 0 reads its own pair from afar and takes none; tiles
// 1, 2, ... take `steps / kNextPairStride` lines each (as many as their K loop of `steps` steps issues), panel by
// panel, until the pair is covered: 2 × K lines are done by tile 8 of a pair's 14, well before the next pair starts,
// and the tiles after have no prefetch in their loop (at batch 8 a pair has ~57 tiles per thread).  No share crosses
// from one panel into the other (no gather in the loop): a panel's last share may be shorter.
static inline NextPairShare next_pair_share(const char* next_panel0, int64_t panel_stride, int64_t np_next,
                                            int64_t lines, int64_t steps, int64_t t) {
  NextPairShare s;
  const int64_t cap = steps / kNextPairStride;
  if (next_panel0 == nullptr || np_next <= 0 || t == 0 || cap <= 0 || lines <= 0) return s;
  const int64_t per_panel = (lines + cap - 1) / cap, q = (t - 1) / per_panel, j = (t - 1) % per_panel;
  if (q >= np_next) return s;
  const char* panel = next_panel0 + q * panel_stride;
  s.next = panel + j * cap * 64;
  s.next_end = panel + ((j + 1) * cap < lines ? (j + 1) * cap : lines) * 64;
  return s;
}

}  // namespace vitfast

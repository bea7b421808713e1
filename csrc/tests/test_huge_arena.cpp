// The huge-page arena (kernels/huge_arena.h) behind AlignedArray: alignment and zeroing (also of a reused range),
// best fit and coalescing, a chunk unmapped once empty, an allocation larger than a chunk, a random sequence
// checked against a model of which bytes are live, threads, and the fallback when the arena is off (ASan builds,
// VITFAST_HUGE_PAGES=0).  Prints "huge_arena: all checks passed" (tests/test_cpp_kernels.py looks for it).
#include "kernels/huge_arena.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/aligned.h"
#include "tests/test_util.h"

namespace {

using vitfast::huge_arena_alloc;
using vitfast::huge_arena_free;
using vitfast::huge_arena_stats;
using vitfast::kHugeArenaChunkBytes;
using vitfast::kHugeArenaMinBytes;

bool all_zero(const void* p, size_t bytes) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i)
    if (b[i] != 0) return false;
  return true;
}

void test_alignment_zeroing_and_reuse() {
  void* a = huge_arena_alloc(100000);
  VT_CHECK(a != nullptr, "arena allocation failed");
  VT_CHECK(reinterpret_cast<uintptr_t>(a) % 64 == 0, "not 64-byte aligned: %p", a);
  VT_CHECK(all_zero(a, 100000), "fresh block not zeroed");
  std::memset(a, 0xAB, 100000);
  VT_CHECK(huge_arena_stats().chunks == 1, "one chunk expected, got %zu", huge_arena_stats().chunks);
  // A second block keeps the chunk alive while the first is freed and its range handed out again: the arena
  // must zero it (the bytes are still 0xAB in the mapping).
  void* keep = huge_arena_alloc(4096);
  VT_CHECK(huge_arena_free(a), "free of an arena block returned false");
  void* b = huge_arena_alloc(100000);
  VT_CHECK(b == a, "best fit should reuse the freed range at %p, got %p", a, b);
  VT_CHECK(all_zero(b, 100000), "a reused range was not zeroed");
  VT_CHECK(!huge_arena_free(nullptr), "free(nullptr) claimed");
  int on_stack = 0;
  VT_CHECK(!huge_arena_free(&on_stack), "free of a foreign pointer claimed");
  VT_CHECK(huge_arena_free(b) && huge_arena_free(keep), "frees failed");
  VT_CHECK(!huge_arena_free(b), "double free claimed");
  const vitfast::HugeArenaStats s = huge_arena_stats();
  VT_CHECK(s.chunks == 0 && s.live_blocks == 0 && s.live_bytes == 0 && s.mapped_bytes == 0,
           "an empty chunk was kept: chunks %zu live %zu", s.chunks, s.live_blocks);
}

void test_best_fit_and_coalescing() {
  // Blocks a b c d x y of one unit each; free b and c (adjacent: one range of 2 units) and x (1 unit; y keeps it
  // apart from the chunk's free tail).
  const size_t unit = 256 << 10;
  void* blocks[6];
  for (void*& p : blocks) p = huge_arena_alloc(unit);
  char* base = static_cast<char*>(blocks[0]);
  for (int i = 1; i < 6; ++i)
    VT_CHECK(static_cast<char*>(blocks[i]) == base + i * unit, "blocks of one chunk should be packed densely");
  void *b = blocks[1], *c = blocks[2], *x = blocks[4];
  VT_CHECK(huge_arena_free(b) && huge_arena_free(c) && huge_arena_free(x), "frees failed");
  // 2 units fit in the coalesced b+c range and in the (larger) tail: best fit takes b+c.
  void* e = huge_arena_alloc(2 * unit);
  VT_CHECK(e == b, "the coalesced range b+c should be the best fit for 2 units (got offset %td units)",
           (static_cast<char*>(e) - base) / ptrdiff_t(unit));
  // One unit: x's range is the smallest that fits.
  void* f = huge_arena_alloc(unit);
  VT_CHECK(f == x, "x's freed range should be the best fit for 1 unit");
  // Free everything but f, in an order that merges ranges from both sides: the chunk stays while f is live.
  VT_CHECK(huge_arena_free(blocks[0]) && huge_arena_free(blocks[3]) && huge_arena_free(e) &&
               huge_arena_free(blocks[5]),
           "frees failed");
  VT_CHECK(huge_arena_stats().chunks == 1, "chunk dropped while f is live");
  VT_CHECK(huge_arena_stats().largest_free == kHugeArenaChunkBytes - 5 * unit,
           "ranges before f not merged: largest free %zu", huge_arena_stats().largest_free);
  VT_CHECK(huge_arena_free(f), "free failed");
  VT_CHECK(huge_arena_stats().chunks == 0, "chunk kept after its last block was freed");
}

void test_larger_than_a_chunk() {
  const size_t big = kHugeArenaChunkBytes + 12345;
  void* small = huge_arena_alloc(kHugeArenaMinBytes);
  void* p = huge_arena_alloc(big);
  VT_CHECK(p != nullptr, "large allocation failed");
  const vitfast::HugeArenaStats s = huge_arena_stats();
  VT_CHECK(s.chunks == 2, "the large block should get a chunk of its own: %zu chunks", s.chunks);
  VT_CHECK(s.mapped_bytes == kHugeArenaChunkBytes + (big + (2 << 20) - 1) / (2 << 20) * (2 << 20),
           "large chunk not rounded to 2 MiB: mapped %zu", s.mapped_bytes);
  VT_CHECK(reinterpret_cast<uintptr_t>(p) % (2 << 20) == 0, "a chunk must start on a 2 MiB boundary");
  static_cast<char*>(p)[big - 1] = 1;  // the last byte is writable
  VT_CHECK(huge_arena_free(p) && huge_arena_free(small), "frees failed");
  VT_CHECK(huge_arena_stats().chunks == 0, "chunks kept");
}

// Random allocations and frees against a model: no two live blocks overlap, each block keeps the bytes written
// into it, the live counts match, and every block is zeroed when handed out.
void test_random_sequence() {
  std::mt19937 rng(7);
  struct Live {
    unsigned char* p;
    size_t bytes;
    unsigned char tag;
  };
  std::vector<Live> live;
  std::uniform_int_distribution<size_t> size(kHugeArenaMinBytes, 3 << 20);
  for (int step = 0; step < 600; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = size(rng);
      unsigned char* p = static_cast<unsigned char*>(huge_arena_alloc(bytes));
      VT_CHECK(p != nullptr, "allocation of %zu failed", bytes);
      VT_CHECK(all_zero(p, bytes), "block of %zu not zeroed at step %d", bytes, step);
      for (const Live& l : live)
        VT_CHECK(p + bytes <= l.p || l.p + l.bytes <= p, "block [%p, +%zu) overlaps a live one", p, bytes);
      const unsigned char tag = static_cast<unsigned char>(1 + step % 250);
      std::memset(p, tag, bytes);
      live.push_back({p, bytes, tag});
    } else {
      const size_t i = rng() % live.size();
      const Live l = live[i];
      VT_CHECK(l.p[0] == l.tag && l.p[l.bytes / 2] == l.tag && l.p[l.bytes - 1] == l.tag,
               "a live block's bytes changed");
      VT_CHECK(huge_arena_free(l.p), "free failed");
      live.erase(live.begin() + ptrdiff_t(i));
    }
    const vitfast::HugeArenaStats s = huge_arena_stats();
    size_t bytes = 0;
    for (const Live& l : live) bytes += (l.bytes + 63) / 64 * 64;
    VT_CHECK(s.live_blocks == live.size() && s.live_bytes == bytes, "stats: %zu blocks / %zu bytes, model %zu / %zu",
             s.live_blocks, s.live_bytes, live.size(), bytes);
  }
  for (const Live& l : live) VT_CHECK(huge_arena_free(l.p), "final free failed");
  VT_CHECK(huge_arena_stats().chunks == 0, "chunks kept after the sequence");
}

void test_threads() {
  std::vector<std::thread> threads;
  std::atomic<int> overwritten{0};  // VT_CHECK's counter is not for threads: count here, check after the join
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &overwritten] {
      std::mt19937 rng(100 + t);
      std::vector<unsigned char*> mine;
      for (int i = 0; i < 300; ++i) {
        if (mine.size() < 8 && rng() % 2 == 0) {
          unsigned char* p = static_cast<unsigned char*>(huge_arena_alloc(kHugeArenaMinBytes + rng() % 500000));
          if (p != nullptr) {
            p[0] = static_cast<unsigned char>(t);
            mine.push_back(p);
          }
        } else if (!mine.empty()) {
          unsigned char* p = mine.back();
          mine.pop_back();
          if (p[0] != static_cast<unsigned char>(t)) overwritten.fetch_add(1);
          huge_arena_free(p);
        }
      }
      for (unsigned char* p : mine) huge_arena_free(p);
    });
  }
  for (auto& th : threads) th.join();
  VT_CHECK(overwritten.load() == 0, "%d blocks were written by another thread", overwritten.load());
  const vitfast::HugeArenaStats s = huge_arena_stats();
  VT_CHECK(s.chunks == 0 && s.live_blocks == 0, "after the threads: %zu chunks, %zu live", s.chunks, s.live_blocks);
  std::printf("huge_arena threads: ok\n");
}

// AlignedArray routes through the arena from kHugeArenaMinBytes up and frees back into it.
void test_aligned_array() {
  {
    vitfast::AlignedArray<float> big(int64_t(kHugeArenaMinBytes / sizeof(float)));
    vitfast::AlignedArray<float> small(100);
    VT_CHECK(huge_arena_stats().live_blocks == 1, "the large array should be in the arena, the small one not");
    VT_CHECK(all_zero(big.data(), kHugeArenaMinBytes) && all_zero(small.data(), 400), "arrays not zeroed");
    vitfast::AlignedArray<float> moved = std::move(big);
    VT_CHECK(huge_arena_stats().live_blocks == 1, "a move must not free");
  }
  VT_CHECK(huge_arena_stats().live_blocks == 0, "AlignedArray did not free into the arena");
}

void test_off() {
  VT_CHECK(huge_arena_alloc(1 << 20) == nullptr, "the arena is off but handed out a block");
  int x = 0;
  VT_CHECK(!huge_arena_free(&x), "the arena is off but claimed a pointer");
  vitfast::AlignedArray<float> big(1 << 20);  // falls back to aligned_alloc
  VT_CHECK(big.data() != nullptr && reinterpret_cast<uintptr_t>(big.data()) % 64 == 0, "fallback not aligned");
  VT_CHECK(all_zero(big.data(), 4 << 20), "fallback not zeroed");
}

}  // namespace

int main() {
  if (!vitfast::huge_arena_enabled()) {
    std::printf("huge_arena: off in this build or environment; checking the fallback\n");
    test_off();
  } else {
    test_alignment_zeroing_and_reuse();
    test_best_fit_and_coalescing();
    test_larger_than_a_chunk();
    test_random_sequence();
    test_threads();
    test_aligned_array();
  }
  if (vitfast_test::failures() != 0) return 1;
  std::printf("huge_arena: all checks passed\n");
  return 0;
}

#include "kernels/huge_arena.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define VITFAST_ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VITFAST_ARENA_ASAN 1
#endif
#endif

#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(VITFAST_ARENA_ASAN)
#define VITFAST_ARENA_POSSIBLE 1
#endif

namespace vitfast {

namespace {

#if defined(VITFAST_ARENA_POSSIBLE)

constexpr size_t kHugePageBytes = size_t(2) << 20;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

struct Chunk {
  char* base = nullptr;
  size_t size = 0;
  std::map<size_t, size_t> free;  // offset -> length, non-adjacent (neighbours are merged on free)
  size_t live = 0;                // allocations in this chunk
};

// `size` bytes of anonymous memory on a 2 MiB boundary, advised for huge pages; nullptr if refused.
char* map_aligned(size_t size) {
  const size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + span, used_end = aligned + size;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
  return reinterpret_cast<char*>(aligned);
}

class Arena {
 public:
  void* alloc(size_t bytes) {
    bytes = round_up(bytes == 0 ? 1 : bytes, 64);
    char* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit: the smallest free range that holds `bytes` (ties: the first chunk's).
      Chunk* best_chunk = nullptr;
      std::map<size_t, size_t>::iterator best;
      for (auto& c : chunks_) {
        for (auto it = c->free.begin(); it != c->free.end(); ++it) {
          if (it->second >= bytes && (best_chunk == nullptr || it->second < best->second)) {
            best_chunk = c.get();
            best = it;
          }
        }
      }
      if (best_chunk == nullptr) {
        const size_t size = bytes > kHugeArenaChunkBytes ? round_up(bytes, kHugePageBytes) : kHugeArenaChunkBytes;
        char* base = map_aligned(size);
        if (base == nullptr) return nullptr;
        auto c = std::make_unique<Chunk>();
        c->base = base;
        c->size = size;
        best = c->free.emplace(0, size).first;
        best_chunk = c.get();
        chunks_.push_back(std::move(c));
      }
      const size_t offset = best->first, length = best->second;
      best_chunk->free.erase(best);
      if (length > bytes) best_chunk->free.emplace(offset + bytes, length - bytes);
      ++best_chunk->live;
      p = best_chunk->base + offset;
      blocks_.emplace(p, std::make_pair(best_chunk, bytes));
    }
    std::memset(p, 0, bytes);  // a reused range holds an earlier block's bytes (outside the lock: it is ours now)
    return p;
  }

  bool free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = blocks_.find(ptr);
    if (found == blocks_.end()) return false;
    Chunk* c = found->second.first;
    size_t offset = size_t(static_cast<char*>(ptr) - c->base), length = found->second.second;
    blocks_.erase(found);
    auto next = c->free.lower_bound(offset);
    if (next != c->free.end() && next->first == offset + length) {
      length += next->second;
      next = c->free.erase(next);
    }
    if (next != c->free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        c->free.erase(prev);
      }
    }
    c->free.emplace(offset, length);
    if (--c->live == 0) {
      munmap(c->base, c->size);
      for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
        if (it->get() == c) {
          chunks_.erase(it);
          break;
        }
      }
    }
    return true;
  }

  HugeArenaStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    HugeArenaStats s;
    s.chunks = chunks_.size();
    for (const auto& c : chunks_) {
      s.mapped_bytes += c->size;
      for (const auto& r : c->free) s.largest_free = r.second > s.largest_free ? r.second : s.largest_free;
    }
    s.live_blocks = blocks_.size();
    for (const auto& b : blocks_) s.live_bytes += b.second.second;
    return s;
  }

  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unordered_map<void*, std::pair<Chunk*, size_t>> blocks_;
};

// Never destroyed: packed weights in static objects and thread-local scratch are freed during exit, after
// static destructors would have run.
Arena& arena() {
  static Arena* a = [] {
    Arena* created = new Arena();
    // fork() copies the mutex as it is: held by another thread at that instant, the child's first allocation
    // would wait for ever (DataLoader workers are forked).  Hold it across the fork, release it on both sides.
    pthread_atfork([] { arena().lock(); }, [] { arena().unlock(); }, [] { arena().unlock(); });
    return created;
  }();
  return *a;
}

#endif  // VITFAST_ARENA_POSSIBLE

}  // namespace

bool huge_arena_enabled() {
#if defined(VITFAST_ARENA_POSSIBLE)
  static const bool on = [] {
    const char* env = std::getenv("VITFAST_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
#else
  return false;
#endif
}

void* huge_arena_alloc(size_t bytes) {
#if defined(VITFAST_ARENA_POSSIBLE)
  if (!huge_arena_enabled()) return nullptr;
  return arena().alloc(bytes);
#else
  (void)bytes;
  return nullptr;
#endif
}

bool huge_arena_free(void* p) {
#if defined(VITFAST_ARENA_POSSIBLE)
  if (p == nullptr || !huge_arena_enabled()) return false;
  return arena().free(p);
#else
  (void)p;
  return false;
#endif
}

HugeArenaStats huge_arena_stats() {
#if defined(VITFAST_ARENA_POSSIBLE)
  if (huge_arena_enabled()) return arena().stats();
#endif
  return HugeArenaStats{};
}

}  // namespace vitfast

#include "kernels/aligned.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/huge_arena.h"

namespace vitfast {

void* aligned_zeroed_alloc(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
  if (bytes >= kHugeArenaMinBytes) {
    // Packed weights and grow-only scratch: on huge pages (kernels/huge_arena.h says why).
    if (void* p = huge_arena_alloc(bytes)) return p;
  }
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return p;
}

void aligned_free(void* p, size_t bytes) {
  if (p == nullptr) return;
  bytes = (bytes + 63) / 64 * 64;
  if (bytes >= kHugeArenaMinBytes && huge_arena_free(p)) return;
  std::free(p);
}

}  // namespace vitfast

#include "ops/output_pool.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif
#include <unordered_map>
#include <vector>

namespace vitfast {
namespace ops {
namespace {

constexpr size_t kAlignment = 64;  // as c10's CPU allocator: every vector load of an op stays aligned
constexpr size_t kPage = 4096;

struct Block {
  void* ptr;
  size_t bytes;  // the rounded size it was allocated with (its cache key)
};

// A c10::Allocator whose large blocks, when their tensor dies, wait in a free list keyed by size (see the header).
class OutputPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < kPooledBytes) return c10::GetCPUAllocator()->allocate(nbytes);
    const size_t bytes = (nbytes + kPage - 1) / kPage * kPage;
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        ++reused_;
      }
    }
    if (ptr == nullptr && posix_memalign(&ptr, kAlignment, bytes) != 0) {
      TORCH_CHECK(false, "vitfast: out of memory allocating an op output of ", nbytes, " bytes");
    }
    return c10::DataPtr(ptr, new Block{ptr, bytes}, &OutputPool::release, c10::Device(c10::DeviceType::CPU));
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  OutputPoolStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    OutputPoolStats s;
    s.cached_bytes = int64_t(cached_);
    s.reused = reused_;
    return s;
  }

  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

  void clear() {
    std::vector<void*> freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& kv : free_) freed.insert(freed.end(), kv.second.begin(), kv.second.end());
      free_.clear();
      cached_ = 0;
    }
    for (void* p : freed) std::free(p);
  }

 private:
  static void release(void* ctx);

  void put(Block* b) {
    bool keep = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<void*>& list = free_[b->bytes];
      if (list.size() < kPerSize && cached_ + b->bytes <= kMaxCachedBytes) {
        list.push_back(b->ptr);
        cached_ += b->bytes;
        keep = true;
      }
    }
    if (!keep) std::free(b->ptr);
    delete b;
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  int64_t reused_ = 0;
};

// Never destroyed: a tensor may outlive static destruction (a global in the user's program) and still free into it.
OutputPool& pool() {
  static OutputPool* p = [] {
    OutputPool* created = new OutputPool();
#if defined(__unix__) || defined(__APPLE__)
    // fork() copies the mutex as it is: taken by another thread at that instant, the child's first free would wait
    // for ever (DataLoader workers are forked).  Hold it across the fork, release it on both sides.
    pthread_atfork([] { pool().lock(); }, [] { pool().unlock(); }, [] { pool().unlock(); });
#endif
    return created;
  }();
  return *p;
}

void OutputPool::release(void* ctx) { pool().put(static_cast<Block*>(ctx)); }

bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("VITFAST_OUTPUT_POOL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype) {
  if (!enabled()) return at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kCPU));
  return at::Tensor(at::detail::empty_generic(sizes, &pool(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                              at::MemoryFormat::Contiguous));
}

OutputPoolStats output_pool_stats() {
  OutputPoolStats s = pool().stats();
  s.enabled = enabled();
  return s;
}

void output_pool_clear() { pool().clear(); }

}  // namespace ops
}  // namespace vitfast

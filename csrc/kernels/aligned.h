// 64-byte aligned, zero-initialised storage for packed operands and scratch (a cache line: panels start on a line,
// aligned vector loads are legal), one class for every element type the kernels pack (float, bf16 bits, int8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace vitfast {

// `bytes` rounded up to 64, zeroed, 64-byte aligned; from kHugeArenaMinBytes up carved from the huge-page arena
// (kernels/huge_arena.h says why), smaller ones from aligned_alloc.  Throws std::bad_alloc.
void* aligned_zeroed_alloc(size_t bytes);
// Frees what aligned_zeroed_alloc(bytes) returned (the same `bytes`: it says where the block came from).
void aligned_free(void* p, size_t bytes);

template <class T>
class AlignedArray {
 public:
  AlignedArray() = default;
  explicit AlignedArray(int64_t n) : size_(n > 0 ? n : 0) {
    if (size_ > 0)
      data_ = std::unique_ptr<T, Free>(static_cast<T*>(aligned_zeroed_alloc(bytes())), Free{bytes()});
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  int64_t size() const { return size_; }

 private:
  size_t bytes() const { return size_t(size_) * sizeof(T); }
  struct Free {
    size_t bytes = 0;
    void operator()(T* p) const { aligned_free(p, bytes); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t size_ = 0;
};

}  // namespace vitfast

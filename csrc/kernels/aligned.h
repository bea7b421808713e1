// 64-byte aligned, zero-initialised storage for packed operands and scratch (a cache line: panels start on a line,
// aligned vector loads are legal), one class for every element type the kernels pack (float, bf16 bits, int8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace vitfast {

// `bytes` rounded up to 64, zeroed, 64-byte aligned; from 2 MiB up on a 2 MiB boundary with transparent huge pages
// asked for over its whole 2 MiB blocks (aligned.cpp says why).  Throws std::bad_alloc.  Free with std::free.
void* aligned_zeroed_alloc(size_t bytes);

template <class T>
class AlignedArray {
 public:
  AlignedArray() = default;
  explicit AlignedArray(int64_t n) : size_(n > 0 ? n : 0) {
    if (size_ > 0) data_.reset(static_cast<T*>(aligned_zeroed_alloc(size_t(size_) * sizeof(T))));
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t size_ = 0;
};

}  // namespace vitfast

// Process-wide cache of packed weights, shared by the CPU ops.
//
// Why: packing (transpose into 16-column panels) and the NaN/Inf scan of the weights cost about as much
// memory traffic as one batch-1 forward; they must run once per weight, not once per call.
//
// Key: for each weight tensor of the op (absent optionals included), its StorageImpl, data pointer, sizes,
// strides, dtype and autograd version counter value (`tensor._version`).  An in-place update of a weight
// (`w.add_(..)`, `w.copy_(..)`, optimizer steps, load_state_dict) bumps the version, so the next call
// misses and repacks: the cache never serves stale weights.  Each entry holds a *weak* reference to the
// storages, so (a) it does not keep a freed model's weights alive and (b) a new storage allocated at a freed
// one's address cannot match (a weak reference to a freed storage is expired, and the weak reference keeps
// the old StorageImpl object itself allocated, so its address cannot even be reused).
//
// torch's fused optimizers (`fused=True`) and optimizers that update through `p.data` do not bump the version;
// vitfast/_optimizer_versions.py registers an optimizer step post-hook that does, for every stepped parameter.
// Not detected (documented limits, same as any version-based cache in PyTorch): other writes through `.data`
// (`w.data.copy_(..)` uses a separate version counter), numpy views or raw pointers, and swapping `.data` with
// another tensor and back around an update of that other tensor (some EMA code: storage, pointer and version all
// match again);
// `vitfast.ops.clear_weight_cache()` drops every entry after such a write.  Inference tensors (created under
// torch.inference_mode) have no version counter, so they are never cached: they are packed and checked
// on every call (correct, slower; a one-time warning says so).
//
// Entries that can never hit again (storage freed, or weight modified since) are dropped at the next miss;
// at most kCapacity entries are kept (least recently used evicted).
//
// Threads.  Lookups, packs, inserts, evictions and clears may run from any number of threads at once (one mutex
// around the index; packing runs outside it).  A weight written in place while another thread runs an op on it: a
// call that overlaps the write may compute with the old, the new or a mix of the values (as any op reading a
// tensor that another thread writes), and its NaN/Inf scan reads each element once (op_utils.h count_nonfinite), so
// finite values being overwritten with finite values are never refused; every call that *starts after the write has
// returned* uses the new
// values, because a weight's version is read before it is packed and checked again before the pack is kept (a
// pack that raced with a write is used once and dropped).  tests/test_weight_cache.py stresses this.
//
// The index, LRU order, sweep and locking are the torch-free csrc/cache/pack_cache.h, unit-tested under ASan/UBSan
// and TSan in the CTest tree (csrc/tests/test_pack_cache.cpp); this file adds the tensor identity.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

#include "cache/pack_cache.h"

namespace vitfast {
namespace ops {

// misses: packs, including uncacheable inference-tensor calls.
using WeightCacheStats = cache::PackCacheStats;
// A packed object and the bytes it holds (for stats).
using PackedEntry = cache::PackedEntry;

// Returns the packed object for exactly these tensors (undefined = absent optional), calling `pack` (which
// validates and packs) on a miss.  `op` separates ops that share weights.  Thread-safe (see above); `pack` runs
// outside the lock.
std::shared_ptr<const void> cached_pack(const char* op, const std::vector<at::Tensor>& weights,
                                        const std::function<PackedEntry()>& pack);

template <class T>
std::shared_ptr<const T> cached_pack_as(const char* op, const std::vector<at::Tensor>& weights,
                                        const std::function<PackedEntry()>& pack) {
  return std::static_pointer_cast<const T>(cached_pack(op, weights, pack));
}

WeightCacheStats weight_cache_stats();
void weight_cache_clear();

}  // namespace ops
}  // namespace vitfast

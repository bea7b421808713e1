#include "ops/weight_cache.h"

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <list>
#include <mutex>
#include <optional>
#include <string>

namespace vitfast {
namespace ops {
namespace {

constexpr size_t kCapacity = 256;  // entries: every FFN of a few ViT-L-sized models

// Identity of one weight tensor at one version.
struct TensorRef {
  bool defined = false;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;
  const c10::StorageImpl* storage_impl = nullptr;  // compared only while `storage` is not expired
  const void* data = nullptr;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  c10::VariableVersion counter;  // shared with the tensor: lets a stale entry be detected without it
  uint32_t version = 0;

  static TensorRef of(const at::Tensor& t) {
    TensorRef r;
    r.defined = t.defined();
    if (!r.defined) return r;
    // (reclaim_copy + weak: works on every torch >= 2.4; Storage::getWeakStorageImpl is newer.)
    r.storage.emplace(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(t.storage().unsafeGetStorageImpl()));
    r.storage_impl = t.storage().unsafeGetStorageImpl();
    r.data = t.data_ptr();
    r.sizes = t.sizes().vec();
    r.strides = t.strides().vec();
    r.dtype = t.scalar_type();
    r.counter = t.unsafeGetTensorImpl()->version_counter();
    r.version = r.counter.current_version();
    return r;
  }

  bool matches(const at::Tensor& t) const {
    if (defined != t.defined()) return false;
    if (!defined) return true;
    // Expired = the storage was freed: a live storage at the same address is a different tensor.
    if (storage->expired() || storage_impl != t.storage().unsafeGetStorageImpl()) return false;
    return data == t.data_ptr() && dtype == t.scalar_type() && t.sizes().equals(sizes) &&
           t.strides().equals(strides) && t._version() == version;
  }

  // True once no tensor can match again: freed, or modified in place since it was packed.
  bool stale() const { return defined && (storage->expired() || counter.current_version() != version); }
};

struct Entry {
  std::string op;
  std::vector<TensorRef> refs;
  PackedEntry value;
};

struct Cache {
  std::mutex mutex;
  std::list<Entry> lru;  // most recently used first
  WeightCacheStats stats;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: ops may run during interpreter shutdown
  return *c;
}

bool cacheable(const std::vector<at::Tensor>& weights) {
  for (const at::Tensor& t : weights)
    if (t.defined() && (t.is_inference() || !t.has_storage())) return false;
  return true;
}

}  // namespace

std::shared_ptr<const void> cached_pack(const char* op, const std::vector<at::Tensor>& weights,
                                        const std::function<PackedEntry()>& pack) {
  Cache& c = cache();
  if (!cacheable(weights)) {
    TORCH_WARN_ONCE(
        "vitfast.", op, ": a weight is an inference tensor (created under torch.inference_mode), which has no "
        "version counter, so its packed form cannot be cached safely; it is re-packed on every call. Create "
        "or load the weights outside torch.inference_mode for full speed.");
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      ++c.stats.misses;
    }
    return pack().packed;
  }
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto it = c.lru.begin(); it != c.lru.end(); ++it) {
      if (it->op != op || it->refs.size() != weights.size()) continue;
      bool all = true;
      for (size_t i = 0; all && i < weights.size(); ++i) all = it->refs[i].matches(weights[i]);
      if (!all) continue;
      c.lru.splice(c.lru.begin(), c.lru, it);
      ++c.stats.hits;
      return c.lru.front().value.packed;
    }
  }
  // Miss: validate and pack outside the lock (it may take milliseconds and may throw).
  PackedEntry value = pack();
  Entry entry;
  entry.op = op;
  for (const at::Tensor& t : weights) entry.refs.push_back(TensorRef::of(t));
  entry.value = value;

  std::lock_guard<std::mutex> lock(c.mutex);
  ++c.stats.misses;
  for (auto it = c.lru.begin(); it != c.lru.end();) {
    bool stale = false;
    for (const TensorRef& r : it->refs) stale = stale || r.stale();
    if (stale) {
      c.stats.bytes -= int64_t(it->value.bytes);
      it = c.lru.erase(it);
    } else {
      ++it;
    }
  }
  c.lru.push_front(std::move(entry));
  c.stats.bytes += int64_t(value.bytes);
  while (c.lru.size() > kCapacity) {
    c.stats.bytes -= int64_t(c.lru.back().value.bytes);
    c.lru.pop_back();
  }
  c.stats.entries = int64_t(c.lru.size());
  return value.packed;
}

WeightCacheStats weight_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  WeightCacheStats s = c.stats;
  s.entries = int64_t(c.lru.size());
  return s;
}

void weight_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.lru.clear();
  c.stats = WeightCacheStats();
}

}  // namespace ops
}  // namespace vitfast

#include "ops/weight_cache.h"

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <memory>
#include <unordered_map>

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

// Op names, interned: one immortal string per name (a handful of ops), so an index key can point at its op's name
// without depending on any entry's lifetime.  Called with the cache mutex held.
const std::string* intern_op(const char* op) {
  static std::vector<std::unique_ptr<const std::string>>* names = new std::vector<std::unique_ptr<const std::string>>();
  for (const auto& name : *names)
    if (*name == op) return name.get();
  names->push_back(std::make_unique<const std::string>(op));
  return names->back().get();
}

struct Entry {
  const std::string* op;  // interned
  std::vector<TensorRef> refs;
  PackedEntry value;
};

// Index key: the op and the first weight's data pointer.  Why an index at all: a forward pass asks for its
// weights in the same order every time, so with most-recently-used-first order the entry it needs is always
// near the *end* of the list, and in a full model (DeiT-B: ~50 entries) walking the list meant ~50 nodes that
// the 7 MiB of weights streamed since their last visit had evicted from cache — measured at 0.3% of a DeiT-B
// forward in `cached_pack` alone.  Several entries may share a key (stale versions of one weight until the
// next miss drops them; ops called with the same first weight), so each key holds a short bucket.
//
// The key owns nothing that an entry owns: the op is an interned name (immortal), the data pointer only a number.
// (It once pointed into the first entry's own string: erasing that entry while others stayed in its bucket left
// the map's key dangling, a use-after-free at the next lookup.)
struct Key {
  const std::string* op;  // interned: equal names are the same pointer
  const void* data;
  bool operator==(const Key& o) const { return data == o.data && op == o.op; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.op) ^ (std::hash<const void*>()(k.data) * 0x9E3779B97F4A7C15ull);
  }
};
struct Cache {
  std::mutex mutex;
  std::list<Entry> lru;  // most recently used first
  std::unordered_map<Key, std::vector<std::list<Entry>::iterator>, KeyHash> index;
  WeightCacheStats stats;
};

Key key_of(const Entry& e) { return Key{e.op, e.refs.empty() ? nullptr : e.refs[0].data}; }

Key key_of(const std::string* op, const std::vector<at::Tensor>& weights) {
  const void* data = weights.empty() || !weights[0].defined() ? nullptr : weights[0].data_ptr();
  return Key{op, data};
}

void index_add(Cache& c, std::list<Entry>::iterator it) { c.index[key_of(*it)].push_back(it); }

void index_remove(Cache& c, std::list<Entry>::iterator it) {
  auto found = c.index.find(key_of(*it));
  if (found == c.index.end()) return;
  auto& bucket = found->second;
  for (size_t i = 0; i < bucket.size(); ++i) {
    if (bucket[i] == it) {
      bucket.erase(bucket.begin() + int64_t(i));
      break;
    }
  }
  if (bucket.empty()) c.index.erase(found);
}

std::list<Entry>::iterator erase_entry(Cache& c, std::list<Entry>::iterator it) {
  c.stats.bytes -= int64_t(it->value.bytes);
  index_remove(c, it);
  return c.lru.erase(it);
}

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
  const std::string* name;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    name = intern_op(op);
    auto found = c.index.find(key_of(name, weights));
    if (found != c.index.end()) {
      for (auto it : found->second) {
        if (it->refs.size() != weights.size()) continue;
        bool all = true;
        for (size_t i = 0; all && i < weights.size(); ++i) all = it->refs[i].matches(weights[i]);
        if (!all) continue;
        c.lru.splice(c.lru.begin(), c.lru, it);  // iterators stay valid: the index needs no update
        ++c.stats.hits;
        return c.lru.front().value.packed;
      }
    }
  }
  // Miss: validate and pack outside the lock (it may take milliseconds and may throw).  The weights' identities and
  // versions are taken *before* packing: an in-place update racing with `pack` then leaves an entry whose version
  // is already behind the tensor's (never served again), and one that finished before `pack` read the data is in
  // it.  (Taken after packing, a write between the two made old data look current: served until a clear.)
  Entry entry;
  entry.op = name;
  for (const at::Tensor& t : weights) entry.refs.push_back(TensorRef::of(t));
  PackedEntry value = pack();
  entry.value = value;

  std::lock_guard<std::mutex> lock(c.mutex);
  ++c.stats.misses;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i].defined() && weights[i]._version() != entry.refs[i].version) {
      return value.packed;  // written while packing: this call gets what it packed, nothing is kept
    }
  }
  for (auto it = c.lru.begin(); it != c.lru.end();) {
    bool stale = false;
    for (const TensorRef& r : it->refs) stale = stale || r.stale();
    it = stale ? erase_entry(c, it) : std::next(it);
  }
  c.lru.push_front(std::move(entry));
  index_add(c, c.lru.begin());
  c.stats.bytes += int64_t(value.bytes);
  while (c.lru.size() > kCapacity) erase_entry(c, std::prev(c.lru.end()));
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
  c.index.clear();
  c.stats = WeightCacheStats();
}

}  // namespace ops
}  // namespace vitfast

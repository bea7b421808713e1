#include "ops/weight_cache.h"

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>

#include "cache/pack_cache.h"

namespace vitfast {
namespace ops {
namespace {

constexpr size_t kCapacity = 256;  // entries: every FFN of a few ViT-L-sized models

// Identity of one weight tensor at one version (the `Ref` of cache::PackCache).
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

  static const void* key_of(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
  const void* key() const { return data; }

  bool matches(const at::Tensor& t) const {
    if (defined != t.defined()) return false;
    if (!defined) return true;
    // Expired = the storage was freed: a live storage at the same address is a different tensor.
    if (storage->expired() || storage_impl != t.storage().unsafeGetStorageImpl()) return false;
    return data == t.data_ptr() && dtype == t.scalar_type() && t.sizes().equals(sizes) &&
           t.strides().equals(strides) && t._version() == version;
  }

  // True once no tensor can match again: freed, or modified in place since it was taken.
  bool stale() const { return defined && (storage->expired() || counter.current_version() != version); }
};

using Cache = cache::PackCache<TensorRef, at::Tensor>;

Cache& the_cache() {
  static Cache* c = new Cache(kCapacity);  // never destroyed: ops may run during interpreter shutdown
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
  if (!cacheable(weights)) {
    TORCH_WARN_ONCE(
        "vitfast.", op, ": a weight is an inference tensor (created, loaded, copied or converted with .to(...) "
        "under torch.inference_mode, or made by an op inside the forward), which has no version counter, so its "
        "packed form cannot be cached safely; it is re-packed on every call. Create, load and convert the "
        "weights outside torch.inference_mode for full speed.");
    the_cache().count_miss();
    return pack().packed;
  }
  return the_cache().get_or_pack(op, weights, pack);
}

WeightCacheStats weight_cache_stats() { return the_cache().stats(); }

void weight_cache_clear() { the_cache().clear(); }

}  // namespace ops
}  // namespace vitfast

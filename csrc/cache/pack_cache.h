// The packed-weight cache's index, LRU order, staleness sweep and thread contract, without torch.
//
// csrc/ops/weight_cache.cpp instantiates it with at::Tensor and a tensor identity (storage, pointer, shape,
// version; see csrc/ops/weight_cache.h for what is and is not detected).  Why a torch-free core: this is the part
// that once had a heap use-after-free (below), and here csrc/tests/test_pack_cache.cpp runs it under ASan/UBSan and
// TSan with a stand-in tensor, in the CTest tree; linked into libtorch (uninstrumented, ~1 GB) the same test would
// cost minutes of compile time per build and leave TSan blind to every atomic inside torch.
//
// `Ref`, the identity of one argument (`Arg`, e.g. a tensor; an absent optional included) at one version, provides
//   static Ref of(const Arg&);             taken *before* packing (see get_or_pack)
//   static const void* key_of(const Arg&); the argument's data pointer (nullptr when absent): part of the index key
//   const void* key() const;               the same, of the argument it was taken from
//   bool matches(const Arg&) const;        that argument, not written since `of`
//   bool stale() const;                    no argument can match it again (freed, or written since `of`)
// `of`, `matches` and `stale` may run concurrently with writes to the argument (they read its version counter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace vitfast {
namespace cache {

struct PackCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;   // packed bytes held
  int64_t hits = 0;
  int64_t misses = 0;  // packs (including uncacheable calls, see count_miss)
};

// A packed object and the bytes it holds (for stats).
struct PackedEntry {
  std::shared_ptr<const void> packed;
  size_t bytes = 0;
};

template <class Ref, class Arg>
class PackCache {
 public:
  // At most `capacity` entries are kept (least recently used evicted).
  explicit PackCache(size_t capacity) : capacity_(capacity) {}
  PackCache(const PackCache&) = delete;
  PackCache& operator=(const PackCache&) = delete;

  // The packed object for exactly these arguments under `op` (ops that share weights pack them differently),
  // calling `pack()` (-> PackedEntry; it validates, packs and may throw) on a miss.  Any number of threads may
  // call this, count_miss, stats and clear at once: one mutex guards the index, `pack` runs outside it.
  //
  // An argument written in place while `pack` runs: the identities and versions are taken *before* packing, so a
  // write that finished before `pack` read the data is in the pack, and a racing one leaves the entry's version
  // behind the argument's (never served again).  A pack whose arguments are already stale when it is done is
  // returned to its caller once and not kept.  (Versions taken after packing made a write between the two look
  // current: old data served until a clear.)
  template <class Pack>
  std::shared_ptr<const void> get_or_pack(const char* op, const std::vector<Arg>& args, const Pack& pack) {
    const std::string* name;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      name = intern(op);
      auto found = index_.find(key_of(name, args));
      if (found != index_.end()) {
        for (auto it : found->second) {
          if (!matches(*it, args)) continue;
          lru_.splice(lru_.begin(), lru_, it);  // iterators stay valid: the index needs no update
          ++stats_.hits;
          return it->value.packed;
        }
      }
    }
    Entry entry;
    entry.op = name;
    entry.refs.reserve(args.size());
    for (const Arg& a : args) entry.refs.push_back(Ref::of(a));
    PackedEntry value = pack();
    entry.value = value;

    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.misses;
    for (const Ref& r : entry.refs)
      if (r.stale()) return value.packed;  // written (or freed) while packing: used once, not kept
    // Entries that can never hit again are dropped here, at a miss, not at every hit.
    for (auto it = lru_.begin(); it != lru_.end();) {
      bool stale = false;
      for (const Ref& r : it->refs) stale = stale || r.stale();
      it = stale ? erase(it) : std::next(it);
    }
    lru_.push_front(std::move(entry));
    index_[key_of(*lru_.begin())].push_back(lru_.begin());
    stats_.bytes += int64_t(value.bytes);
    while (lru_.size() > capacity_) erase(std::prev(lru_.end()));
    return value.packed;
  }

  // A call that packed without the cache (its arguments cannot be cached) still counts as a miss.
  void count_miss() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.misses;
  }

  PackCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    PackCacheStats s = stats_;
    s.entries = int64_t(lru_.size());
    return s;
  }

  // Drops every entry and resets the counters (interned op names stay: they are keys, not entries).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    lru_.clear();
    index_.clear();
    stats_ = PackCacheStats();
  }

 private:
  struct Entry {
    const std::string* op = nullptr;  // interned
    std::vector<Ref> refs;
    PackedEntry value;
  };
  using Iter = typename std::list<Entry>::iterator;

  // Index key: the op and the first argument's data pointer.  Why an index at all: a forward pass asks for its
  // weights in the same order every time, so with most-recently-used-first order the entry it needs is always
  // near the *end* of the list, and in a full model (DeiT-B: ~50 entries) walking the list meant ~50 nodes that
  // the 7 MiB of weights streamed since their last visit had evicted from cache — measured at 0.3% of a DeiT-B
  // forward in the lookup alone.  Several entries may share a key (stale versions of one weight until the next
  // miss drops them; ops called with the same first weight), so each key holds a short bucket.
  //
  // The key owns nothing that an entry owns: the op is an interned name (as long-lived as the cache), the data
  // pointer only a number.  (It once pointed into the first entry's own string: erasing that entry while others
  // stayed in its bucket left the map's key dangling, a use-after-free at the next lookup.)
  struct Key {
    const std::string* op;  // interned: equal names are the same pointer
    const void* data;
    bool operator==(const Key& o) const { return data == o.data && op == o.op; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.op) ^ (std::hash<const void*>()(k.data) * size_t(0x9E3779B97F4A7C15ull));
    }
  };

  // One string per op name (a handful of ops), never freed before the cache.  Called with the mutex held.
  const std::string* intern(const char* op) {
    for (const auto& name : names_)
      if (*name == op) return name.get();
    names_.push_back(std::make_unique<const std::string>(op));
    return names_.back().get();
  }

  static Key key_of(const Entry& e) { return Key{e.op, e.refs.empty() ? nullptr : e.refs[0].key()}; }
  static Key key_of(const std::string* op, const std::vector<Arg>& args) {
    return Key{op, args.empty() ? nullptr : Ref::key_of(args[0])};
  }

  static bool matches(const Entry& e, const std::vector<Arg>& args) {
    if (e.refs.size() != args.size()) return false;
    for (size_t i = 0; i < args.size(); ++i)
      if (!e.refs[i].matches(args[i])) return false;
    return true;
  }

  Iter erase(Iter it) {
    stats_.bytes -= int64_t(it->value.bytes);
    auto found = index_.find(key_of(*it));
    if (found != index_.end()) {
      auto& bucket = found->second;
      for (size_t i = 0; i < bucket.size(); ++i) {
        if (bucket[i] == it) {
          bucket.erase(bucket.begin() + std::ptrdiff_t(i));
          break;
        }
      }
      if (bucket.empty()) index_.erase(found);
    }
    return lru_.erase(it);
  }

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<const std::string>> names_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, std::vector<Iter>, KeyHash> index_;
  PackCacheStats stats_;
};

}  // namespace cache
}  // namespace vitfast

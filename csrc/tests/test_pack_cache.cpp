// The packed-weight cache's core (cache/pack_cache.h) with a stand-in tensor: the sequences that once broke it,
// eviction, the staleness sweep, clear, and threads.  Meant to run under ASan/UBSan and TSan too (the sanitizer
// builds, CMakeLists.txt): the index once kept a key pointing into an erased entry, which only a sanitizer sees.
#include "cache/pack_cache.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace {

// A stand-in tensor: its contents (one number), written in place, and an autograd-style version counter bumped
// *after* each write, as torch does.  Atomic, as writes race with packs in the stress test on purpose (the cache
// must cope with that; the contents race is the caller's, not what this test is about).  Freed by dropping the
// last shared_ptr; allocated with `new`, so a new weight may reuse a freed one's address.
struct Weight {
  explicit Weight(int64_t v) : value(v) {}
  std::atomic<int64_t> value;
  std::atomic<uint32_t> version{0};

  void write(int64_t v) {
    value.store(v);
    version.fetch_add(1);
  }
};
using WeightPtr = std::shared_ptr<Weight>;  // nullptr = an absent optional argument

WeightPtr make_weight(int64_t v) { return WeightPtr(new Weight(v)); }

struct WeightRef {
  bool defined = false;
  std::weak_ptr<Weight> storage;
  const Weight* data = nullptr;  // compared only while `storage` is not expired
  uint32_t version = 0;

  static WeightRef of(const WeightPtr& w) {
    WeightRef r;
    r.defined = w != nullptr;
    if (!r.defined) return r;
    r.storage = w;
    r.data = w.get();
    r.version = w->version.load();
    return r;
  }
  static const void* key_of(const WeightPtr& w) { return w.get(); }
  const void* key() const { return data; }

  bool matches(const WeightPtr& w) const {
    if (defined != (w != nullptr)) return false;
    if (!defined) return true;
    return !storage.expired() && data == w.get() && w->version.load() == version;
  }
  bool stale() const {
    if (!defined) return false;
    const WeightPtr w = storage.lock();
    return w == nullptr || w->version.load() != version;
  }
};

using Cache = vitfast::cache::PackCache<WeightRef, WeightPtr>;
using vitfast::cache::PackedEntry;

// What a pack of these arguments holds: the sum of their contents (absent = 0).
int64_t contents(const std::vector<WeightPtr>& args) {
  int64_t s = 0;
  for (const WeightPtr& w : args) s += w ? w->value.load() : 0;
  return s;
}

// Looks up `args`, packing their contents on a miss; `*packs` counts the packs.
int64_t lookup(Cache& c, const char* op, const std::vector<WeightPtr>& args, int* packs = nullptr) {
  auto packed = c.get_or_pack(op, args, [&]() {
    if (packs) ++*packs;
    PackedEntry e;
    e.packed = std::make_shared<const int64_t>(contents(args));
    e.bytes = sizeof(int64_t);
    return e;
  });
  return *std::static_pointer_cast<const int64_t>(packed);
}

void test_hits_and_misses() {
  Cache c(16);
  WeightPtr w = make_weight(3), b = make_weight(4);
  int packs = 0;
  VT_CHECK(lookup(c, "linear", {w, b}, &packs) == 7 && packs == 1, "first lookup packs");
  VT_CHECK(lookup(c, "linear", {w, b}, &packs) == 7 && packs == 1, "same arguments hit");
  VT_CHECK(lookup(c, "ffn", {w, b}, &packs) == 7 && packs == 2, "another op misses");
  VT_CHECK(lookup(c, "linear", {w, nullptr}, &packs) == 3 && packs == 3, "an absent optional is another entry");
  VT_CHECK(lookup(c, "linear", {w, nullptr}, &packs) == 3 && packs == 3, "and hits");
  VT_CHECK(lookup(c, "linear", {w}, &packs) == 3 && packs == 4, "fewer arguments: another entry");
  w->write(10);
  VT_CHECK(lookup(c, "linear", {w, b}, &packs) == 14 && packs == 5, "a written weight repacks");
  // The op name is copied (interned), not kept: a caller's temporary string may die after the call.
  {
    std::string op = "linear";
    VT_CHECK(lookup(c, op.c_str(), {w, b}, &packs) == 14 && packs == 5, "a temporary name finds the entry");
  }
  const auto s = c.stats();
  VT_CHECK(s.hits == 3 && s.misses == 5, "hits %lld misses %lld", (long long)s.hits, (long long)s.misses);
  // The write made every entry holding w stale; the 5th miss swept all four before keeping its own.
  VT_CHECK(s.entries == 1 && s.bytes == int64_t(sizeof(int64_t)), "entries %lld bytes %lld", (long long)s.entries,
           (long long)s.bytes);
}

// The sequence of the old use-after-free: two entries under one index key (same op, same first weight W), the first
// made stale and erased at the next miss while the second stays in the bucket.  The key once pointed into the
// erased entry's own op string; the following insert and lookups compared against freed memory (ASan:
// heap-use-after-free).  The op names are built at run time so no two entries share a literal.
void test_erased_entry_leaves_no_dangling_key() {
  Cache c(16);
  WeightPtr w = make_weight(1), b1 = make_weight(10), b2 = make_weight(20);
  int packs = 0;
  for (int step = 0; step < 50; ++step) {
    const std::string op = std::string("lin") + "ear";
    VT_CHECK(lookup(c, op.c_str(), {w, b1}, &packs) == 1 + b1->value.load(), "step %d: (W, b1)", step);
    VT_CHECK(lookup(c, op.c_str(), {w, b2}, &packs) == 1 + b2->value.load(), "step %d: (W, b2)", step);
    (step % 2 ? b2 : b1)->write(100 + step);
  }
  VT_CHECK(packs == 51, "one pack per write plus the first two: %d", packs);
  VT_CHECK(c.stats().entries == 2, "stale versions swept: %lld entries", (long long)c.stats().entries);
}

void test_eviction_at_capacity() {
  Cache c(4);
  std::vector<WeightPtr> w;
  for (int i = 0; i < 6; ++i) w.push_back(make_weight(i));
  int packs = 0;
  for (int i = 0; i < 4; ++i) lookup(c, "linear", {w[i]}, &packs);
  lookup(c, "linear", {w[0]}, &packs);  // w0 most recently used: w1 is now the oldest
  VT_CHECK(packs == 4, "4 packs, then a hit: %d", packs);
  lookup(c, "linear", {w[4]}, &packs);  // evicts w1
  VT_CHECK(c.stats().entries == 4, "capacity 4: %lld entries", (long long)c.stats().entries);
  packs = 0;
  for (int i : {0, 2, 3, 4}) lookup(c, "linear", {w[i]}, &packs);
  VT_CHECK(packs == 0, "the 4 most recently used stayed (%d packs)", packs);
  lookup(c, "linear", {w[1]}, &packs);  // evicted: packs again (and evicts w0, now the oldest)
  VT_CHECK(packs == 1, "the least recently used was evicted (%d packs)", packs);
  VT_CHECK(c.stats().bytes == 4 * int64_t(sizeof(int64_t)), "bytes follow evictions: %lld", (long long)c.stats().bytes);
}

void test_stale_entries_are_swept_at_the_next_miss() {
  Cache c(16);
  WeightPtr a = make_weight(1), b = make_weight(2), d = make_weight(3);
  lookup(c, "linear", {a});
  lookup(c, "linear", {b});
  lookup(c, "linear", {d});
  a.reset();     // freed: its entry can never hit again
  b->write(5);   // written: likewise
  VT_CHECK(c.stats().entries == 3, "nothing is swept before a miss");
  WeightPtr e = make_weight(4);  // may reuse a's address: must not hit a's entry
  int packs = 0;
  VT_CHECK(lookup(c, "linear", {e}, &packs) == 4 && packs == 1, "a new weight (maybe at a freed address) misses");
  VT_CHECK(c.stats().entries == 2, "freed and written entries swept: %lld left", (long long)c.stats().entries);
  VT_CHECK(lookup(c, "linear", {d}, &packs) == 3 && packs == 1, "the live entry stayed");
}

void test_pack_written_while_packing_is_not_kept() {
  Cache c(16);
  WeightPtr w = make_weight(1);
  auto packed = c.get_or_pack("linear", {w}, [&]() {
    PackedEntry e;
    e.packed = std::make_shared<const int64_t>(w->value.load());
    w->write(2);  // a write that lands while packing
    return e;
  });
  VT_CHECK(*std::static_pointer_cast<const int64_t>(packed) == 1, "the caller gets what it packed");
  VT_CHECK(c.stats().entries == 0, "a pack that raced with a write is not kept");
  int packs = 0;
  VT_CHECK(lookup(c, "linear", {w}, &packs) == 2 && packs == 1, "the next call packs the new contents");
}

void test_a_throwing_pack_keeps_nothing() {
  Cache c(16);
  WeightPtr w = make_weight(1);
  bool thrown = false;
  try {
    c.get_or_pack("linear", {w}, []() -> PackedEntry { throw std::invalid_argument("expected finite values"); });
  } catch (const std::invalid_argument&) {
    thrown = true;
  }
  VT_CHECK(thrown, "the pack's exception reaches the caller");
  VT_CHECK(c.stats().entries == 0 && c.stats().misses == 0, "nothing kept or counted");
  int packs = 0;
  VT_CHECK(lookup(c, "linear", {w}, &packs) == 1 && packs == 1, "the next call packs");
}

void test_clear() {
  Cache c(16);
  WeightPtr w = make_weight(1), b = make_weight(2);
  lookup(c, "linear", {w, b});
  lookup(c, "linear", {w});
  c.count_miss();
  c.clear();
  const auto s = c.stats();
  VT_CHECK(s.entries == 0 && s.bytes == 0 && s.hits == 0 && s.misses == 0, "clear resets entries and counters");
  int packs = 0;
  VT_CHECK(lookup(c, "linear", {w, b}, &packs) == 3 && packs == 1, "a cleared entry packs again");
  VT_CHECK(lookup(c, "linear", {w, b}, &packs) == 3 && packs == 1, "and is kept again");
}

// Threads look up entries that share index keys (same first weight, several ops) in a small cache (evictions) while
// a writer updates weights in place, one thread frees and allocates weights and another clears.  Then, with every
// writer stopped, each lookup must return the current contents: no pack that raced with a write was kept as current.
// The sanitizers check the locking (TSan) and the index under concurrent erase/insert (ASan).
void test_threads() {
  Cache c(6);
  const int kWeights = 4;
  std::vector<WeightPtr> w, b;
  for (int i = 0; i < kWeights; ++i) {
    w.push_back(make_weight(i));
    b.push_back(make_weight(100 * i));
  }
  const char* ops[] = {"linear", "channel_idle_ffn", "xwx_attention"};
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::atomic<int64_t> reads{0};

  auto reader = [&](int seed) {
    for (unsigned i = unsigned(seed); !stop.load(); ++i) {
      const int k = int(i % kWeights);
      // The shared_ptrs themselves are never reassigned while threads run: only the weights' contents change.
      const std::vector<WeightPtr> args = i % 3 == 0 ? std::vector<WeightPtr>{w[k]}
                                                     : std::vector<WeightPtr>{w[k], i % 3 == 1 ? b[k] : nullptr};
      const int64_t got = lookup(c, ops[i % 3], args);
      if (got < 0) errors.fetch_add(1);  // contents only grow; a garbage pack would show here
      reads.fetch_add(1);
    }
  };
  auto writer = [&]() {
    for (int64_t i = 0; !stop.load(); ++i) {
      Weight& target = i % 2 ? *w[size_t(i / 2) % kWeights] : *b[size_t(i / 2) % kWeights];
      target.write(target.value.load() + 1);
      std::this_thread::yield();
    }
  };
  auto churn = [&]() {  // short-lived weights: entries whose storage dies while others look up
    for (int64_t i = 0; !stop.load(); ++i) {
      WeightPtr t = make_weight(i);
      if (lookup(c, "linear", {t, w[0]}) < i) errors.fetch_add(1);
      if (i % 16 == 0) c.clear();
      std::this_thread::yield();
    }
  };

  std::vector<std::thread> threads;
  for (int s = 0; s < 3; ++s) threads.emplace_back(reader, s);
  threads.emplace_back(writer);
  threads.emplace_back(churn);
  const auto start = std::chrono::steady_clock::now();
  // Long enough for many interleavings (half a second and 20000 lookups), bounded (TSan runs ~10x slower).
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed > std::chrono::seconds(3) || (elapsed > std::chrono::milliseconds(500) && reads.load() >= 20000)) break;
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();

  VT_CHECK(errors.load() == 0, "%d impossible pack values during the run", errors.load());
  VT_CHECK(reads.load() > 0, "the readers ran");
  for (int k = 0; k < kWeights; ++k) {
    for (int round = 0; round < 2; ++round) {  // the second round hits what the first packed
      VT_CHECK(lookup(c, "linear", {w[k], b[k]}) == w[k]->value.load() + b[k]->value.load(), "(w%d, b%d) stale", k, k);
      VT_CHECK(lookup(c, "channel_idle_ffn", {w[k], nullptr}) == w[k]->value.load(), "(w%d, -) stale", k);
      VT_CHECK(lookup(c, "xwx_attention", {w[k]}) == w[k]->value.load(), "(w%d) stale", k);
    }
  }
  VT_CHECK(c.stats().entries <= 6, "capacity held under threads: %lld", (long long)c.stats().entries);
  std::printf("pack_cache threads: %lld lookups\n", (long long)reads.load());
}

}  // namespace

int main() {
  test_hits_and_misses();
  test_erased_entry_leaves_no_dangling_key();
  test_eviction_at_capacity();
  test_stale_entries_are_swept_at_the_next_miss();
  test_pack_written_while_packing_is_not_kept();
  test_a_throwing_pack_keeps_nothing();
  test_clear();
  test_threads();
  return vitfast_test::finish("pack_cache");
}

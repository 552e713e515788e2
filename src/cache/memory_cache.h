// In-memory LRU from graph hash to executable. Thread-safe. Two caps, both enforced by evicting
// the least recently used entries (counted as MemoryCacheEvictions): a number of entries
// (0 disables the cache: lookups miss, inserts are dropped) and a number of bytes, an entry
// weighing what its executable holds (Executable::held_bytes; 0: no byte cap). The most
// recently used entry is kept even when it alone is over the byte cap, so a graph larger than
// the cap still runs from the cache instead of compiling at every sync.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "lazyrt/types.h"
#include "runtime/executable.h"

namespace lazyrt::cache {

class MemoryCache {
 public:
  explicit MemoryCache(size_t capacity, uint64_t max_bytes = 0) : capacity_(capacity), max_bytes_(max_bytes) {}

  std::shared_ptr<runtime::Executable> get(const GraphHash& h);
  void put(const GraphHash& h, std::shared_ptr<runtime::Executable> e);
  void set_capacity(size_t capacity);
  size_t capacity() const;
  void set_max_bytes(uint64_t bytes);
  uint64_t max_bytes() const;
  size_t size() const;
  /// What the entries held now weigh together.
  uint64_t bytes() const;
  void clear();

 private:
  struct KeyHash {
    size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
  };
  struct Entry {
    GraphHash key;
    std::shared_ptr<runtime::Executable> exe;
    uint64_t bytes = 0;
  };
  void evict_locked();

  mutable std::mutex mu_;
  size_t capacity_;
  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<GraphHash, std::list<Entry>::iterator, KeyHash> index_;
};

/// The process-wide cache used by sync.
MemoryCache& memory_cache();

}  // namespace lazyrt::cache

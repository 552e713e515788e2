// In-memory LRU from graph hash to executable. Thread-safe; capacity 0 disables it (lookups
// miss, inserts are dropped).
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "lazyrt/types.h"
#include "runtime/executable.h"

namespace lazyrt::cache {

class MemoryCache {
 public:
  explicit MemoryCache(size_t capacity) : capacity_(capacity) {}

  std::shared_ptr<runtime::Executable> get(const GraphHash& h);
  void put(const GraphHash& h, std::shared_ptr<runtime::Executable> e);
  void set_capacity(size_t capacity);
  size_t capacity() const;
  size_t size() const;
  void clear();

 private:
  struct KeyHash {
    size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
  };
  using Entry = std::pair<GraphHash, std::shared_ptr<runtime::Executable>>;
  void evict_locked();

  mutable std::mutex mu_;
  size_t capacity_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<GraphHash, std::list<Entry>::iterator, KeyHash> index_;
};

/// The process-wide cache used by sync.
MemoryCache& memory_cache();

}  // namespace lazyrt::cache

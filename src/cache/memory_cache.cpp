#include "cache/memory_cache.h"

#include "lazyrt/cache.h"
#include "util/metrics_cells.h"

namespace lazyrt::cache {

namespace {
uint64_t weight(const std::shared_ptr<runtime::Executable>& e) { return e ? e->held_bytes() : 0; }
}  // namespace

std::shared_ptr<runtime::Executable> MemoryCache::get(const GraphHash& h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(h);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->exe;
}

void MemoryCache::put(const GraphHash& h, std::shared_ptr<runtime::Executable> e) {
  const uint64_t bytes = weight(e);
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ == 0) return;
  auto it = index_.find(h);
  if (it != index_.end()) {
    bytes_ = bytes_ - it->second->bytes + bytes;
    it->second->exe = std::move(e);
    it->second->bytes = bytes;
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    lru_.push_front({h, std::move(e), bytes});
    index_[h] = lru_.begin();
    bytes_ += bytes;
  }
  evict_locked();
}

void MemoryCache::evict_locked() {
  static auto& evictions = metrics::detail::counter_cell("MemoryCacheEvictions");
  while (lru_.size() > capacity_ || (max_bytes_ > 0 && bytes_ > max_bytes_ && lru_.size() > 1)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
    evictions.add(1);
  }
}

void MemoryCache::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity;
  evict_locked();
}

size_t MemoryCache::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void MemoryCache::set_max_bytes(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  max_bytes_ = bytes;
  evict_locked();
}

uint64_t MemoryCache::max_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_bytes_;
}

size_t MemoryCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

uint64_t MemoryCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void MemoryCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

MemoryCache& memory_cache() {
  static MemoryCache* c = new MemoryCache(1024, kDefaultMemoryMaxBytes);
  return *c;
}

void set_memory_capacity(size_t entries) { memory_cache().set_capacity(entries); }
size_t memory_capacity() { return memory_cache().capacity(); }
void set_memory_max_bytes(uint64_t bytes) { memory_cache().set_max_bytes(bytes); }
uint64_t memory_max_bytes() { return memory_cache().max_bytes(); }
size_t memory_size() { return memory_cache().size(); }
uint64_t memory_bytes() { return memory_cache().bytes(); }
void clear_memory() { memory_cache().clear(); }

}  // namespace lazyrt::cache

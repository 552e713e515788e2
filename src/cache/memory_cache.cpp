#include "cache/memory_cache.h"

#include "lazyrt/cache.h"

namespace lazyrt::cache {

std::shared_ptr<runtime::Executable> MemoryCache::get(const GraphHash& h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(h);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void MemoryCache::put(const GraphHash& h, std::shared_ptr<runtime::Executable> e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ == 0) return;
  auto it = index_.find(h);
  if (it != index_.end()) {
    it->second->second = std::move(e);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(h, std::move(e));
  index_[h] = lru_.begin();
  evict_locked();
}

void MemoryCache::evict_locked() {
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
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

size_t MemoryCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

void MemoryCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
}

MemoryCache& memory_cache() {
  static MemoryCache* c = new MemoryCache(1024);
  return *c;
}

void set_memory_capacity(size_t entries) { memory_cache().set_capacity(entries); }
size_t memory_capacity() { return memory_cache().capacity(); }
size_t memory_size() { return memory_cache().size(); }
void clear_memory() { memory_cache().clear(); }

}  // namespace lazyrt::cache

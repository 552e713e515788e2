// A map from pointers to small values, in one flat table (open addressing, linear probing):
// no allocation per entry, and clear() keeps the table for the next use. For the hot paths
// that key by node or buffer address (graph extraction at every sync).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace lazyrt::util {

template <class V>
class PtrMap {
 public:
  /// The value of `key`, inserting `fresh` first when absent; second: whether it was inserted.
  std::pair<V*, bool> emplace(const void* key, V fresh) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = slot_of(key);
    while (slots_[i].key) {
      if (slots_[i].key == key) return {&slots_[i].value, false};
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {key, std::move(fresh)};
    ++size_;
    return {&slots_[i].value, true};
  }
  /// The value of `key`, or null.
  V* find(const void* key) {
    if (slots_.empty()) return nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (!slots_[i].key) return nullptr;
    }
  }
  bool contains(const void* key) { return find(key) != nullptr; }
  /// Room for n entries without growing.
  void reserve(size_t n) {
    size_t want = 64;
    while (want < 2 * n) want *= 2;
    if (want > slots_.size()) {
      std::vector<Slot> old = std::move(slots_);
      slots_.assign(want, Slot{});
      size_ = 0;
      for (Slot& s : old)
        if (s.key) emplace(s.key, std::move(s.value));
    }
  }
  size_t size() const { return size_; }
  void clear() {
    for (Slot& s : slots_) s.key = nullptr;
    size_ = 0;
  }

 private:
  struct Slot {
    const void* key = nullptr;
    V value{};
  };
  size_t slot_of(const void* key) const {
    auto h = reinterpret_cast<uintptr_t>(key);
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> 20) & (slots_.size() - 1);
  }
  void grow() { reserve(slots_.empty() ? 32 : slots_.size()); }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace lazyrt::util

// Configuration of the compile caches. Thread-safe.
#pragma once

#include <cstddef>

namespace lazyrt::cache {

/// Capacity of the in-memory LRU from graph hash to executable (default 1024 entries).
/// 0 disables it: every sync compiles. Shrinking evicts the least recently used entries.
void set_memory_capacity(size_t entries);
size_t memory_capacity();
/// Entries currently held in memory.
size_t memory_size();
/// Drops every in-memory entry.
void clear_memory();

}  // namespace lazyrt::cache

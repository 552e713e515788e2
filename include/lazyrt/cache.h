// Configuration of the compile caches. Thread-safe.
//
// Two caches sit in front of compilation. The in-memory LRU maps a graph's cache key to its
// executable within one process. The persistent cache (off unless configured) keeps one file
// per cache key in a directory, so that another process, later or at the same time, skips
// compiling a graph this one compiled. It is safe to share between processes and hosts:
// entries are written atomically and checked fully before use; a file that fails any check
// is counted (PersistentCacheDeserializeFailure), ignored, and replaced unless read-only.
// Each lookup on disk counts exactly one of PersistentCacheHit, PersistentCacheMiss and
// PersistentCacheDeserializeFailure; a hit is not an UncachedCompile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lazyrt::cache {

/// Capacity of the in-memory LRU from graph hash to executable (default 1024 entries).
/// 0 disables it: every sync compiles. Shrinking evicts the least recently used entries.
/// Every entry the caps evict counts as MemoryCacheEvictions.
void set_memory_capacity(size_t entries);
size_t memory_capacity();
/// The default byte cap of the in-memory cache: 8 GiB.
inline constexpr uint64_t kDefaultMemoryMaxBytes = uint64_t{8} << 30;
/// Caps the bytes the in-memory entries hold together (an executable's arena, constants and
/// constant outputs); 0 means no byte cap. Beyond it the least recently used entries are
/// evicted, except the most recently used one, which stays even when it alone is larger.
void set_memory_max_bytes(uint64_t bytes);
uint64_t memory_max_bytes();
/// Entries currently held in memory, and the bytes they hold.
size_t memory_size();
uint64_t memory_bytes();
/// Drops every in-memory entry.
void clear_memory();

/// Uses `dir` (created if missing, unless read-only) as the persistent compile cache; an
/// empty dir turns the persistent cache off. Read-only: entries are used but nothing in the
/// directory is ever written, touched or deleted. Overrides the environment:
///   LAZYRT_CACHE_DIR        the directory (off when unset or empty)
///   LAZYRT_CACHE_READONLY   1/true/yes/on for read-only
///   LAZYRT_CACHE_MAX_BYTES  the size cap, in bytes, or with a K, M, G or T suffix
/// which are read once, at the first sync or the first call of these functions.
void set_persistent_dir(const std::string& dir, bool readonly = false);
/// The directory in use; empty when the persistent cache is off.
std::string persistent_dir();
bool persistent_readonly();
/// Caps the bytes all entries take together; 0 (the default) means no cap. After a write
/// pushes the entries over the cap, the least recently used (written or hit) are deleted.
void set_persistent_max_bytes(uint64_t bytes);
uint64_t persistent_max_bytes();

}  // namespace lazyrt::cache

// Generated code in the persistent cache: a compiled module's relocatable object, stored under
// the persistent cache's directory (lazyrt/cache.h) in jit/<key>.o, so that a later process
// loads it instead of compiling. The key covers the regions and the generator's fingerprint
// (its version, LLVM's, the target triple, the CPU name and features): code made for another
// CPU or by another version is never found.
//
// Loaded code runs as it is, so it is trusted only from a directory owned by this user and not
// writable by group or others (the cache directory and its jit/ folder both), in a regular file
// owned by this user and not writable by others, opened without following links. Otherwise the
// object cache is refused as a whole, with one warning on stderr naming the directory and
// why, and counted (JitObjectCacheRefused): modules are compiled and nothing is stored.
//
// A file holds a header (magic, the object's size, a 128-bit checksum of it) and the object;
// one that fails the checks (truncated, corrupt, another format) is a miss, compiled and
// written again. Files are written to a unique name and renamed into place. Read-only caches
// are read, never written.
#pragma once

#include <llvm/Support/MemoryBuffer.h>

#include <memory>
#include <string>

namespace lazyrt::jit {

class ObjectCache {
 public:
  /// The object stored under key, or null.
  std::unique_ptr<llvm::MemoryBuffer> load(const std::string& key);
  /// Stores an object under key (nothing where the cache is off, read-only or refused).
  void store(const std::string& key, const llvm::MemoryBuffer& object);
};

}  // namespace lazyrt::jit

// Generated code in the persistent cache: a compiled module's shared object (code_server.h),
// stored under the persistent cache's directory (lazyrt/cache.h) in jit/<key>.so, so that a
// later process loads it instead of compiling, without starting the compiler process. The key
// covers the regions and the code's fingerprint (the generator's version, LLVM's, the CPU's
// vendor, model and features): code made for another CPU or by another version is never found.
//
// Loaded code runs as it is, so it is trusted only from a directory owned by this user and not
// writable by group or others (the cache directory and its jit/ folder both), in a regular file
// owned by this user and not writable by others, opened without following links. Otherwise the
// object cache is refused as a whole, with one warning on stderr naming the directory and
// why, and counted (JitObjectCacheRefused): modules are compiled and nothing is stored.
//
// A file holds a header (magic, the code's size, a 128-bit checksum of it) and the code;
// one that fails the checks (truncated, corrupt, another format) is a miss, compiled and
// written again. Files are written to a unique name and renamed into place. Read-only caches
// are read, never written.
#pragma once

#include <string>

namespace lazyrt::jit {

class ObjectCache {
 public:
  /// The code stored under key, or "".
  std::string load(const std::string& key);
  /// Stores code under key (nothing where the cache is off, read-only or refused).
  void store(const std::string& key, const std::string& code);
};

}  // namespace lazyrt::jit

// The persistent (on-disk) compile cache: one file per cache key, holding what a later process
// needs to skip compilation of that graph: the optimized graph and the donations it was
// compiled with. A hit lowers the stored graph (compile::lower) and skips the passes.
//
// Safety, because the directory may be shared by many processes and hosts and any file in it
// may be stale, truncated, corrupt or planted:
// - Entries are written to a unique temporary name in the same directory (pid and a random
//   suffix) and renamed into place, so a reader sees a whole entry or none. Concurrent
//   writers of one key both write complete entries; the last rename wins. There is no fsync:
//   a file a crash left incomplete fails the checks below like any other bad file.
// - An entry is used only after every check passes: the header's magic, entry format, IR
//   format, library version and CPU fingerprint equal this build's; the body size matches
//   the file; the body checksum matches; the body parses into a graph that passes ir::verify;
//   the key inside equals the file's key; and the graph takes exactly the traced graph's
//   parameters and returns exactly its output types. Anything else is a bad entry: counted,
//   ignored and (unless read-only) replaced by the freshly compiled one.
// - The checksum detects corruption, not malice: it is not a signature. Someone who may write
//   to the directory can plant an entry that passes every check and computes something else,
//   just as they could replace the library; share a cache directory only with people you
//   trust. The checks do ensure that even such an entry cannot make lazyrt read or write out
//   of bounds, since its graph is verified and its interface must match the traced one.
// - File names carry, besides the key, a tag of what the header must match (formats, library
//   version, CPU fingerprint), so hosts with other CPUs or library versions sharing the
//   directory keep their own entries instead of overwriting each other's on every miss.
// - The size cap evicts the least recently used entries (of any tag) by file mtime; a hit
//   touches the entry's mtime. Files vanishing under us (another process evicting) are
//   expected.
// - Read-only mode reads and never changes anything: no writes, touches, or evictions.
//
// PersistentCache objects are immutable and thread-safe; everything is plain file I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "lazyrt/types.h"

namespace lazyrt::cache {

/// What an entry holds.
struct CacheEntry {
  GraphHash key;                   // the sync's cache key (graph structure and donations)
  std::vector<int32_t> donations;  // per output, as compile() was given them
  ir::Graph graph;                 // optimized: lowering it directly needs no pass
};

/// The entry file layout. A fixed header of kHeaderBytes, then the body:
///   u32 #donations, i32 donation*, u64 graph size, serialized graph (ir/serialize.h).
/// All integers little-endian.
namespace entry_format {
inline constexpr char kMagic[8] = {'L', 'Z', 'R', 'T', 'C', 'A', 'C', 'H'};
inline constexpr uint32_t kVersion = 1;  // bumped whenever the layout changes
inline constexpr size_t kLibraryVersionBytes = 16;  // zero padded
// Byte offsets of the header fields.
inline constexpr size_t kMagicAt = 0;
inline constexpr size_t kVersionAt = 8;            // u32 kVersion
inline constexpr size_t kIrVersionAt = 12;         // u32 ir::kIrFormatVersion
inline constexpr size_t kLibraryVersionAt = 16;    // char[16]
inline constexpr size_t kCpuFingerprintAt = 32;    // u64
inline constexpr size_t kKeyAt = 40;               // u64 hi, u64 lo
inline constexpr size_t kBodySizeAt = 56;          // u64
inline constexpr size_t kChecksumAt = 64;          // u64 hi, u64 lo: ir::Hasher over the body
inline constexpr size_t kHeaderBytes = 80;
// Larger files are rejected without being read.
inline constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;
}  // namespace entry_format

/// This build's library version as written in headers, and this machine's CPU fingerprint
/// (vendor and the instruction-set extensions that generated code could depend on).
std::string_view library_version();
uint64_t cpu_fingerprint();

/// The body of an entry, and a whole entry file (header for this build plus body).
std::string encode_entry_body(const CacheEntry& entry);
std::string seal_entry(const GraphHash& key, std::string_view body);
inline std::string encode_entry(const CacheEntry& entry) {
  return seal_entry(entry.key, encode_entry_body(entry));
}
/// Checks the header against this build, the checksum, and parses the body (the graph is
/// verified). Throws lazyrt::Error saying which check failed. Total: never crashes on any
/// input.
CacheEntry decode_entry(std::string_view file);

/// Empty when `loaded` takes exactly the parameters of `traced` (count and types) and returns
/// exactly its output types; otherwise what differs.
std::string interface_mismatch(const ir::Graph& traced, const ir::Graph& loaded);

class PersistentCache {
 public:
  /// max_bytes 0: no size cap.
  PersistentCache(std::string dir, bool readonly, uint64_t max_bytes);

  enum class Status { Hit, Miss, Bad };
  struct Lookup {
    Status status = Status::Miss;
    CacheEntry entry;   // on a hit
    std::string error;  // on a bad entry: why it was refused
  };
  /// The entry for `key`, if one exists and passes every check for a graph traced as
  /// `traced` with these donations. Touches the entry's mtime on a hit (unless read-only).
  /// Never throws.
  Lookup load(const GraphHash& key, const ir::Graph& traced,
              const std::vector<int32_t>& donations) const;
  /// Writes the entry atomically (replacing whatever is at its path), then evicts down to
  /// the size cap. Does nothing in read-only mode. Never throws: returns false and says why
  /// in *error when nothing was written (and warns once per process).
  bool store(const CacheEntry& entry, std::string* error = nullptr) const;
  /// Deletes least recently used entries until all entries together take at most
  /// max_bytes, and temporary files that crashed writers left behind. Never throws.
  void evict() const;

  /// Tells the user, once per process and key, that an entry was refused and why.
  void warn_bad_entry(const GraphHash& key, const std::string& why) const;

  std::string path_of(const GraphHash& key) const;
  const std::string& dir() const { return dir_; }
  bool readonly() const { return readonly_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  bool write_entry(const CacheEntry& entry, std::string* error) const;

  std::string dir_;
  bool readonly_;
  uint64_t max_bytes_;
};

/// For the names of files being written: the process id, '.', and 16 hex digits of random
/// bits, which no other writer in any process or host picks.
std::string unique_suffix();

/// Entry file names: 32 hex digits of the key, '-', 8 hex digits of this build's tag (a hash
/// of the header fields an entry must match), and this suffix.
inline constexpr std::string_view kEntrySuffix = ".lzc";
std::string entry_file_name(const GraphHash& key);

/// The process-wide cache sync uses, or null when none is configured. Configured by
/// set_persistent_dir() or, at first use, by LAZYRT_CACHE_DIR, LAZYRT_CACHE_READONLY and
/// LAZYRT_CACHE_MAX_BYTES.
std::shared_ptr<const PersistentCache> persistent_cache();

}  // namespace lazyrt::cache

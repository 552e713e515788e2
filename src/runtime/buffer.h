// Device data: a block of host memory, 64-byte aligned when lazyrt allocates it.
//
// Invariant: once a buffer holds a tensor's value it is never written again, except by an
// executable to which the runtime donated it after proving that nothing else can observe it
// (the buffer's only owner is the graph being executed). Aliasing buffers between tensors is
// therefore always safe.
//
// A buffer may also adopt memory that lazyrt did not allocate (a NumPy array, a DLPack tensor
// from PyTorch) to share it without a copy. Adopted memory is aligned to its element type only,
// and it is never donated: lazyrt never writes into memory it does not own, so the owner may
// even have mapped it read-only. Unless the owner lends it for writing: then a replay that
// updates the tensor holding it in place (compile_step, run_cached_graph) writes the new value
// into it, as it would into a buffer of its own; syncs still never write into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace lazyrt::runtime {

class Buffer {
 public:
  /// Allocates `bytes` (64-byte aligned).
  explicit Buffer(size_t bytes);
  /// Adopts `bytes` at `data`, owned elsewhere; `release` runs once, when the buffer dies, and
  /// must let go of that memory (it may run on any thread).
  /// `writable`: lent for in-place updates by replays (see above).
  Buffer(void* data, size_t bytes, std::function<void()> release, bool writable = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  /// Memory adopted from elsewhere: read, never written (never donated).
  bool is_adopted() const { return static_cast<bool>(release_); }
  /// Whether a replay may write a new value of its tensor into it: lazyrt's own memory, or
  /// adopted memory lent for writing.
  bool replay_writable() const { return !release_ || writable_; }

 private:
  void* data_;
  size_t bytes_;
  std::function<void()> release_;  // adopted memory only
  bool writable_ = false;           // adopted memory lent for writing
};

/// Bytes held by all buffers now (adopted memory included: it holds tensor data), and the
/// most held at once since reset_peak_memory().
struct MemoryStats {
  int64_t live_bytes;
  int64_t peak_bytes;
};
MemoryStats memory_stats();
void reset_peak_memory();

/// Hands the pages the C heap holds free back to the system (glibc's malloc_trim). Tracing
/// and compiling a step free much more than a replay ever allocates (graphs, passes, the
/// lowering's scratch, a first run's copies); without this they stay resident for the
/// process's life. Costs about a millisecond per hundred MiB of heap: for once-per-trace use.
void release_free_heap();

inline std::shared_ptr<Buffer> allocate(size_t bytes) { return std::make_shared<Buffer>(bytes); }
/// A buffer over memory owned elsewhere; see Buffer's adopting constructor.
inline std::shared_ptr<Buffer> adopt(void* data, size_t bytes, std::function<void()> release,
                                     bool writable = false) {
  return std::make_shared<Buffer>(data, bytes, std::move(release), writable);
}

}  // namespace lazyrt::runtime

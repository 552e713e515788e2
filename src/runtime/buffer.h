// Device data: a 64-byte aligned block of host memory.
//
// Invariant: once a buffer holds a tensor's value it is never written again, except by an
// executable to which the runtime donated it after proving that nothing else can observe it
// (the buffer's only owner is the graph being executed). Aliasing buffers between tensors is
// therefore always safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace lazyrt::runtime {

class Buffer {
 public:
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

/// Bytes held by all buffers now, and the most held at once since reset_peak_memory().
struct MemoryStats {
  int64_t live_bytes;
  int64_t peak_bytes;
};
MemoryStats memory_stats();
void reset_peak_memory();

inline std::shared_ptr<Buffer> allocate(size_t bytes) { return std::make_shared<Buffer>(bytes); }

}  // namespace lazyrt::runtime

#include "runtime/buffer.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace lazyrt::runtime {
namespace {
std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};
}  // namespace

Buffer::Buffer(size_t bytes) : bytes_(bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  data_ = std::aligned_alloc(64, rounded);
  if (!data_) throw std::bad_alloc();
  const int64_t now = live_bytes += static_cast<int64_t>(bytes_);
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

Buffer::~Buffer() {
  std::free(data_);
  live_bytes -= static_cast<int64_t>(bytes_);
}

MemoryStats memory_stats() { return {live_bytes.load(), peak_bytes.load()}; }
void reset_peak_memory() { peak_bytes = live_bytes.load(); }

}  // namespace lazyrt::runtime

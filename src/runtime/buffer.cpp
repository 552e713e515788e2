#include "runtime/buffer.h"

#include <atomic>
#include <cstdlib>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <new>

#include "util/check.h"

namespace lazyrt::runtime {
namespace {
std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

void count_allocation(size_t bytes) {
  const int64_t now = live_bytes += static_cast<int64_t>(bytes);
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

Buffer::Buffer(size_t bytes) : bytes_(bytes) {
  // Sizes come from checked tensor sizes (at most kMaxTensorBytes each), but an arena sums
  // many: refuse before the rounding could wrap.
  if (bytes > kMaxTensorBytes)
    throw Error(detail::str_cat("out of memory: cannot allocate ", bytes, " bytes (more than 2^62)"));
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  data_ = std::aligned_alloc(64, rounded);
  if (!data_)
    throw Error(detail::str_cat("out of memory: cannot allocate ", bytes, " bytes (",
                                static_cast<double>(bytes) / (1 << 30), " GiB) of tensor memory; ",
                                memory_stats().live_bytes, " bytes are in use"));
  count_allocation(bytes_);
}

Buffer::Buffer(void* data, size_t bytes, std::function<void()> release, bool writable)
    : data_(data), bytes_(bytes), release_(std::move(release)), writable_(writable) {
  LAZYRT_ASSERT(release_, "an adopted buffer needs a release callback");
  LAZYRT_ASSERT(data_ != nullptr || bytes_ == 0, "adopting a null pointer of ", bytes_, " bytes");
  count_allocation(bytes_);
}

Buffer::~Buffer() {
  if (release_) release_();
  else std::free(data_);
  live_bytes -= static_cast<int64_t>(bytes_);
}

MemoryStats memory_stats() { return {live_bytes.load(), peak_bytes.load()}; }
void reset_peak_memory() { peak_bytes = live_bytes.load(); }

void release_free_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace lazyrt::runtime

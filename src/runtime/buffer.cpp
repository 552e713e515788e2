#include "runtime/buffer.h"

#include <cstdlib>
#include <new>

namespace lazyrt::runtime {

Buffer::Buffer(size_t bytes) : bytes_(bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  data_ = std::aligned_alloc(64, rounded);
  if (!data_) throw std::bad_alloc();
}

Buffer::~Buffer() { std::free(data_); }

}  // namespace lazyrt::runtime

#include "backend/backend.h"

#include <cstring>

#include "util/check.h"

namespace lazyrt::backend {

std::shared_ptr<runtime::Buffer> Backend::allocate(size_t bytes) const { return runtime::allocate(bytes); }

std::shared_ptr<runtime::Buffer> Backend::copy(const runtime::Buffer& b) const {
  return from_host(b.data(), b.bytes());
}

std::shared_ptr<runtime::Buffer> Backend::from_host(const void* data, size_t bytes) const {
  auto b = allocate(bytes);
  if (bytes) std::memcpy(b->data(), data, bytes);
  return b;
}

std::shared_ptr<const void> Backend::to_host(const std::shared_ptr<runtime::Buffer>& b) const {
  return std::shared_ptr<const void>(b, b->data());
}

}  // namespace lazyrt::backend

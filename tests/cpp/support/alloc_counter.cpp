#include "support/alloc_counter.h"

#include <cstdlib>
#include <new>

namespace {
thread_local bool counting = false;
thread_local int64_t allocations = 0;

void* counted_alloc(std::size_t n) {
  if (counting) ++allocations;
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

// Every form of new and delete is replaced, so that every pair goes through malloc and free:
// code that allocates with the nothrow form (LLVM does) and frees with plain delete would
// otherwise pair the runtime's new with this delete (AddressSanitizer: alloc-dealloc-mismatch).
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (counting) ++allocations;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace lazyrt::testing {
CountAllocations::CountAllocations() {
  allocations = 0;
  counting = true;
}
CountAllocations::~CountAllocations() { counting = false; }
int64_t CountAllocations::count() const { return allocations; }
}  // namespace lazyrt::testing

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

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace lazyrt::testing {
CountAllocations::CountAllocations() {
  allocations = 0;
  counting = true;
}
CountAllocations::~CountAllocations() { counting = false; }
int64_t CountAllocations::count() const { return allocations; }
}  // namespace lazyrt::testing

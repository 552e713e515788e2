// Counts heap allocations (global operator new) made by the current thread while a
// CountAllocations scope is alive.
#pragma once

#include <cstdint>

namespace lazyrt::testing {

class CountAllocations {
 public:
  CountAllocations();
  ~CountAllocations();
  int64_t count() const;
};

}  // namespace lazyrt::testing

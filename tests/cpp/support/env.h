// Test settings from the environment (the randomized tests' program counts and seeds).
#pragma once

#include <cstdint>
#include <cstdlib>

namespace lazyrt::testing {

/// The integer in environment variable `name`, or `fallback` where it is unset.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

}  // namespace lazyrt::testing

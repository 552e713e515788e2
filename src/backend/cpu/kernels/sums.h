// Sums over a contiguous run in double, for the reduction kernels: sixteen partial sums of
// interleaved elements, added in order at the end (one running sum would wait on each
// addition), in loops cloned per ISA (vmath.h). The order is fixed, so results do not depend
// on the CPU.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/vmath.h"

namespace lazyrt::kernels {
namespace sums {

constexpr int kLanes = 16;

/// The sum of x[0, n), each element read as its compute type C.
template <class C, class T>
LAZYRT_ISA_CLONES double run_sum(const T* x, int64_t n) {
  double part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) part[k] += static_cast<double>(convert<C>(x[i + k]));
  double sum = 0;
  for (int k = 0; k < kLanes; ++k) sum += part[k];
  for (; i < n; ++i) sum += static_cast<double>(convert<C>(x[i]));
  return sum;
}

/// The sum of (x[i] - mean)^2 over x[0, n).
template <class C, class T>
LAZYRT_ISA_CLONES double run_squared_deviations(const T* x, int64_t n, double mean) {
  double part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double d = static_cast<double>(convert<C>(x[i + k])) - mean;
      part[k] += d * d;
    }
  }
  double sum = 0;
  for (int k = 0; k < kLanes; ++k) sum += part[k];
  for (; i < n; ++i) {
    const double d = static_cast<double>(convert<C>(x[i])) - mean;
    sum += d * d;
  }
  return sum;
}

}  // namespace sums
}  // namespace lazyrt::kernels

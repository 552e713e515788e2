// Sums over a contiguous run in double, for the reduction kernels: sixteen partial sums of
// interleaved elements, added in order at the end (one running sum would wait on each
// addition), in loops cloned per ISA (vmath.h). The order is fixed, so results do not depend
// on the CPU.
//
// A run may be given in pieces (the fused reductions see a row a chunk at a time): Lanes
// takes pieces whose lengths are multiples of kLanes, then the last piece, and gives the sum
// run_sum would give over the whole run.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels/loops.h"
#include "scalar/vmath.h"

namespace lazyrt::kernels {

namespace vm = lazyrt::scalar::vm;
namespace sums {

constexpr int kLanes = 16;

/// part[k] += x[i + k] (or its squared deviation from `mean`) for each whole group of kLanes
/// elements of x[0, n); n is a multiple of kLanes.
template <class C, class T>
LAZYRT_ISA_CLONES void add_groups(double* part, const T* x, int64_t n) {
  for (int64_t i = 0; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) part[k] += static_cast<double>(convert<C>(x[i + k]));
}
template <class C, class T>
LAZYRT_ISA_CLONES void add_squared_groups(double* part, const T* x, int64_t n, double mean) {
  for (int64_t i = 0; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double d = static_cast<double>(convert<C>(x[i + k])) - mean;
      part[k] += d * d;
    }
  }
}

/// The running sum of one run, given in pieces.
struct Lanes {
  double part[kLanes] = {};
  bool used = false;  // some group was added (else every part is +0)

  void reset() {
    if (!used) return;
    for (double& p : part) p = 0;
    used = false;
  }
  /// A piece that is not the last: n a multiple of kLanes.
  template <class C, class T>
  void add(const T* x, int64_t n, double mean = 0, bool squares = false) {
    if (n == 0) return;
    used = true;
    if (squares) add_squared_groups<C>(part, x, n, mean);
    else add_groups<C>(part, x, n);
  }
  /// The last piece (any length); the run's sum.
  template <class C, class T>
  double finish(const T* x, int64_t n, double mean = 0, bool squares = false) {
    const int64_t whole = n / kLanes * kLanes;
    add<C>(x, whole, mean, squares);
    // Untouched parts are +0, and adding them to +0 leaves +0: a short run skips the 16
    // dependent additions.
    double sum = 0;
    if (used)
      for (int k = 0; k < kLanes; ++k) sum += part[k];
    for (int64_t i = whole; i < n; ++i) {
      const double v = static_cast<double>(convert<C>(x[i]));
      sum += squares ? (v - mean) * (v - mean) : v;
    }
    return sum;
  }
};

/// acc folded with v into a maximum (kMax) or a minimum: a nan is taken, and nothing replaces
/// one; `first`: v is the first element, taken as it is.
template <bool kMax, class Acc>
inline Acc fold_extreme(Acc acc, Acc v, bool first) {
  const bool take = (v != v) | ((acc == acc) & (kMax ? v > acc : v < acc));
  return first | take ? v : acc;
}

/// The maximum (kMax) or minimum of x[0, n), n > 0, as fold_extreme gives it folding x[0],
/// x[1], ... in order: the first nan if there is one, else the first element equal to the
/// extreme (which, of -0 and +0, is the one met first). Sixteen running extremes, then a scan
/// for the first nan or zero where there is one.
template <bool kMax, class C, class T>
LAZYRT_ISA_CLONES double run_extreme(const T* x, int64_t n) {
  auto at = [&](int64_t i) { return static_cast<double>(convert<C>(x[i])); };
  auto better = [](double v, double m) { return kMax ? v > m : v < m; };
  double m = at(0);
  // Nonzero (or nan) once a nan or an infinity was met: v - v is 0 for every other v. Plain
  // arithmetic in independent lanes; an infinity only costs the scan below.
  double odd = m - m;
  int64_t i = 1;
  if (n >= 2 * kLanes) {
    // Lanes in the compute type, which holds every element exactly (its compares agree with
    // double's), and the lane loop kept whole rather than unrolled: so it vectorizes, the
    // select as maxps/minps (v > p ? v : p is their rule).
    C part[kLanes], lane_odd[kLanes];
    for (int k = 0; k < kLanes; ++k) {
      part[k] = convert<C>(x[k]);
      lane_odd[k] = part[k] - part[k];
    }
    for (i = kLanes; i + kLanes <= n; i += kLanes)
#pragma GCC unroll 1
      for (int k = 0; k < kLanes; ++k) {
        const C v = convert<C>(x[i + k]);
        lane_odd[k] += v - v;
        part[k] = (kMax ? v > part[k] : v < part[k]) ? v : part[k];
      }
    // The lanes' extreme by halves: any order gives the same value here (ties between -0 and
    // +0 and nans are settled by the scans below), in four dependent steps instead of sixteen.
    // lane_odd holds 0 or nan only.
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int k = 0; k < w; ++k) {
        part[k] = (kMax ? part[k + w] > part[k] : part[k + w] < part[k]) ? part[k + w] : part[k];
        lane_odd[k] += lane_odd[k + w];
      }
    m = static_cast<double>(part[0]);
    odd += static_cast<double>(lane_odd[0]);
  }
  for (; i < n; ++i) {
    const double v = at(i);
    odd += v - v;
    m = better(v, m) ? v : m;
  }
  if (odd != 0)
    for (int64_t j = 0; j < n; ++j) {
      const double v = at(j);
      if (v != v) return v;
    }
  if (m == 0)
    for (int64_t j = 0; j < n; ++j) {
      const double v = at(j);
      if (v == 0) return v;
    }
  return m;
}

// A run shorter than two groups is summed in order: lane k holds at most one element, which
// it adds to 0 (exactly), finish() adds the lanes to 0 in order and then the rest of the run,
// so its sum is the elements' own, added in order to 0. The same bits without the call into
// the cloned loop or the lanes' round trip through memory. Reductions over the channels of
// small planes (a batch norm's statistics on 2x2 to 4x4 feature maps) are thousands of such
// runs.

/// The sum of x[0, n), each element read as its compute type C.
template <class C, class T>
double run_sum(const T* x, int64_t n) {
  if (n < 2 * kLanes) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(convert<C>(x[i]));
    return sum;
  }
  return Lanes{}.finish<C>(x, n);
}

/// The sum of (x[i] - mean)^2 over x[0, n).
template <class C, class T>
double run_squared_deviations(const T* x, int64_t n, double mean) {
  if (n < 2 * kLanes) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(convert<C>(x[i]));
      sum += (v - mean) * (v - mean);
    }
    return sum;
  }
  return Lanes{}.finish<C>(x, n, mean, true);
}

}  // namespace sums
}  // namespace lazyrt::kernels
